-- fluxhook dlq list: the most recent dead letters, filtered. A NULL filter matches every row;
-- $3 is a microsecond count (failed within that long of now); LIMIT NULL means no limit.
SELECT id, outbox_id, delivery_id::text, stream_id, event_type, endpoint_url, attempts,
       last_status, last_error, reason, enqueued_at, failed_at, replayed_at
FROM webhook_dead_letter
WHERE ($1::text IS NULL OR event_type = $1)
  AND ($2::text IS NULL OR strpos(lower(reason), lower($2)) > 0)
  AND ($3::bigint IS NULL OR failed_at > now() - $3 * interval '1 microsecond')
ORDER BY failed_at DESC, id DESC
LIMIT $4
