-- Route events to an endpoint ($1) again. failing_since is cleared with the disable fields:
-- the failures it dated are the ones that got the endpoint disabled, and a fresh start must
-- not have it disabled again at once for an old streak.
UPDATE webhook_endpoints
SET enabled = true, disabled_at = NULL, disabled_reason = NULL, failing_since = NULL
WHERE id = $1::uuid
RETURNING id::text
