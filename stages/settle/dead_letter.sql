-- Last resort for one row whose normal settlement failed (for example a constraint or trigger
-- the operator added rejects its retry row): dead-letter it with the reason, so that it
-- neither blocks the batch nor comes back forever. It leaves the queue for the delivery log
-- as every settled row does (settle.sql).
--   $1 row id, $2 reason, $3 HTTP status (0 = none), $4 error ('' = none), $5 this
--   dispatcher's instance id, $6 the row's lease token: fenced like every settle (settle.sql),
--   $7 the start of the consumer's answer (NULL: none kept).
WITH settled AS (
    DELETE FROM webhook_outbox
    WHERE id = $1 AND processed IS NOT TRUE AND leased_by = $5 AND lease_token = $6
    RETURNING id, delivery_id, stream_id, event_type, payload, endpoint_url, attempt, enqueued_at, tenant, endpoint_id,
              order_key, created_at, routed_at
), logged AS (
    INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
                                      enqueued_at, leased_by, lease_token, endpoint_url, processed_at, status_code,
                                      error, tenant, endpoint_id, routed_at, order_key, response_excerpt)
    SELECT id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, $5, $6, endpoint_url,
           now(), nullif($3::int, 0), nullif($4::text, ''), tenant, endpoint_id, routed_at, order_key, $7::text
    FROM settled
)
INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload,
                                 endpoint_url, attempts, last_status, last_error, reason, enqueued_at,
                                 tenant, endpoint_id, order_key, last_response_excerpt)
SELECT id, delivery_id, stream_id, event_type, payload, endpoint_url, attempt,
       nullif($3::int, 0), nullif($4::text, ''), $2, enqueued_at, tenant, endpoint_id, order_key, $7::text
FROM settled
