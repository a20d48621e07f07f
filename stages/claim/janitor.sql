-- Delete up to $2 rows settled in place before schema 7 (processed rows of webhook_outbox) more
-- than $1 milliseconds ago; the delivery log itself is pruned by dropping partitions
-- (webhook_delivery_log_maintain). Small batches keep each
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
