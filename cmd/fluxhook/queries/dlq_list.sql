-- fluxhook dlq list: the most recent dead letters, filtered. A NULL filter matches every row:
-- $1 event type, $2 reason substring (case-insensitive, literal), $3 a microsecond count
-- (failed within that long of now), $4 delivery id, $5 endpoint id. LIMIT $6; NULL means no
-- limit.
SELECT id, outbox_id, delivery_id::text, endpoint_id::text, stream_id, event_type, endpoint_url, attempts,
       last_status, last_error, reason, enqueued_at, failed_at, replayed_at, tenant, order_key
FROM webhook_dead_letter
WHERE ($1::text IS NULL OR event_type = $1)
  AND ($2::text IS NULL OR strpos(lower(reason), lower($2)) > 0)
  AND ($3::bigint IS NULL OR failed_at > now() - $3 * interval '1 microsecond')
  AND ($4::uuid IS NULL OR delivery_id = $4)
  AND ($5::uuid IS NULL OR endpoint_id = $5)
ORDER BY failed_at DESC, id DESC
LIMIT $6
