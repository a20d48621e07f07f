-- Enqueue one event. $5 is the caller's absolute due time (NULL = the database's now()), $6 a
-- delay in microseconds added on the database's clock, so that "in five seconds" does not
-- depend on the producer's clock agreeing with the database's.
INSERT INTO webhook_outbox (event_type, payload, stream_id, endpoint_url, created_at, tenant)
VALUES (
    $1,
    $2::jsonb,
    NULLIF($3::text, ''),
    NULLIF($4::text, ''),
    coalesce($5::timestamptz, now()) + $6::bigint * interval '1 microsecond',
    NULLIF($7::text, '')
)
RETURNING id, delivery_id::text
