-- When the next row becomes claimable: the earliest future due time, or the earliest expiring
-- lease among due rows (a crashed dispatcher's rows). Both scans stay inside the partial index
-- of unprocessed rows; the second only covers rows that are due, which are few when idle.
SELECT least(
    (SELECT min(created_at) FROM webhook_outbox WHERE NOT processed AND created_at > now()),
    (SELECT min(lease_until) FROM webhook_outbox
      WHERE NOT processed AND created_at <= now() AND lease_until >= now())
) - now()
