-- fluxhook dlq show: dead letters with their payloads, by row id ($1) or by delivery id ($2:
-- every dead letter of the event, one per endpoint it failed for and per time it failed
-- again after a replay). Oldest first, so that a delivery's rows read as its history. With the
-- consumer's last answer (schema 15), which only show prints: a list would be too long with it.
SELECT id, outbox_id, delivery_id::text, endpoint_id::text, stream_id, event_type, endpoint_url, attempts,
       last_status, last_error, reason, enqueued_at, failed_at, replayed_at, tenant, order_key, last_response_excerpt,
       payload::text
FROM webhook_dead_letter
WHERE id = $1::bigint OR delivery_id = $2::uuid
ORDER BY id
