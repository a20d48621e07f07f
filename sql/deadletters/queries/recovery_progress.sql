-- The last statement of each batch of RunRecovery, committed with its replays: $2 dead letters
-- dealt with, $3 of them replayed, the cursor moved to the last ($4, $5).
UPDATE webhook_recoveries
SET done = done + $2::integer, replayed = replayed + $3::integer, total = greatest(total, done + $2::integer),
    cursor_failed_at = $4::timestamptz, cursor_id = $5::bigint, updated_at = now()
WHERE id = $1::uuid
