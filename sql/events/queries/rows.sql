-- Every row of one event, delivery id $1, that the caller's scope may see ($2: a tenant key's
-- tenant; NULL, an admin key, every tenant), from the delivery log and the queue: what
-- GET /v1/events/{id} and GET /v1/deliveries/{id} are made of (Get in events.go). $3 says
-- whether to return the payload, once, on the row with the smallest id: every row of an event
-- carries the same payload, and a fan-out to ten endpoints retried three times would otherwise
-- send it thirty times.
--
-- Both tables are read by delivery_id, the log on its parent, so that an index on
-- webhook_delivery_log (delivery_id) serves every partition. The queue has no index on it and
-- is read whole: its size is the backlog.
--
-- The event's dead letters in the scope (through webhook_dead_letter_delivery_idx) come on the
-- row with the smallest id, as one JSON array, oldest first: one per destination it failed
-- for, and one more each time it failed again after a replay; one statement sees one snapshot, so a settle between two reads cannot show a
-- dead letter without the attempt that made it, and a read is one round trip instead of a
-- transaction's four.
--
-- src is 'log' for a settled row (a row settled in place before schema 7 included) and
-- 'queue' for a pending one. A row parked by an ordered stream that stopped (schema 6:
-- created_at 'infinity') is pending in the queue but dead-lettered: parked says so, and
-- due_at is NULL for it ('infinity' is no time a client can read). routing says whether any
-- endpoint exists, as the claim asks it: an unrouted event row then waits to be routed
-- rather than being a delivery to WEBHOOK_URL.
SELECT src, id, attempt, endpoint_id::text, endpoint_url, routed_at, due_at, parked, processed_at, status_code, error,
       duration_ms, response_excerpt, event_type, stream_id, tenant, enqueued_at,
       CASE WHEN $3::boolean AND id = min(id) OVER () THEN payload::text END,
       EXISTS (SELECT 1 FROM webhook_endpoints),
       CASE WHEN id = min(id) OVER () THEN
           (SELECT coalesce(jsonb_agg(jsonb_build_object('id', d.id, 'outbox_id', d.outbox_id, 'endpoint_id', d.endpoint_id,
                                                         'endpoint_url', d.endpoint_url, 'reason', d.reason,
                                                         'failed_at', d.failed_at, 'replayed_at', d.replayed_at) ORDER BY d.id), '[]')
            FROM webhook_dead_letter d
            WHERE d.delivery_id = $1::uuid AND ($2::text IS NULL OR d.tenant = $2))
       END
FROM (
    SELECT 'log' AS src, l.id, l.attempt, l.endpoint_id, l.endpoint_url, l.routed_at, NULL::timestamptz AS due_at,
           false AS parked, l.processed_at, l.status_code, l.error, l.duration_ms,
           l.response_excerpt,
           l.event_type, l.stream_id, l.tenant, l.enqueued_at, l.payload
    FROM webhook_delivery_log l
    WHERE l.delivery_id = $1::uuid AND ($2::text IS NULL OR l.tenant = $2)
    UNION ALL
    SELECT CASE WHEN o.processed THEN 'log' ELSE 'queue' END, o.id, o.attempt, o.endpoint_id, o.endpoint_url,
           o.routed_at, CASE WHEN NOT o.processed AND o.created_at < 'infinity' THEN o.created_at END,
           NOT o.processed AND o.created_at = 'infinity', o.processed_at, o.status_code, o.error, o.duration_ms,
           NULL, o.event_type, o.stream_id, o.tenant, o.enqueued_at, o.payload
    FROM webhook_outbox o
    WHERE o.delivery_id = $1::uuid AND ($2::text IS NULL OR o.tenant = $2)
) r
ORDER BY processed_at NULLS LAST, id
