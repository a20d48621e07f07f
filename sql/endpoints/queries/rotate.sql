-- Replace an endpoint's secret ($1 id) with $3 (as stored), keeping the current one as the
-- previous secret, re-sealed as such ($5: sealed values are bound to their field), until
-- now + $4 microseconds ($4 and $5 NULL: not kept, for a leaked secret). Guarded by the scheme
-- RotateSecret checked $3 against ($2) and by the secret it re-sealed ($6, as stored), both
-- from state.sql, so that a concurrent rotation is never undone.
UPDATE webhook_endpoints
SET previous_secret = $5::text,
    previous_secret_expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond',
    secret = $3::text
WHERE id = $1::uuid AND scheme = $2::text AND secret = $6::text
RETURNING id::text
