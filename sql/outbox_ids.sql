-- What ordered delivery's hold-back needs of the outbox's ids (see outbox_ids.go): the identity sequence's cache (above 1, a session draws ids ahead and
-- inserts them later, while the hold-back counts an id up to the sequence's last value as
-- taken by a session that holds the outbox's lock), and the ordered rows whose key is beyond
-- the sequence's last value (an id a producer supplied itself), which never pass the hold-back
-- until the sequence reaches them. One scan of the queue, made once a minute while something
-- is ordered.
SELECT s.seqcache,
       (SELECT count(*) FROM webhook_outbox o
        WHERE NOT o.processed
          AND coalesce(o.order_key, CASE WHEN o.stream_id IS NOT NULL THEN o.id END)
              > coalesce(pg_sequence_last_value(s.seqrelid), 0))
FROM pg_sequence s
WHERE s.seqrelid = pg_get_serial_sequence('webhook_outbox', 'id')::regclass
