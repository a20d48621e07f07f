-- Dead-lettering an endpoint's pending deliveries, shared by update.sql (a tenant change) and
-- remove.sql ('dead-letter'): a Go text/template that store.go expands into both once, at
-- start, so that the two settle the rows by one text, as the dispatcher settles a dead letter.
--
-- The statement's own CTE settled deletes the outbox rows it dead-letters (each statement
-- chooses which) and returns the template settled_columns: every column the two CTEs below
-- copy, and parked, for a row parked by an ordered stream that stopped (schema 6: created_at
-- 'infinity').
--
-- The template dead_letter, given the reason, is two CTEs, logged and dead: logged moves every
-- settled row to the delivery log, with the reason in error; dead copies them to
-- webhook_dead_letter, with the reason and their order keys as the dispatcher's dead letters
-- keep them, except a parked row, which has its dead letter already (a second one would have
-- the event replayed twice). dead returns a row for each dead letter written, to be counted.
{{define "settled_columns"}}id, delivery_id, stream_id, event_type, payload, endpoint_url, attempt, enqueued_at,
              tenant, endpoint_id, order_key, created_at, routed_at, created_at = 'infinity' AS parked{{end}}
{{define "dead_letter"}}logged AS (
    INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
                                      enqueued_at, endpoint_url, processed_at, error, tenant, endpoint_id,
                                      routed_at, order_key)
    SELECT id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, endpoint_url,
           now(), {{literal .}}, tenant, endpoint_id, routed_at, order_key
    FROM settled
), dead AS (
    INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload, endpoint_url,
                                     attempts, reason, enqueued_at, tenant, endpoint_id, order_key)
    SELECT id, delivery_id, stream_id, event_type, payload, endpoint_url, attempt, {{literal .}},
           enqueued_at, tenant, endpoint_id, order_key
    FROM settled
    WHERE NOT parked
    ORDER BY id
    RETURNING 1
){{end}}
