-- fluxhook status: the registered dispatcher instances and how long since each was seen.
SELECT instance_id, armed, started_at, seen_at,
       extract(epoch FROM now() - seen_at)::float8
FROM webhook_dispatcher
ORDER BY instance_id
