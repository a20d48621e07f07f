-- Stop routing events to an endpoint ($1), keeping it and its configuration. Disabling a
-- disabled endpoint keeps when it was first disabled and replaces the reason ($2).
UPDATE webhook_endpoints
SET enabled = false,
    disabled_at = CASE WHEN enabled THEN clock_timestamp() ELSE coalesce(disabled_at, clock_timestamp()) END,
    disabled_reason = $2::text
WHERE id = $1::uuid
RETURNING id::text
