-- Settle one batch of outcomes in one statement (one implicit transaction, one round trip).
--   $1 row ids, $2 kinds (1 delivered, 2 retry, 3 dead letter, 4 defer, 5 release), $3 HTTP
--   status (0 = none), $4 error ('' = none), $5 attempt duration ms, $6 delay ms before the
--   next row is due (retry, defer) or the lease ends (release), $7 dead-letter or deferral
--   reason, $8 this dispatcher's instance id, $9 each row's lease token (its claim's), $10 each
--   row's order key (schema 6; 0: unordered), $11 the start of the consumer's answer (schema 15;
--   NULL: none kept). Kind 6 is a dead letter of an ordered row whose
--   consumer stops the stream: the row stays undelivered, parked at 'infinity' with the reason,
--   so that it holds the rest of its stream until the dead letter is replayed or purged.
--
-- A retry and a dead letter of an ordered row keep its order key: the retry keeps the stream's
-- place, and a replay goes back to it.
--
-- Every kind is fenced by the lease (schema 4): a row is written only while leased_by and
-- lease_token are still those of the claim that leased it. When the lease ran out during a
-- slow attempt and another claim took the row, this outcome is refused, whatever its kind,
-- and the current holder's stands: a late 410 cannot dead-letter an event another instance
-- delivered, and a late retry cannot add a second retry row. The statement returns the ids it
-- wrote; the caller marks the others stale.
--
-- A settled row (delivered, retry, dead letter) leaves the queue: it is deleted from
-- webhook_outbox and its outcome goes to the delivery log, webhook_delivery_log (schema 7).
--
-- A retry is a new row with the same delivery_id, payload and enqueued_at, due by the
-- database's clock. A deferral (the gate held the row back) is not: the row's due time moves
-- in place, its lease ends and the reason is kept on it, so a deferral costs one row write and
-- adds nothing to the delivery log.
--
-- "processed IS NOT TRUE" is spelled so on purpose: "NOT processed" would let the planner
-- reach the rows through the partial due index, and the dispatcher's generic plan did,
-- whenever the statistics showed few due rows: every settle then walked the whole index, dead
-- entries of just-settled rows included, instead of looking up its ids (measured under the
-- bench's steady workload: 0.78 ms per settle of 1.5 rows). The primary key is the only index
-- this form can use, so a settle costs the same whatever the backlog and the statistics.
--
-- A row being settled is leased by this dispatcher, so only a session outside fluxhook (an
-- operator's open transaction, an application's SELECT ... FOR UPDATE) holds its lock for
-- long; waiting for it stalled every settle of the instance, every endpoint and tenant, for as
-- long as that session lasted. So the statement waits at most a second for a row's lock
-- (bounded: the in-statement lock_timeout covers only the waits of its execution, row locks,
-- not the table locks taken before it, which the log's maintenance makes settles queue
-- behind): the batch then fails, each row is settled alone, and the locked one is left to its
-- lease (settle.go, Result.Unsettled). The other rows of a stream that a settle parks or
-- releases are skipped when locked: they stay as they are, which only costs time.
WITH bound AS MATERIALIZED (
    SELECT pg_catalog.set_config('lock_timeout', '1s', true) AS lock_timeout
), input AS (
    SELECT t.*
    FROM bound,
         unnest($1::bigint[], $2::smallint[], $3::int[], $4::text[], $5::int[], $6::bigint[], $7::text[],
                $9::bigint[], $10::bigint[], $11::text[])
        AS t(id, kind, status, error, duration_ms, delay_ms, reason, token, order_key, excerpt)
    WHERE bound.lock_timeout IS NOT NULL
), settled AS (
    DELETE FROM webhook_outbox o
    USING input i
    WHERE o.id = i.id AND i.kind IN (1, 2, 3) AND o.processed IS NOT TRUE
      AND o.leased_by = $8 AND o.lease_token = i.token
    RETURNING o.id, o.delivery_id, o.stream_id, o.event_type, o.payload, o.attempt, o.enqueued_at,
              o.endpoint_url, o.tenant, o.endpoint_id, o.routed_at, i.kind, i.status, i.error, i.delay_ms, i.reason,
              nullif(i.order_key, 0) AS order_key, o.created_at, i.duration_ms, i.token, i.excerpt
), logged AS (
    INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
                                      enqueued_at, leased_by, lease_token, endpoint_url, processed_at,
                                      status_code, error, duration_ms, tenant, endpoint_id, routed_at, order_key,
                                      response_excerpt)
    SELECT id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, $8, token,
           endpoint_url, now(), nullif(status, 0), nullif(error, ''), duration_ms, tenant, endpoint_id,
           routed_at, order_key, excerpt
    FROM settled
-- delivered:end (settleDeliveredSQL in settle.go is this statement up to here, for batches of
-- deliveries alone)
), stopped AS (
    UPDATE webhook_outbox o
    SET created_at = 'infinity',
        lease_until = NULL,
        leased_by = NULL,
        lease_token = NULL,
        status_code = nullif(i.status, 0),
        error = nullif(i.error, ''),
        duration_ms = i.duration_ms,
        order_key = nullif(i.order_key, 0),
        deferred_reason = 'stream stopped: ' || i.reason
    FROM input i
    WHERE o.id = i.id AND i.kind = 6 AND o.processed IS NOT TRUE
      AND o.leased_by = $8 AND o.lease_token = i.token
    RETURNING o.id, o.delivery_id, o.stream_id, o.event_type, o.payload, o.attempt, o.enqueued_at,
              o.endpoint_url, o.tenant, o.endpoint_id, o.routed_at, i.kind, i.status, i.error, i.delay_ms, i.reason,
              o.order_key, o.created_at, i.duration_ms, i.token, i.excerpt
), requeued AS (
    INSERT INTO webhook_outbox (stream_id, event_type, payload, created_at, delivery_id, attempt,
                                enqueued_at, endpoint_url, tenant, endpoint_id, routed_at, order_key)
    SELECT stream_id, event_type, payload, now() + delay_ms * interval '1 millisecond', delivery_id,
           attempt + 1, enqueued_at, endpoint_url, tenant, endpoint_id, routed_at, order_key
    FROM settled
    WHERE kind = 2
    RETURNING id
), dead AS (
    INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload,
                                     endpoint_url, attempts, last_status, last_error, reason,
                                     enqueued_at, tenant, endpoint_id, order_key, last_response_excerpt)
    SELECT id, delivery_id, stream_id, event_type, payload, endpoint_url, attempt,
           nullif(status, 0), nullif(error, ''), reason, enqueued_at, tenant, endpoint_id, order_key, excerpt
    FROM (SELECT * FROM settled WHERE kind = 3 UNION ALL SELECT * FROM stopped) d
    RETURNING id
), deferred AS (
    UPDATE webhook_outbox o
    SET created_at = now() + i.delay_ms * interval '1 millisecond',
        lease_until = NULL,
        leased_by = NULL,
        lease_token = NULL,
        deferred_reason = nullif(i.reason, '')
    FROM input i
    WHERE o.id = i.id AND i.kind = 4 AND o.processed IS NOT TRUE
      AND o.leased_by = $8 AND o.lease_token = i.token
    RETURNING o.id, o.stream_id, o.endpoint_id, o.endpoint_url, nullif(i.order_key, 0) AS order_key, i.delay_ms
), waiting AS (
    -- The rows waiting behind each ordered head that will not be due for a second or more, for
    -- parked below: a retry, a deferral, a stream stopped at its dead letter ('infinity').
    SELECT p.id, h.due
    FROM (SELECT stream_id, coalesce('ep:' || endpoint_id::text, endpoint_url, '') AS key, order_key,
                 now() + delay_ms * interval '1 millisecond' AS due
          FROM settled
          WHERE kind = 2 AND order_key IS NOT NULL AND stream_id IS NOT NULL AND delay_ms >= 1000
          UNION ALL
          SELECT stream_id, coalesce('ep:' || endpoint_id::text, endpoint_url, ''), order_key,
                 now() + delay_ms * interval '1 millisecond'
          FROM deferred
          WHERE order_key IS NOT NULL AND stream_id IS NOT NULL AND delay_ms >= 1000
          UNION ALL
          SELECT stream_id, coalesce('ep:' || endpoint_id::text, endpoint_url, ''), order_key, 'infinity'
          FROM stopped
          WHERE order_key IS NOT NULL AND stream_id IS NOT NULL) h
    CROSS JOIN LATERAL (
        SELECT p.id FROM webhook_outbox p
        WHERE p.stream_id = h.stream_id AND NOT p.processed
          AND coalesce('ep:' || p.endpoint_id::text, p.endpoint_url, '') = h.key
          AND coalesce(p.order_key, p.id) > h.order_key
          AND p.created_at <= now()
          -- parked's own conditions on the row, so that no row it leaves alone is locked (a
          -- row in flight is its holder's to settle, which must not find it locked).
          AND (p.deferred_reason IS NULL OR p.deferred_reason = 'behind its stream')
          AND (p.lease_until IS NULL OR p.lease_until < now())
        -- Kept a subquery run per head: flattened into a join, the plan made on an empty table
        -- walked the whole stream index on every settle.
        OFFSET 0
        FOR UPDATE OF p SKIP LOCKED) p
), parked AS (
    -- An ordered head that will not be due for a second or more (a retry, a deferral by the
    -- gate, a stream stopped at its dead letter) takes the later rows of its stream and
    -- endpoint that wait behind it out of the claims' way: they come due when it does, or in
    -- an hour if that is sooner, marked 'behind its stream' (park.sql parks them again then, if
    -- they still wait), and when it is delivered or dead-lettered the next one comes due at
    -- once (successor). Left due, each of them was read, and its head looked up, by every
    -- claim until then: an ordered endpoint that was down for a while made every claim of
    -- every tenant read its whole backlog (20,000 rows: 120 ms per claim). Only rows already
    -- due are parked: a row scheduled for later keeps its time (a release would otherwise
    -- make it due before it), and park.sql parks it if it still waits when it comes due. A
    -- row with another mark (replayed, stopped) keeps its own. An event still to be routed to endpoints is not a delivery of this stream yet,
    -- and a managed endpoint's row is parked only while the endpoint orders its streams.
    -- Driven from the heads: the rows come from a look per head at its own range of the stream
    -- index (waiting), and the update finds them by id (ARRAY), whatever the statistics the
    -- generic plan was made with (made on an empty table, a join let it walk the whole outbox
    -- by its primary key on every settle).
    UPDATE webhook_outbox o
    SET created_at = least(w.due, now() + interval '1 hour'), deferred_reason = 'behind its stream'
    FROM waiting w
    WHERE o.id = ANY (ARRAY(SELECT id FROM waiting)) AND o.id = w.id AND o.processed IS NOT TRUE
      AND o.created_at <= now()
      AND (o.deferred_reason IS NULL OR o.deferred_reason = 'behind its stream')
      AND (o.lease_until IS NULL OR o.lease_until < now())
      AND (o.endpoint_id IS NOT NULL OR o.endpoint_url IS NOT NULL OR o.routed_at IS NOT NULL
           OR NOT EXISTS (SELECT 1 FROM webhook_endpoints))
      AND (o.endpoint_id IS NULL OR EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = o.endpoint_id AND e.ordering = 'stream'))
    RETURNING o.id
), successor AS (
    -- successor:begin (settleDeliveredOrderedSQL in settle.go adds this part to the statement
    -- for deliveries alone)
    -- An ordered row delivered or dead-lettered (its stream goes on) lets its stream's next row
    -- for its endpoint go at once if it was parked behind it: a head brought forward by another
    -- way than its own retry (a closed breaker, an operator) leaves the rows parked behind it at
    -- its old time, and each head releases the next one this way, so none waits for that time.
    UPDATE webhook_outbox o
    SET created_at = now(), deferred_reason = NULL
    WHERE o.id = ANY (ARRAY(
            SELECT l.id FROM webhook_outbox l
            WHERE l.id = ANY (ARRAY(
                    SELECT (SELECT n.id FROM webhook_outbox n
                            WHERE n.stream_id = s.stream_id AND NOT n.processed
                              AND coalesce('ep:' || n.endpoint_id::text, n.endpoint_url, '')
                                    = coalesce('ep:' || s.endpoint_id::text, s.endpoint_url, '')
                              AND coalesce(n.order_key, n.id) > s.order_key
                            ORDER BY coalesce(n.order_key, n.id)
                            LIMIT 1)
                    FROM settled s
                    WHERE s.kind IN (1, 3) AND s.order_key IS NOT NULL AND s.stream_id IS NOT NULL))
              AND l.processed IS NOT TRUE AND l.deferred_reason = 'behind its stream' AND l.created_at > now()
            FOR UPDATE SKIP LOCKED))
      AND o.processed IS NOT TRUE AND o.deferred_reason = 'behind its stream' AND o.created_at > now()
    RETURNING o.id
    -- successor:end
), released AS (
    UPDATE webhook_outbox o
    SET lease_until = now() + i.delay_ms * interval '1 millisecond'
    FROM input i
    WHERE o.id = i.id AND i.kind = 5 AND o.processed IS NOT TRUE
      AND o.leased_by = $8 AND o.lease_token = i.token
    RETURNING o.id
)
SELECT (SELECT count(*) FROM settled) + (SELECT count(*) FROM stopped), (SELECT count(*) FROM requeued),
       (SELECT count(*) FROM dead), (SELECT count(*) FROM deferred), (SELECT count(*) FROM released),
       (SELECT count(*) FROM successor),
       ARRAY(SELECT id FROM settled UNION ALL SELECT id FROM stopped UNION ALL SELECT id FROM deferred
             UNION ALL SELECT id FROM released)
