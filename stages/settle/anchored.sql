-- Settle deliveries that have no row of their own yet: an event routed in memory to its
-- endpoints stays in the queue, leased, as the one durable record of all its deliveries
-- (schema 5's event row), until its first delivery comes back. Then this statement, fenced by
-- the event's lease like any settle, replaces the event row:
--   - the event leaves the queue for the delivery log, its error saying how many endpoints
--     got it, as route.sql writes it;
--   - each delivered delivery of this batch goes straight to the delivery log (a row id
--     of its own from the outbox's sequence, as a routed delivery row had);
--   - every other delivery of the event, whether it came back with another outcome or is still
--     in flight, becomes a delivery row of the queue, leased to this dispatcher with its
--     event's new token, as route.sql inserts them: the caller settles those with an outcome
--     through settle.sql and the others when they come back.
-- In the common case every delivery of an event comes back in the same batch, delivered, and
-- the event's N deliveries cost N log rows and no queue rows; a delivery row cost an insert
-- and a delete more each (BenchmarkRouteSettle in stages/claim).
--   $1 the events' ids, $2 their lease tokens, $3 this dispatcher's instance id, $4 each
--   delivery's event, by the event's new token, $5 its endpoint id, $6 1 when it is delivered
--   (to the log), 0 when it becomes a row, $7 its HTTP status (0 none), $8 each event's new
--   token, unique per call (its new rows' lease token, and the key of its deliveries: one
--   event may come twice, claimed again after its lease ran out, each claim with deliveries
--   of its own), $9 the lease in milliseconds, $10 each delivery's attempt duration in ms,
--   $11 its error text ('' none), $12 each event's number of endpoints, $13 the start of the
--   consumer's answer to each delivery (schema 15; NULL: none kept).
-- Returns one row per event written ('e', its new token) and one per new delivery row ('d',
-- its lease token, its endpoint id, its row id). An event whose lease this instance lost
-- returns nothing and nothing of it is written: its holder delivers it again.
-- An event row locked by a session outside fluxhook is waited for at most a second, as
-- settle.sql says: the event is then left to its lease (settle.go, AnchoredResult.Failed).
WITH bound AS MATERIALIZED (
    SELECT pg_catalog.set_config('lock_timeout', '1s', true) AS lock_timeout
), input AS (
    SELECT t.* FROM bound, unnest($1::bigint[], $2::bigint[], $8::bigint[], $12::int[]) AS t(id, token, new_token, n)
    WHERE bound.lock_timeout IS NOT NULL
), deliveries AS (
    -- The endpoint ids come as text and are cast here: pgx parsing them into uuids on the
    -- client was 3% of the dispatcher's CPU in the fanout bench.
    SELECT new_token, endpoint_id::uuid AS endpoint_id, delivered, status, duration_ms, error, excerpt
    FROM unnest($4::bigint[], $5::text[], $6::smallint[], $7::int[], $10::int[], $11::text[], $13::text[])
        AS t(new_token, endpoint_id, delivered, status, duration_ms, error, excerpt)
), ev AS (
    DELETE FROM webhook_outbox o
    USING input i
    WHERE o.id = i.id AND o.processed IS NOT TRUE AND o.routed_at IS NULL
      AND o.leased_by = $3 AND o.lease_token = i.token
    RETURNING o.id, o.stream_id, o.event_type, o.payload, o.created_at, o.delivery_id, o.attempt,
              o.enqueued_at, o.endpoint_url, o.tenant, o.lease_token, i.new_token, i.n
), logged AS (
    INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
                                      enqueued_at, leased_by, lease_token, endpoint_url, processed_at,
                                      status_code, error, duration_ms, tenant, endpoint_id, routed_at,
                                      response_excerpt)
    SELECT id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, $3, lease_token,
           endpoint_url, now(), NULL, 'routed to ' || n || ' endpoint(s)', NULL, tenant, NULL, now(), NULL
    FROM ev
    UNION ALL
    -- The sequence is looked up once per execution, in an InitPlan: pg_get_serial_sequence
    -- is STABLE, so the planner does not fold it, and evaluated per row it would search the
    -- catalog for each delivery (3.0-3.6 µs a row against 0.5-0.6 µs, 100,000 nextval calls
    -- in psql).
    SELECT nextval((SELECT pg_get_serial_sequence('webhook_outbox', 'id')::regclass)), e.stream_id, e.event_type, e.payload,
           e.created_at, e.delivery_id, 1, e.enqueued_at, $3, e.lease_token, NULL, now(),
           nullif(d.status, 0), nullif(d.error, ''), d.duration_ms, e.tenant, d.endpoint_id, now(), d.excerpt
    FROM deliveries d JOIN ev e ON e.new_token = d.new_token
    WHERE d.delivered = 1
), made AS (
    INSERT INTO webhook_outbox (stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at,
                                tenant, endpoint_id, routed_at, lease_until, leased_by, lease_token)
    SELECT e.stream_id, e.event_type, e.payload, e.created_at, e.delivery_id, 1, e.enqueued_at,
           e.tenant, d.endpoint_id, now(), now() + $9::bigint * interval '1 millisecond', $3, e.new_token
    FROM deliveries d JOIN ev e ON e.new_token = d.new_token
    WHERE d.delivered = 0
    ORDER BY e.id, d.endpoint_id
    RETURNING id, lease_token, endpoint_id
)
SELECT 'e', new_token, '', 0::bigint FROM ev
UNION ALL
SELECT 'd', lease_token, endpoint_id::text, id FROM made
