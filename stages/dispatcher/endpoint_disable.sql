-- Disable the enabled endpoints that have been failing without a success for longer than $1
-- milliseconds, with reason $2; returns their ids.
UPDATE webhook_endpoints
SET enabled = false, disabled_at = now(), disabled_reason = $2
WHERE enabled
  AND failing_since < now() - $1::bigint * interval '1 millisecond'
  AND (last_success_at IS NULL OR last_success_at < now() - $1::bigint * interval '1 millisecond')
RETURNING id::text
