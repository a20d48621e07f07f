-- fluxhook dlq replay --all-matching: lock every dead letter matching the filters (the same
-- filters as dlq list; the command requires at least one to be set).
SELECT id, delivery_id::text, event_type, replayed_at
FROM webhook_dead_letter
WHERE ($1::text IS NULL OR event_type = $1)
  AND ($2::text IS NULL OR strpos(lower(reason), lower($2)) > 0)
  AND ($3::bigint IS NULL OR failed_at > now() - $3 * interval '1 microsecond')
ORDER BY id
FOR UPDATE
