-- Park the ordered rows that are due but wait behind a head of their stream and endpoint that
-- is not due for a second or more (waiting for a retry, deferred by the gate, stopped at its
-- dead letter): due when it is, or in an hour if that is sooner, marked 'behind its stream', as
-- settle.sql parks the rows behind a head it sends back and route.sql a delivery it routes
-- behind one. This catches the rows neither saw: those a producer inserted while the head
-- waited (WEBHOOK_ORDERING=stream's rows are never routed), those whose hour came while their
-- head still waits, and any a race let through. Left due, every claim reads each of them and
-- looks its head up.
--   $1 whether WEBHOOK_ORDERING=stream orders the rows without a managed endpoint, $2 how many
--   of the oldest due rows are looked at (those every claim reads first).
-- Never a row another instance leases, one with another mark (replayed, stopped), or one of an
-- endpoint that no longer orders its streams. The outer conditions are checked again on the
-- row, which a claim may have taken meanwhile. A row parked behind a head that settles while
-- this statement runs is released by the next pass (unpark.sql): locking the heads read here
-- deadlocked with settles deleting them.
UPDATE webhook_outbox o
SET created_at = least(w.due, now() + interval '1 hour'), deferred_reason = 'behind its stream'
FROM (
    SELECT c.id,
           (SELECT h.created_at FROM webhook_outbox h
            WHERE h.stream_id = c.stream_id AND NOT h.processed
              AND coalesce('ep:' || h.endpoint_id::text, h.endpoint_url, '')
                    = coalesce('ep:' || c.endpoint_id::text, c.endpoint_url, '')
              AND coalesce(h.order_key, h.id) < coalesce(c.order_key, c.id)
            ORDER BY coalesce(h.order_key, h.id)
            LIMIT 1) AS due
    -- The oldest $2 due rows first, then the ordered ones among them: a limit after the filter
    -- read the whole due backlog (300,000 unordered rows: 48-64 ms a pass, parking nothing).
    FROM (SELECT id, stream_id, deferred_reason, lease_until, order_key, endpoint_id, endpoint_url, routed_at
          FROM webhook_outbox
          WHERE NOT processed AND created_at <= now()
          ORDER BY created_at, id
          LIMIT $2) c
    WHERE c.stream_id IS NOT NULL
      AND (c.deferred_reason IS NULL OR c.deferred_reason = 'behind its stream')
      AND (c.lease_until IS NULL OR c.lease_until < now())
      AND ((c.order_key IS NOT NULL AND c.endpoint_id IS NOT NULL
            AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = c.endpoint_id AND e.ordering = 'stream'))
           OR ($1::boolean AND c.endpoint_id IS NULL
               AND (c.order_key IS NOT NULL OR c.endpoint_url IS NOT NULL OR c.routed_at IS NOT NULL
                    OR NOT EXISTS (SELECT 1 FROM webhook_endpoints))))
) w
WHERE o.id = w.id AND w.due > now() + interval '1 second'
  AND NOT o.processed AND o.created_at <= now()
  AND (o.deferred_reason IS NULL OR o.deferred_reason = 'behind its stream')
  AND (o.lease_until IS NULL OR o.lease_until < now())
