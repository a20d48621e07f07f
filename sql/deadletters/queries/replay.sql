-- Replay: re-enqueue locked dead letters ($1, locked by lock.sql in this transaction) as first
-- attempts of the same event (same delivery_id, payload, endpoint and enqueued_at, so consumers
-- deduplicate it and latency stays end to end), due now, and mark them replayed. One
-- statement, so the wake-up trigger fires once. A managed endpoint's dead letter goes back to
-- that endpoint (endpoint_id), marked routed so that it is not fanned out again; so does an
-- event that went to WEBHOOK_URL after being routed. $2, when set, is the managed endpoint the
-- dead letters go to instead (Options.ToEndpoint, `dlq replay --to-endpoint`: Replay checked
-- it exists, is enabled and has each event's tenant), and $3 whether that endpoint orders
-- streams: the order key is kept only if it does.
--
-- A dead letter without an order key whose destination orders streams (ToEndpoint names one
-- that does, or its own endpoint was switched to ordering since) gets its new row's id as its
-- key: it goes after the stream's events enqueued before the replay. Returns the number of
-- outbox rows written and the ids of those that need that key.
--
-- Ordered delivery (schema 6). The new row keeps the dead letter's order_key, so that a
-- replayed event of an ordered stream takes its place in the stream again instead of going
-- after the events that followed it. A dead letter whose stream stopped (ordering_failure
-- 'stop') left its own outbox row (outbox_id) undelivered, parked at 'infinity' with a
-- deferred_reason 'stream stopped: ...', holding back the rest of its stream: that row is
-- moved to the delivery log in the same statement, so that the stream is released exactly
-- when its event is back in it, and the new row, with the same key, is the stream's head. The
-- parked row keeps created_at 'infinity', which tells it apart in the delivery log. outbox_id
-- is no foreign key (dead letters outlive their rows, and SQL may write anything there), so
-- the delivery_id must match too: only the dead letter's own row is ever settled.
-- A row that keeps its key is marked deferred_reason 'rejoined': back in its place, which may
-- be before a request of its stream already in flight (a stream that went on past its dead
-- letter), it waits for that request to settle (claim.sql), so that the stream's requests
-- stay one at a time.
WITH replayed AS (
    UPDATE webhook_dead_letter
    SET replayed_at = now()
    WHERE id = ANY($1::bigint[])
    RETURNING id, outbox_id, delivery_id, stream_id, event_type, payload, endpoint_url, enqueued_at, tenant,
              endpoint_id, order_key
), resumed AS (
    DELETE FROM webhook_outbox o
    USING replayed r
    WHERE o.id = r.outbox_id AND o.delivery_id = r.delivery_id AND NOT o.processed
      AND o.deferred_reason LIKE 'stream stopped%'
      -- Sent elsewhere (ToEndpoint), the event does not come back to this stream: it
      -- stays stopped until its dead letter is purged (or replayed to it).
      AND ($2::uuid IS NULL OR $2::uuid = o.endpoint_id)
    RETURNING o.id, o.stream_id, o.event_type, o.payload, o.created_at, o.delivery_id, o.attempt, o.enqueued_at,
              o.endpoint_url, o.tenant, o.endpoint_id, o.routed_at, o.order_key, r.id AS dead_letter_id
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
           now(), 'stream stopped here; dead letter ' || dead_letter_id || ' was replayed as a new row',
           tenant, endpoint_id, routed_at, order_key
    FROM resumed
), inserted AS (
    INSERT INTO webhook_outbox
        (delivery_id, stream_id, event_type, payload, endpoint_url, enqueued_at, attempt, created_at,
         tenant, endpoint_id, routed_at, order_key, deferred_reason)
    SELECT delivery_id, stream_id, event_type, payload, CASE WHEN $2::uuid IS NULL THEN endpoint_url END,
           enqueued_at, 1, now(), tenant, coalesce($2::uuid, endpoint_id),
           CASE WHEN $2::uuid IS NOT NULL OR endpoint_id IS NOT NULL OR endpoint_url IS NULL THEN now() END,
           CASE WHEN order_key IS NOT NULL AND ($2::uuid IS NULL OR $3::boolean) THEN order_key END,
           -- 'rejoined': back in its place, it waits for a request of its stream in flight (claim.sql).
           CASE WHEN order_key IS NOT NULL AND ($2::uuid IS NULL OR $3::boolean) THEN 'rejoined' END
    -- Rows are numbered in the order of the events' enqueue times (then of their dead letters):
    -- several events of one stream replayed together keep that order when their ids become
    -- their keys (below).
    FROM (SELECT * FROM replayed ORDER BY enqueued_at, id) r
    -- Never across tenants, ToEndpoint included (Replay checks it too; a row refused here
    -- makes the count differ, and Replay fails, for its caller to roll back).
    WHERE $2::uuid IS NULL
       OR tenant IS NOT DISTINCT FROM (SELECT e.tenant FROM webhook_endpoints e WHERE e.id = $2::uuid)
    RETURNING id, order_key, stream_id, endpoint_id
)
-- The rows that need a key: no place in their stream to go back to (their endpoint did not
-- order streams when they failed), but a destination that orders streams now. Each takes its
-- own id as its key, set by Replay in the same transaction (key_joined.sql) (a statement cannot update
-- the rows it inserts): it joins its stream at the end there, as an event enqueued now would,
-- instead of overtaking the stream's waiting events. An id, not a nextval of its own, so that
-- replaying needs no grant on the sequence.
SELECT count(*),
       coalesce(array_agg(i.id ORDER BY i.id) FILTER (
           WHERE i.order_key IS NULL AND i.stream_id IS NOT NULL
             AND (SELECT e.ordering = 'stream' FROM webhook_endpoints e WHERE e.id = i.endpoint_id)), '{}')
FROM inserted i
