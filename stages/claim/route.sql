-- Fan claimed events out to the endpoints they match (schema 5), in one statement per claimed
-- batch: one delivery row per matching endpoint, inserted already leased to this dispatcher
-- so that it goes straight to the pipeline without another claim.
--   $1 the event rows' ids, $2 their lease tokens, $3 this dispatcher's instance id, $4
--   whether the configured WEBHOOK_URL takes events without a tenant, $5 the new rows' lease
--   token, $6 the lease in milliseconds, $7 whether WEBHOOK_ORDERING=stream orders the events
--   kept for WEBHOOK_URL (schema 6), $8 the events whose payload the claim found over
--   WEBHOOK_MAX_PAYLOAD_BYTES, $9 the size of a payload's text form above which no body is
--   returned (NULL: no limit; see claim.sql and Claimer.LimitPayload).
--
-- An event matches an endpoint that is enabled, has the event's tenant (both NULL, or equal:
-- never across tenants), existed when the event was enqueued (an endpoint added later
-- receives only later events), and whose filter is empty, names the event type, or holds a
-- "prefix.*" pattern the type starts with (prefix and dot). The event row itself is fenced
-- like a settle: routed only while this claim still holds it, and only once (routed_at). The
-- writes check the lease again, and deliveries are made only for the events written: src's
-- read does not lock the row, and a claim that re-leased it after its lease ran out, committed
-- while this statement waited for the row, must find it untouched (the update and the delete
-- see that claim's version of the row, and only their own conditions are checked on it).
-- When WEBHOOK_URL takes the event, the event row stays pending as its delivery; otherwise it
-- is settled here (moved to the delivery log), its error saying how many endpoints got it, or
-- 'no endpoint matched': such an event is recorded and counted, never silently dropped.
--
-- Ordered delivery (schema 6): a delivery to an endpoint with ordering 'stream' of an event
-- with a stream_id carries the event's id as its order_key and is inserted unleased, as is
-- an event kept for WEBHOOK_URL when $7 orders it: a claim takes it when it is its stream's
-- head (see claim.sql), not this statement.
--
-- An event over WEBHOOK_MAX_PAYLOAD_BYTES ($8) is routed like any other, so that each of its
-- deliveries is dead-lettered by its endpoint's rules, but its payload is not returned: the
-- dispatcher never receives a body it may not send (nor one over $9 of a delivery that brings
-- its own).
--
-- Returns the new leased delivery rows ('d'), one row per ordered delivery left for a claim
-- ('q'), and one row per event routed ('e': kept for WEBHOOK_URL or not, endpoints matched;
-- 'r': kept, and left for a claim). An event the statement did not route (its lease was lost)
-- returns nothing. The payload comes once per event that matched an endpoint, on its 'e' or
-- 'r' row, and its deliveries (by delivery id) share it: returned with every delivery, it
-- was turned into text and sent 10 times per event of the fan-out bench. Deliveries of a
-- delivery id that several events of the batch carry bring their own.
--
-- The event rows are leased by this claim, so only a session outside fluxhook (an operator's
-- open transaction) holds one's lock for long: the statement waits at most a second for it
-- (bounded: the in-statement lock_timeout covers the row locks of its execution, not the table
-- locks taken before it), then fails: Claimer.Route leaves the events locked then to their
-- lease (claims skip the locked rows meanwhile) and routes the others. Waiting for it stopped
-- every claim of the instance.
WITH bound AS MATERIALIZED (
    SELECT pg_catalog.set_config('lock_timeout', '1s', true) AS lock_timeout
), input AS (
    SELECT t.* FROM bound, unnest($1::bigint[], $2::bigint[]) AS t(id, token)
    WHERE bound.lock_timeout IS NOT NULL
), src AS (
    SELECT o.id, i.token, o.delivery_id, o.stream_id, o.event_type, o.payload, o.created_at, o.enqueued_at, o.tenant,
           $4::boolean AND o.tenant IS NULL AS keep,
           $7::boolean AND o.stream_id IS NOT NULL AS ordered
    FROM webhook_outbox o JOIN input i ON o.id = i.id
    WHERE o.leased_by = $3 AND o.lease_token = i.token AND o.processed IS NOT TRUE AND o.routed_at IS NULL
), shared AS (
    -- Delivery ids that more than one event of the batch carries (a producer may set its own):
    -- their deliveries bring their payload themselves, since an id cannot tell the events apart.
    SELECT delivery_id FROM src GROUP BY delivery_id HAVING count(*) > 1
), matched AS (
    SELECT src.*, e.id AS endpoint_id,
           CASE WHEN e.ordering = 'stream' AND src.stream_id IS NOT NULL THEN src.id END AS order_key
    FROM src JOIN webhook_endpoints e
      ON e.enabled
     AND e.tenant IS NOT DISTINCT FROM src.tenant
     AND e.created_at <= src.enqueued_at
     AND (cardinality(e.event_types) = 0
          OR src.event_type = ANY (e.event_types)
          OR EXISTS (SELECT 1 FROM unnest(e.event_types) f
                     WHERE f LIKE '%.*' AND starts_with(src.event_type, left(f, -1))))
), counted AS (
    SELECT src.id, src.token, src.keep, src.ordered, coalesce(m.n, 0) AS n
    FROM src LEFT JOIN (SELECT id, count(*) AS n FROM matched GROUP BY id) m ON m.id = src.id
), kept AS (
    -- An event WEBHOOK_URL takes stays in the queue as its delivery.
    UPDATE webhook_outbox o
    SET routed_at = now(),
        lease_until = CASE WHEN c.ordered THEN NULL ELSE o.lease_until END,
        leased_by = CASE WHEN c.ordered THEN NULL ELSE o.leased_by END,
        lease_token = CASE WHEN c.ordered THEN NULL ELSE o.lease_token END
    FROM counted c
    WHERE o.id = c.id AND c.keep AND o.leased_by = $3 AND o.lease_token = c.token AND o.routed_at IS NULL
    RETURNING o.id, o.delivery_id, o.payload, c.keep, c.ordered, c.n
), gone AS (
    -- Any other event leaves the queue for the delivery log (schema 7), its error saying what
    -- became of it.
    DELETE FROM webhook_outbox o
    USING counted c
    WHERE o.id = c.id AND NOT c.keep AND o.leased_by = $3 AND o.lease_token = c.token AND o.routed_at IS NULL
    RETURNING o.id, o.stream_id, o.event_type, o.payload, o.created_at, o.delivery_id, o.attempt, o.enqueued_at,
              o.endpoint_url, o.tenant, o.lease_token, c.keep, c.ordered, c.n
), logged AS (
    INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
                                      enqueued_at, leased_by, lease_token, endpoint_url, processed_at, error,
                                      tenant, routed_at)
    SELECT id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, $3, lease_token,
           endpoint_url, now(), CASE WHEN n = 0 THEN 'no endpoint matched' ELSE 'routed to ' || n || ' endpoint(s)' END,
           tenant, now()
    FROM gone
), events AS (
    SELECT id, delivery_id, payload, keep, ordered, n FROM kept
    UNION ALL
    SELECT id, delivery_id, payload, keep, ordered, n FROM gone
), fan AS (
    INSERT INTO webhook_outbox (stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at,
                                tenant, endpoint_id, routed_at, lease_until, leased_by, lease_token, order_key,
                                deferred_reason)
    SELECT stream_id, event_type, payload,
           CASE WHEN behind AND NOT rejoined THEN greatest(created_at, least(head_due, now() + interval '1 hour'))
                ELSE created_at END,
           delivery_id, 1, enqueued_at, tenant, endpoint_id, now(),
           CASE WHEN order_key IS NULL THEN now() + $6::bigint * interval '1 millisecond' END,
           CASE WHEN order_key IS NULL THEN $3 END, CASE WHEN order_key IS NULL THEN $5::bigint END, order_key,
           CASE WHEN rejoined THEN 'rejoined' WHEN behind THEN 'behind its stream' END
    FROM (
        SELECT matched.*, hd.due AS head_due,
               -- An ordered delivery routed after later ones of its stream (its event was
               -- scheduled for later, and they went meanwhile) rejoins its stream behind them:
               -- it waits while one is in flight (claim.sql). Looked for only when the event was
               -- due a second or more after it was enqueued: the look reads the endpoint's later
               -- rows of the stream, and done for every event it would read a one-stream
               -- backlog again for each of its events (a producer's ORM setting created_at puts
               -- it a few milliseconds after enqueued_at).
               CASE WHEN order_key IS NOT NULL AND created_at > enqueued_at + interval '1 second' THEN EXISTS (
                   SELECT 1 FROM webhook_outbox l
                   WHERE l.stream_id = matched.stream_id AND NOT l.processed
                     AND coalesce('ep:' || l.endpoint_id::text, l.endpoint_url, '') = 'ep:' || matched.endpoint_id::text
                     AND coalesce(l.order_key, l.id) > matched.order_key)
                    ELSE false END AS rejoined,
               -- An ordered delivery whose stream's head for its endpoint is not due for a second
               -- or more (waiting for a retry, deferred by the gate, stopped at its dead letter)
               -- is due when its head is, or in an hour if that is sooner, parked as settle.sql
               -- parks the rows behind such a head: left due, every claim would read it and look
               -- its head up until then. Not a rejoined one: nothing would bring it along when
               -- its head came due early, and it would hold the rows behind it back.
               coalesce(hd.due > now() + interval '1 second', false) AS behind
        FROM matched
        LEFT JOIN LATERAL (
            SELECT h.created_at AS due
            FROM webhook_outbox h
            WHERE matched.order_key IS NOT NULL AND h.stream_id = matched.stream_id AND NOT h.processed
              AND coalesce('ep:' || h.endpoint_id::text, h.endpoint_url, '') = 'ep:' || matched.endpoint_id::text
              AND coalesce(h.order_key, h.id) < matched.order_key
            ORDER BY coalesce(h.order_key, h.id)
            LIMIT 1) hd ON true
    ) m
    WHERE id IN (SELECT id FROM events)
    ORDER BY id, endpoint_id
    RETURNING id, delivery_id::text AS delivery_id, coalesce(stream_id, '') AS stream_id, event_type,
              CASE WHEN delivery_id IN (SELECT delivery_id FROM shared)
                        AND ($9::bigint IS NULL OR octet_length(payload::text) <= $9::bigint)
                   THEN payload::text END AS payload,
              CASE WHEN delivery_id IN (SELECT delivery_id FROM shared) THEN octet_length(payload::text) END AS size,
              attempt, enqueued_at, created_at, endpoint_id::text AS endpoint_id,
              tenant, order_key
)
SELECT CASE WHEN f.order_key IS NULL THEN 'd' ELSE 'q' END, f.id, f.delivery_id, f.stream_id, f.event_type,
       f.payload, f.size::bigint, f.attempt, f.enqueued_at, f.created_at, f.endpoint_id, f.tenant, false, 0::bigint
FROM fan f
UNION ALL
SELECT CASE WHEN e.keep AND e.ordered THEN 'r' ELSE 'e' END, e.id, e.delivery_id::text, '', '',
       CASE WHEN e.n > 0 AND e.id <> ALL ($8::bigint[]) THEN e.payload::text END, NULL::bigint, 1, now(), now(), '',
       NULL, e.keep, e.n
FROM events e
