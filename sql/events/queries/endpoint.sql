-- A page of an endpoint's deliveries (EndpointDeliveries in events.go): the rows in the log and
-- the queue of endpoint $1, when it exists in the scope, whose time is in [$5, $6), newest
-- first (time, then id, both descending), below the previous page's last row, at most $9. A
-- row's time is when it was attempted (processed_at) or, pending, when it is due
-- (created_at); a row parked by an ordered stream that stopped takes its dead letter's time.
--   $1 the endpoint, $2 the caller's scope (a tenant key's tenant; NULL: every tenant), $3 a
--   status (NULL: any), $4 an event type (NULL: any), $5 since, $6 until (exclusive; NULL:
--   none), $7 and $8 the last row of the previous page (NULL: the first page).
--
-- status: delivered (a 2xx, or a 409 settled delivered, which has no error), dead_lettered (a
-- failure whose dead letter the same statement wrote: failed_at and processed_at are that
-- statement's now(); or a parked row), failed (any other failure: it was retried), pending.
--
-- The log is walked through webhook_delivery_log_endpoint_idx (endpoint_id, processed_at)
-- backwards, from the cursor (or until) down: a merge of each partition's index in
-- processed_at order, stopped by the LIMIT after a page, so a page costs about a page of rows
-- however many the endpoint has and however wide the range ("l.endpoint_id = $1" implies the
-- index's predicate). Its own ORDER BY and LIMIT keep that walk whatever the queue holds. Rows
-- of one settle statement share processed_at; the id orders them (an incremental sort of
-- those few). Every bound is written so that it stays an index condition, and prunes
-- partitions, in the generic plan it runs with (queryGeneric), where "$7 IS NULL OR ..." would
-- have read the endpoint's whole range for every page but the first. The queue has no index
-- on endpoint_id and is read whole: its size is the backlog.
--
-- The dead-letter check is a scalar subquery with LIMIT 1 rather than EXISTS: the planner
-- may run an EXISTS as one hash of the whole dead-letter table, built for the first failure
-- the walk meets, where this is one index probe (webhook_dead_letter_endpoint_idx) per failure.
SELECT id, delivery_id::text, event_type, attempt, status, at, processed_at, due_at, status_code, error, duration_ms,
       enqueued_at
FROM (
    (SELECT *
     FROM (
         SELECT l.id, l.delivery_id, l.event_type, l.attempt, l.processed_at AS at, l.processed_at,
                NULL::timestamptz AS due_at, l.status_code, l.error, l.duration_ms, l.enqueued_at,
                CASE WHEN l.status_code BETWEEN 200 AND 299 OR (l.status_code = 409 AND l.error IS NULL) THEN 'delivered'
                     WHEN (SELECT true FROM webhook_dead_letter d
                           WHERE d.endpoint_id = l.endpoint_id AND d.failed_at = l.processed_at
                             AND d.delivery_id = l.delivery_id
                           LIMIT 1) THEN 'dead_lettered'
                     ELSE 'failed' END AS status
         FROM webhook_delivery_log l
         WHERE l.endpoint_id = $1::uuid
           AND l.processed_at >= $5::timestamptz
           AND l.processed_at < coalesce($6::timestamptz, 'infinity')
           AND l.processed_at <= coalesce($7::timestamptz, 'infinity')
           AND (l.processed_at, l.id) < (coalesce($7::timestamptz, 'infinity'), coalesce($8::bigint, 9223372036854775807))
           AND ($2::text IS NULL OR l.tenant = $2) AND ($4::text IS NULL OR l.event_type = $4)
           -- Nothing in the log is pending: the walk is skipped.
           AND $3::text IS DISTINCT FROM 'pending'
     ) l
     WHERE ($3::text IS NULL OR status = $3)
     ORDER BY at DESC, id DESC
     LIMIT $9)
    UNION ALL
    (SELECT *
     FROM (
         SELECT o.id, o.delivery_id, o.event_type, o.attempt,
                CASE WHEN o.processed THEN o.processed_at
                     WHEN o.created_at = 'infinity' THEN
                         coalesce((SELECT max(d.failed_at) FROM webhook_dead_letter d
                                   WHERE d.delivery_id = o.delivery_id AND d.outbox_id = o.id), o.enqueued_at)
                     ELSE o.created_at END AS at,
                o.processed_at, CASE WHEN NOT o.processed AND o.created_at < 'infinity' THEN o.created_at END AS due_at,
                o.status_code, o.error, o.duration_ms, o.enqueued_at,
                CASE WHEN NOT o.processed AND o.created_at < 'infinity' THEN 'pending'
                     WHEN NOT o.processed THEN 'dead_lettered'
                     WHEN o.status_code BETWEEN 200 AND 299 OR (o.status_code = 409 AND o.error IS NULL) THEN 'delivered'
                     WHEN (SELECT true FROM webhook_dead_letter d
                           WHERE d.endpoint_id = o.endpoint_id AND d.failed_at = o.processed_at
                             AND d.delivery_id = o.delivery_id
                           LIMIT 1) THEN 'dead_lettered'
                     ELSE 'failed' END AS status
         FROM webhook_outbox o
         WHERE o.endpoint_id = $1::uuid
           AND ($2::text IS NULL OR o.tenant = $2) AND ($4::text IS NULL OR o.event_type = $4)
     ) q
     WHERE at >= $5::timestamptz AND at < coalesce($6::timestamptz, 'infinity')
       AND (at, id) < (coalesce($7::timestamptz, 'infinity'), coalesce($8::bigint, 9223372036854775807))
       AND ($3::text IS NULL OR status = $3)
     ORDER BY at DESC, id DESC
     LIMIT $9)
) r
-- Nothing unless the endpoint exists in the scope (a one-time check), so that the caller asks
-- whether it does only when the page is empty, rather than in a round trip of its own first.
WHERE EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = $1::uuid AND ($2::text IS NULL OR e.tenant = $2))
ORDER BY at DESC, id DESC
LIMIT $9
