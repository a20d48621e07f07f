-- The dead letters of one event, delivery id $1, in the caller's scope ($2, as in rows.sql),
-- oldest first: one per destination it failed for, and one more each time it failed again
-- after a replay. Found through webhook_dead_letter_delivery_idx.
SELECT id, outbox_id, endpoint_id::text, endpoint_url, reason, failed_at, replayed_at
FROM webhook_dead_letter
WHERE delivery_id = $1::uuid AND ($2::text IS NULL OR tenant = $2)
ORDER BY id
