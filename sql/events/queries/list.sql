-- One window of the event listing (List in events.go): the events enqueued at or after $5,
-- newest first (enqueued_at, then delivery_id, both descending), at most $9.
--   $1 the caller's scope (a tenant key's tenant; NULL: every tenant), $2 a tenant to filter
--   by (an admin's choice; NULL: any), $3 an event type and $4 a stream id (NULL: any), $5 the
--   window's start, $6 until (exclusive; NULL: none), $7 and $8 the last event of the previous
--   page (NULL: the first page).
--
-- An event is a delivery id. Each of its rows carries its type, stream, tenant and
-- enqueued_at, copied from the producer's row, so every filter here keeps all of an event's
-- rows or none, and DISTINCT ON keeps one per event, whichever rows (routing, deliveries,
-- retries, replays) it has at the moment.
--
-- The log is read by processed_at through its block-range index (and only the partitions
-- from $5 on): a row is settled after its event is enqueued, so every row of an event
-- enqueued at or after $5 has processed_at at or after $5, and the window is complete for
-- those events. The queue is read whole: its size is the backlog.
SELECT DISTINCT ON (r.enqueued_at, r.delivery_id) r.delivery_id::text AS id, r.event_type, r.stream_id, r.tenant, r.enqueued_at
FROM (
    SELECT delivery_id, event_type, stream_id, tenant, enqueued_at
    FROM webhook_delivery_log
    WHERE processed_at >= $5 AND enqueued_at >= $5
      AND ($6::timestamptz IS NULL OR enqueued_at < $6)
      AND ($7::timestamptz IS NULL OR (enqueued_at, delivery_id) < ($7, $8::uuid))
      AND ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR tenant = $2)
      AND ($3::text IS NULL OR event_type = $3) AND ($4::text IS NULL OR stream_id = $4)
    UNION ALL
    SELECT delivery_id, event_type, stream_id, tenant, enqueued_at
    FROM webhook_outbox
    WHERE enqueued_at >= $5
      AND ($6::timestamptz IS NULL OR enqueued_at < $6)
      AND ($7::timestamptz IS NULL OR (enqueued_at, delivery_id) < ($7, $8::uuid))
      AND ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR tenant = $2)
      AND ($3::text IS NULL OR event_type = $3) AND ($4::text IS NULL OR stream_id = $4)
) r
ORDER BY r.enqueued_at DESC, r.delivery_id DESC
LIMIT $9
