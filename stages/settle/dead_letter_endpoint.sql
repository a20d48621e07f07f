-- Dead-letter the pending deliveries of one managed endpoint that was disabled: $1 the
-- endpoint's id, $2 the reason ("endpoint disabled: ..."). Rows under a live lease are left
-- to their holder (dead-lettered when they are next claimed); SKIP LOCKED, so that several
-- instances doing this at once never wait on each other. Returns the rows moved. A row parked
-- by an ordered stream that stopped (schema 6: created_at 'infinity') has its dead letter
-- already and is left as it is; ordered rows keep their order key for a replay. The moved
-- rows leave the queue for the delivery log (schema 7), with the reason as their error.
WITH moved AS (
    DELETE FROM webhook_outbox
    WHERE id = ANY (ARRAY(
        SELECT id FROM webhook_outbox
        WHERE NOT processed AND endpoint_id = $1::uuid
          AND (lease_until IS NULL OR lease_until < now())
          AND created_at < 'infinity'
        FOR UPDATE SKIP LOCKED))
    RETURNING id, delivery_id, stream_id, event_type, payload, endpoint_url, attempt, enqueued_at, tenant, endpoint_id,
              order_key, created_at, routed_at
), logged AS (
    INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
                                      enqueued_at, endpoint_url, processed_at, error, tenant, endpoint_id,
                                      routed_at, order_key)
    SELECT id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, endpoint_url,
           now(), $2, tenant, endpoint_id, routed_at, order_key
    FROM moved
)
INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload, endpoint_url,
                                 attempts, reason, enqueued_at, tenant, endpoint_id, order_key)
SELECT id, delivery_id, stream_id, event_type, payload, endpoint_url, attempt, $2, enqueued_at, tenant, endpoint_id,
       order_key
FROM moved
