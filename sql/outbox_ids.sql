-- What ordered delivery's hold-back needs of the outbox's ids (see outbox_ids.go): the identity
-- sequence's cache (above 1, a session draws ids ahead and inserts them later, while the
-- hold-back counts an id up to the sequence's last value as taken by a session that holds the
-- outbox's lock), and the ordered rows whose key is beyond the sequence's last value (an id a
-- producer supplied itself), which never pass the hold-back until the sequence reaches them.
-- One scan of the queue, made once a minute while something is ordered. The last value is
-- read through webhook_outbox_horizon() (schema 12: it runs as the schema owner), so a role
-- without a grant on the sequence can check.
WITH last AS (
    SELECT pg_catalog.split_part(webhook_outbox_horizon(), ':', 1)::bigint AS value
)
SELECT s.seqcache,
       (SELECT count(*) FROM webhook_outbox o
        WHERE NOT o.processed
          AND coalesce(o.order_key, CASE WHEN o.stream_id IS NOT NULL THEN o.id END) > (SELECT value FROM last))
FROM pg_sequence s
WHERE s.seqrelid = pg_get_serial_sequence('webhook_outbox', 'id')::regclass
