-- Purge: delete dead letters named by row id (@ids) or delivery id (@delivery_ids), or those
-- matching a Filter (filter.sql); either way only those already replayed with ReplayedOnly,
-- and only the caller's tenant's with @scope. The callers refuse an empty filter without
-- ReplayedOnly: it would delete everything. Returns each deleted row's id and delivery id.
--
-- A dead letter whose ordered stream stopped (ordering_failure 'stop', schema 6) left its own
-- outbox row (outbox_id, same delivery_id) undelivered, parked at 'infinity' with a
-- deferred_reason 'stream stopped: ...', holding back the rest of its stream until the dead
-- letter is replayed or purged. Purging it is the operator giving up on the event: the parked
-- row is moved to the delivery log in the same statement, and the stream goes on with its next
-- event (the row is matched by delivery_id too, as in replay.sql). The dispatchers are
-- then woken as a producer's insert wakes them, since the rows behind are due already and
-- nothing else would tell an idle dispatcher before its backstop poll. The NOTIFY is delivered
-- at commit, so a dry run (rolled back) neither releases nor wakes anything.
WITH purged AS (
    DELETE FROM webhook_dead_letter d
    WHERE
    {{- if .ByRef}} (d.id = ANY (@ids::bigint[]) OR d.delivery_id = ANY (@delivery_ids::uuid[])){{if .Scope}} AND d.tenant = @scope{{end}}
    {{- else}} true{{template "filter" .}}
    {{- end}}
    {{- if .PurgeReplayedOnly}} AND d.replayed_at IS NOT NULL{{end}}
    RETURNING d.id, d.delivery_id, d.outbox_id
), resumed AS (
    DELETE FROM webhook_outbox o
    USING purged p
    WHERE o.id = p.outbox_id AND o.delivery_id = p.delivery_id AND NOT o.processed
      AND o.deferred_reason LIKE 'stream stopped%'
    RETURNING o.id, o.stream_id, o.event_type, o.payload, o.created_at, o.delivery_id, o.attempt, o.enqueued_at,
              o.endpoint_url, o.tenant, o.endpoint_id, o.routed_at, o.order_key, p.id AS dead_letter_id
), unparked AS (
    -- The rows parked behind the stopped row ('behind its stream', settle.sql) come due now:
    -- the stream goes on from here.
    UPDATE webhook_outbox o
    SET created_at = now(), deferred_reason = NULL
    FROM resumed r
    WHERE o.stream_id = r.stream_id AND o.stream_id IS NOT NULL AND NOT o.processed
      AND coalesce('ep:' || o.endpoint_id::text, o.endpoint_url, '') = coalesce('ep:' || r.endpoint_id::text, r.endpoint_url, '')
      AND coalesce(o.order_key, o.id) > coalesce(r.order_key, r.id)
      AND o.deferred_reason = 'behind its stream' AND o.created_at > now()
      -- Never across tenants: two tenants' events to one destination under one stream id share
      -- a stream for the dispatcher, and an action on one's dead letter writes no other's rows.
      AND o.tenant IS NOT DISTINCT FROM r.tenant
), logged AS (
    INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
                                      enqueued_at, endpoint_url, processed_at, error, tenant, endpoint_id,
                                      routed_at, order_key)
    SELECT id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, endpoint_url,
           now(), 'stream stopped here; dead letter ' || dead_letter_id
                  || ' was purged: the stream went on without the event',
           tenant, endpoint_id, routed_at, order_key
    FROM resumed
), woken AS (
    SELECT pg_notify('webhook_outbox', pg_current_xact_id()::text)
    WHERE EXISTS (SELECT 1 FROM resumed)
)
-- A plain WITH query runs only if read: this one-row condition reads woken.
SELECT id, delivery_id::text
FROM purged
WHERE (SELECT count(*) FROM woken) >= 0
ORDER BY id
