-- fluxhook status: the registered dispatcher instances, how long since each was last seen, and
-- whether that is too long for a live one (stale). $1 is the bound in milliseconds
-- (DispatcherStaleAfter). A stale instance is not reported armed: its row's flag is what it
-- was when the instance stopped, and nothing is waiting for work on its behalf.
SELECT instance_id,
       armed AND seen_at >= now() - $1::bigint * interval '1 millisecond',
       started_at, seen_at,
       extract(epoch FROM now() - seen_at)::float8,
       seen_at < now() - $1::bigint * interval '1 millisecond'
FROM webhook_dispatcher
ORDER BY instance_id
