-- Delete up to $2 processed rows settled more than $1 milliseconds ago. Small batches keep each
-- transaction short (no long-held locks, no bloat spike); SKIP LOCKED lets several instances'
-- janitors run at once without waiting on each other.
-- ARRAY(...) runs once and the delete goes through the primary key: the same plan for any
-- batch size, so the generic plan of the dispatcher's sessions is a good one.
DELETE FROM webhook_outbox
WHERE id = ANY (ARRAY(
    SELECT id FROM webhook_outbox
    WHERE processed AND processed_at < now() - $1::bigint * interval '1 millisecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))
