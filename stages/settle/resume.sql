-- Bring forward the rows of one endpoint that the gate deferred behind its circuit breaker
-- (open, or a probe in flight), once a probe has closed the circuit: they were deferred to the
-- reset time or to the probe's expiry, and would otherwise wait that long behind an endpoint
-- that is healthy again. One write per waiting row, once per recovery.
--   $1 the endpoint key ('ep:<endpoint_id>' for a managed endpoint, else endpoint_url, '' for
--   the configured default: the claim's key), $2 the deferral reasons to resume.
-- The rows are found through the due index (created_at > now(): deferred rows lie in the
-- future), so this costs what the endpoint's deferred backlog costs, never the delivery log.
UPDATE webhook_outbox
SET created_at = now(), deferred_reason = NULL
WHERE NOT processed
  AND created_at > now()
  AND coalesce('ep:' || endpoint_id::text, endpoint_url, '') = $1
  AND deferred_reason = ANY ($2::text[])
  AND (lease_until IS NULL OR lease_until < now())
