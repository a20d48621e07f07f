-- fluxhook dlq purge: delete dead letters named by row id ($7) or delivery id ($8) when $6,
-- else those matching the same filters as dlq list ($1 event type, $2 reason substring, $3
-- failed within microseconds, $4 delivery id, $5 endpoint id; NULL matches every row);
-- either way only those already replayed when $9. The command requires names, a filter or
-- $9: an empty filter alone would delete everything. Returns each deleted row's id and
-- delivery id.
--
-- A dead letter whose ordered stream stopped (ordering_failure 'stop', schema 6) left its own
-- outbox row (outbox_id, same delivery_id) undelivered, parked at 'infinity' with a
-- deferred_reason 'stream stopped: ...', holding back the rest of its stream until the dead
-- letter is replayed or purged. Purging it is the operator giving up on the event: the parked
-- row is moved to the delivery log in the same statement, and the stream goes on with its next
-- event (the row is matched by delivery_id too, as in dlq_replay.sql). The dispatchers are
-- then woken as a producer's insert wakes them, since the rows behind are due already and
-- nothing else would tell an idle dispatcher before its backstop poll. The NOTIFY is delivered
-- at commit, so a dry run (rolled back) neither releases nor wakes anything.
WITH purged AS (
    DELETE FROM webhook_dead_letter
    WHERE CASE WHEN $6::boolean
               THEN id = ANY ($7::bigint[]) OR delivery_id = ANY ($8::uuid[])
               ELSE ($1::text IS NULL OR event_type = $1)
                    AND ($2::text IS NULL OR strpos(lower(reason), lower($2)) > 0)
                    AND ($3::bigint IS NULL OR failed_at > now() - $3 * interval '1 microsecond')
                    AND ($4::uuid IS NULL OR delivery_id = $4)
                    AND ($5::uuid IS NULL OR endpoint_id = $5)
          END
      AND (NOT $9::boolean OR replayed_at IS NOT NULL)
    RETURNING id, delivery_id, outbox_id
), resumed AS (
    DELETE FROM webhook_outbox o
    USING purged p
    WHERE o.id = p.outbox_id AND o.delivery_id = p.delivery_id AND NOT o.processed
      AND o.deferred_reason LIKE 'stream stopped%'
    RETURNING o.id, o.stream_id, o.event_type, o.payload, o.created_at, o.delivery_id, o.attempt, o.enqueued_at,
              o.endpoint_url, o.tenant, o.endpoint_id, o.routed_at, o.order_key, p.id AS dead_letter_id
), logged AS (
    INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
                                      enqueued_at, endpoint_url, processed_at, error, tenant, endpoint_id,
                                      routed_at, order_key)
    SELECT id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, endpoint_url,
           now(), 'stream stopped here; dead letter ' || dead_letter_id
                  || ' was purged: the stream went on without the event',
           tenant, endpoint_id, routed_at, order_key
    FROM resumed
), woken AS (
    SELECT pg_notify('webhook_outbox', pg_current_xact_id()::text)
    WHERE EXISTS (SELECT 1 FROM resumed)
)
-- A plain WITH query runs only if read: this one-row condition reads woken.
SELECT id, delivery_id::text
FROM purged
WHERE (SELECT count(*) FROM woken) >= 0
