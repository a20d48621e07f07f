-- How long until the next row becomes claimable: 0 when a row is claimable already (it came
-- due between the caller's claim and this statement: without this, nothing would wake the
-- dispatcher for it), else the earliest future due time (one probe of the partial index) or
-- the earliest lease expiring among the first 1,000 due rows (a crashed dispatcher's rows;
-- leased rows sit at the head of the due index, since claims take the oldest). The head
-- look-up is bounded on purpose: lease_until is in no index, and finding the earliest over the
-- whole backlog scanned it all (measured: 176 ms at 100k rows). Leases further back are left
-- to the backstop poll.
--   $1 endpoint keys to leave out (saturated endpoints: freed capacity wakes the dispatcher
--   for them; '' is the configured default).
SELECT least(
    (SELECT min(created_at) FROM webhook_outbox WHERE NOT processed AND created_at > now()),
    (SELECT min(greatest(coalesce(lease_until, now()), now())) FROM (
        SELECT lease_until FROM webhook_outbox
        WHERE NOT processed AND created_at <= now()
          AND NOT (coalesce(endpoint_url, '') = ANY ($1::text[]))
        ORDER BY created_at, id
        LIMIT 1000) head)
) - now()
