-- Delete up to $2 processed rows settled more than $1 milliseconds ago. Small batches keep each
-- transaction short (no long-held locks, no bloat spike); SKIP LOCKED lets several instances'
-- janitors run at once without waiting on each other.
WITH old AS (
    SELECT id FROM webhook_outbox
    WHERE processed AND processed_at < now() - $1::bigint * interval '1 millisecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM webhook_outbox o USING old WHERE o.id = old.id
