-- Bring forward rows of one breaker that the gate deferred behind it (open, or a probe in
-- flight): after a probe closed the circuit, all of them to now, once per recovery; after a
-- probe ended without closing it, the soonest due one to the next probe time, so that a row is
-- there to probe then (one write per probe, whatever the backlog). A row is never pushed back.
--   $1 the endpoint keys sharing the breaker ('ep:<endpoint_id>' for a managed endpoint, else
--   endpoint_url, '' for the configured default: the claim's key), $2 the deferral reasons to
--   bring forward, $3 the delay from now in milliseconds, $4 at most this many rows (0: all),
--   soonest due first, $5 the reason the rows keep ('' clears it: due now).
-- The rows are found through the due index (created_at > now(): deferred rows lie in the
-- future), so this costs what the endpoint's deferred backlog costs, never the delivery log.
-- The outer conditions are checked again on the locked row (a claim may take it meanwhile).
UPDATE webhook_outbox
SET created_at = now() + $3::bigint * interval '1 millisecond', deferred_reason = nullif($5::text, '')
WHERE id = ANY (ARRAY(
        SELECT id
        FROM webhook_outbox
        WHERE NOT processed
          AND created_at > now() + $3::bigint * interval '1 millisecond'
          AND coalesce('ep:' || endpoint_id::text, endpoint_url, '') = ANY ($1::text[])
          AND deferred_reason = ANY ($2::text[])
          AND (lease_until IS NULL OR lease_until < now())
        ORDER BY created_at, id
        LIMIT nullif($4::bigint, 0)
        FOR UPDATE SKIP LOCKED
    ))
  AND NOT processed
  AND created_at > now() + $3::bigint * interval '1 millisecond'
  AND deferred_reason = ANY ($2::text[])
  AND (lease_until IS NULL OR lease_until < now())
