-- fluxhook dlq show: one dead letter with its payload.
SELECT id, outbox_id, delivery_id::text, stream_id, event_type, endpoint_url, attempts,
       last_status, last_error, reason, enqueued_at, failed_at, replayed_at, payload::text
FROM webhook_dead_letter
WHERE id = $1
