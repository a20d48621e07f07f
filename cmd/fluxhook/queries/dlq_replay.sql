-- fluxhook dlq replay: re-enqueue locked dead letters as first attempts of the same event (same
-- delivery_id, payload, endpoint and enqueued_at, so consumers deduplicate it and latency stays
-- end to end), due now, and mark them replayed. One statement, so the wake-up trigger fires
-- once. A managed endpoint's dead letter goes back to that endpoint (endpoint_id), marked
-- routed so that it is not fanned out again; so does an event that went to WEBHOOK_URL after
-- being routed. Returns the number of outbox rows written.
WITH replayed AS (
    UPDATE webhook_dead_letter
    SET replayed_at = now()
    WHERE id = ANY($1::bigint[])
    RETURNING id, delivery_id, stream_id, event_type, payload, endpoint_url, enqueued_at, tenant, endpoint_id
), inserted AS (
    INSERT INTO webhook_outbox
        (delivery_id, stream_id, event_type, payload, endpoint_url, enqueued_at, attempt, created_at,
         tenant, endpoint_id, routed_at)
    SELECT delivery_id, stream_id, event_type, payload, endpoint_url, enqueued_at, 1, now(),
           tenant, endpoint_id, CASE WHEN endpoint_id IS NOT NULL OR endpoint_url IS NULL THEN now() END
    FROM replayed
    ORDER BY id
    RETURNING 1
)
SELECT count(*) FROM inserted
