-- Enqueue many events in one statement, so the statement-level wake-up trigger fires once for
-- the whole batch. The arrays are parallel, one element per event; rows are inserted in input
-- order. Counted in a CTE so the caller needs nothing but QueryRow.
WITH inserted AS (
    INSERT INTO webhook_outbox (event_type, payload, stream_id, endpoint_url, created_at, tenant)
    SELECT e.event_type,
           e.payload,
           NULLIF(e.stream_id, ''),
           NULLIF(e.endpoint_url, ''),
           coalesce(e.due_at, now()) + e.delay_us * interval '1 microsecond',
           NULLIF(e.tenant, '')
    FROM unnest($1::text[], $2::jsonb[], $3::text[], $4::text[], $5::timestamptz[], $6::bigint[], $7::text[])
         WITH ORDINALITY AS e(event_type, payload, stream_id, endpoint_url, due_at, delay_us, tenant, ord)
    ORDER BY e.ord
    RETURNING 1
)
SELECT count(*) FROM inserted
