-- Settle one batch of outcomes in one statement (one implicit transaction, one round trip).
--   $1 row ids, $2 kinds (1 delivered, 2 retry, 3 dead letter, 4 defer, 5 release), $3 HTTP
--   status (0 = none), $4 error ('' = none), $5 attempt duration ms, $6 delay ms before the
--   next row is due (retry, defer) or the lease ends (release), $7 dead-letter reason,
--   $8 this dispatcher's instance id.
-- Retries and deferrals are new rows with the same delivery_id, payload and enqueued_at, due
-- by the database's clock. "processed IS NOT TRUE" makes settling idempotent: if a row was
-- settled by another instance after our lease expired, we neither settle nor re-enqueue it
-- twice. It is spelled so on purpose: "NOT processed" would let the planner reach the rows
-- through the partial due index, and the dispatcher's generic plan did, whenever the
-- statistics showed few due rows: every settle then walked the whole index, dead entries of
-- just-settled rows included, instead of looking up its ids (measured under the bench's steady
-- workload: 0.78 ms per settle of 1.5 rows). The primary key is the only index this form can
-- use, so a settle costs the same whatever the backlog and the statistics.
WITH input AS (
    SELECT *
    FROM unnest($1::bigint[], $2::smallint[], $3::int[], $4::text[], $5::int[], $6::bigint[], $7::text[])
        AS t(id, kind, status, error, duration_ms, delay_ms, reason)
), settled AS (
    UPDATE webhook_outbox o
    SET processed = true,
        processed_at = now(),
        lease_until = NULL,
        status_code = nullif(i.status, 0),
        error = nullif(i.error, ''),
        duration_ms = i.duration_ms
    FROM input i
    WHERE o.id = i.id AND i.kind IN (1, 2, 3, 4) AND o.processed IS NOT TRUE
    RETURNING o.id, o.delivery_id, o.stream_id, o.event_type, o.payload, o.attempt, o.enqueued_at,
              o.endpoint_url, i.kind, i.status, i.error, i.delay_ms, i.reason
), requeued AS (
    INSERT INTO webhook_outbox (stream_id, event_type, payload, created_at, delivery_id, attempt,
                                enqueued_at, endpoint_url)
    SELECT stream_id, event_type, payload, now() + delay_ms * interval '1 millisecond', delivery_id,
           CASE WHEN kind = 2 THEN attempt + 1 ELSE attempt END, enqueued_at, endpoint_url
    FROM settled
    WHERE kind IN (2, 4)
    RETURNING id
), dead AS (
    INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload,
                                     endpoint_url, attempts, last_status, last_error, reason,
                                     enqueued_at)
    SELECT id, delivery_id, stream_id, event_type, payload, endpoint_url, attempt,
           nullif(status, 0), nullif(error, ''), reason, enqueued_at
    FROM settled
    WHERE kind = 3
    RETURNING id
), released AS (
    UPDATE webhook_outbox o
    SET lease_until = now() + i.delay_ms * interval '1 millisecond'
    FROM input i
    WHERE o.id = i.id AND i.kind = 5 AND o.processed IS NOT TRUE AND o.leased_by = $8
    RETURNING o.id
)
SELECT (SELECT count(*) FROM settled), (SELECT count(*) FROM requeued),
       (SELECT count(*) FROM dead), (SELECT count(*) FROM released)
