-- Disable the enabled endpoints that have been failing without a success for longer than $1
-- milliseconds, with reason $2; returns their ids. The rows are locked first in the order of
-- their ids, as endpoint_outcomes.sql locks them: in the order of a plan (the tenant index),
-- it deadlocked with a record of outcomes for the same endpoints.
WITH locked AS (
    SELECT id
    FROM webhook_endpoints
    WHERE enabled
      AND failing_since < now() - $1::bigint * interval '1 millisecond'
      AND (last_success_at IS NULL OR last_success_at < now() - $1::bigint * interval '1 millisecond')
    ORDER BY id
    FOR NO KEY UPDATE
)
UPDATE webhook_endpoints
SET enabled = false, disabled_at = now(), disabled_reason = $2
WHERE id = ANY (ARRAY(SELECT id FROM locked))
RETURNING id::text
