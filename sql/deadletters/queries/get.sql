-- Get: one dead letter with its payload, by row id ($1). $2, when set, is the caller's tenant:
-- another tenant's row is not found, exactly as a missing one. With the consumer's last answer
-- (schema 15), which only one dead letter shows: a list would be too long with it.
SELECT id, outbox_id, delivery_id::text, endpoint_id::text, stream_id, event_type, endpoint_url, attempts,
       last_status, last_error, reason, enqueued_at, failed_at, replayed_at, tenant, order_key, last_response_excerpt, payload::text
FROM webhook_dead_letter
WHERE id = $1::bigint AND ($2::text IS NULL OR tenant = $2::text)
