-- ByDelivery: every dead letter of one event ($1, its delivery id), with payloads: one per
-- endpoint it failed for and per time it failed again after a replay. Oldest first, so that a
-- delivery's rows read as its history. $2, when set, is the caller's tenant. The delivery_id
-- index serves it.
SELECT id, outbox_id, delivery_id::text, endpoint_id::text, stream_id, event_type, endpoint_url, attempts,
       last_status, last_error, reason, enqueued_at, failed_at, replayed_at, tenant, order_key, last_response_excerpt, payload::text
FROM webhook_dead_letter
WHERE delivery_id = $1::uuid AND ($2::text IS NULL OR tenant = $2::text)
ORDER BY id
