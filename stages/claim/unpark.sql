-- Release the rows parked 'behind its stream' that now lead their stream for their endpoint:
-- the head they were parked behind left (delivered, dead-lettered, removed) in a way that did
-- not release them, as when it settled while a park that had read it (park.sql, route.sql)
-- was committing: the settle's release (settle.sql's successor) could not see the row parked
-- yet. Such a row is the one every later row of its stream waits for: due now, it goes, and
-- its delivery releases the next. $1 how many of the soonest due future rows are looked at
-- (a row further out comes due within the hour any park is capped at).
-- Released wrongly (a smaller key appeared meanwhile), a row is only due: claims still hold it
-- behind its head.
UPDATE webhook_outbox o
SET created_at = now(), deferred_reason = NULL
WHERE o.id = ANY (ARRAY(
        -- Of the parked rows among them, only the first of each stream and endpoint can lead
        -- it: one look per stream, not per row (20,000 rows parked behind 50 heads took
        -- 41-97 ms a pass looked at one by one).
        SELECT r.id
        FROM (SELECT DISTINCT ON (stream_id, key) id, stream_id, key, k
              FROM (SELECT id, stream_id, coalesce('ep:' || endpoint_id::text, endpoint_url, '') AS key,
                           coalesce(order_key, id) AS k, deferred_reason
                    FROM webhook_outbox
                    WHERE NOT processed AND created_at > now()
                    ORDER BY created_at, id
                    LIMIT $1) f
              WHERE deferred_reason = 'behind its stream' AND stream_id IS NOT NULL
              ORDER BY stream_id, key, k) r
        WHERE NOT EXISTS (
              SELECT 1 FROM webhook_outbox h
              WHERE h.stream_id = r.stream_id AND NOT h.processed
                AND coalesce('ep:' || h.endpoint_id::text, h.endpoint_url, '') = r.key
                AND coalesce(h.order_key, h.id) < r.k)))
  AND o.processed IS NOT TRUE AND o.deferred_reason = 'behind its stream' AND o.created_at > now()
