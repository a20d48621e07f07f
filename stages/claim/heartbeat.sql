-- Keep this dispatcher's row (re-creating it if a peer removed it as stale) and remove rows of
-- dispatchers that stopped without unregistering, so their armed flag cannot make every
-- producer statement NOTIFY forever.
--   $1 instance id, $2 staleness in milliseconds.
WITH me AS (
    INSERT INTO webhook_dispatcher (instance_id) VALUES ($1)
    ON CONFLICT (instance_id) DO UPDATE SET seen_at = now()
)
DELETE FROM webhook_dispatcher
WHERE instance_id <> $1 AND seen_at < now() - $2::bigint * interval '1 millisecond'
