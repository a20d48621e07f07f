-- Replace an endpoint's secret ($1 id) with $3 (as stored), keeping the current one as the
-- previous secret until now + $4 microseconds ($4 NULL: not kept, for a leaked secret). The
-- stored form is moved as it is, so rotating never needs to open the current secret. Guarded
-- by the scheme RotateSecret checked $3 against ($2, from state.sql).
UPDATE webhook_endpoints
SET previous_secret = CASE WHEN $4::bigint IS NOT NULL THEN secret END,
    previous_secret_expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond',
    secret = $3::text
WHERE id = $1::uuid AND scheme = $2::text
RETURNING id::text
