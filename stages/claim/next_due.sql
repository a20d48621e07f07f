-- How long until the next row becomes claimable: the earliest future due time (one probe of the
-- partial index), or the earliest lease expiring among the first 1,000 due rows (a crashed
-- dispatcher's rows; leased rows sit at the head of the due index, since claims take the
-- oldest). The lease look-up is bounded on purpose: lease_until is in no index, and finding
-- the earliest over the whole backlog scanned it all (measured: 176 ms at 100k rows). Leases
-- further back are left to the backstop poll.
SELECT least(
    (SELECT min(created_at) FROM webhook_outbox WHERE NOT processed AND created_at > now()),
    (SELECT min(lease_until) FROM (
        SELECT lease_until FROM webhook_outbox
        WHERE NOT processed AND created_at <= now()
        ORDER BY created_at, id
        LIMIT 1000) head
      WHERE lease_until >= now())
) - now()
