-- Lease up to $1 due rows in claim order, skipping rows another dispatcher holds, and record
-- in the same statement whether this dispatcher is now armed for a NOTIFY (a claim in arming
-- mode that took less than a full batch) or not.
--   $1 limit, $2 lease in milliseconds, $3 endpoint keys to skip (saturated endpoints; '' is
--   the configured default), $4 this dispatcher's instance id, $5 whether an empty result
--   arms this dispatcher, ($6, $7) the (created_at, id) to start after: ('-infinity', 0) to
--   look from the head of the due index, or the last row of the previous full batch (see
--   Cursor in claim.go).
-- The lease commits with the statement: no transaction stays open across HTTP.
--
-- The claimed rows come back in no particular order (the caller sorts them), followed by one
-- row with id 0 that carries "next" and "snapshot". "next": when this claim arms the
-- dispatcher, how long until the next row it did not take becomes claimable (NULL: none
-- pending, or not asked). "snapshot": the statement's snapshot, against which the dispatcher
-- checks the transaction ids of NOTIFYs that arrive after the claim (schema 3): a NOTIFY
-- from a transaction the claim could already see brings nothing new.
WITH claimed AS (
    -- The ids come from an ARRAY(...) sub-select that runs once, so the update finds its rows
    -- through the primary key however many there are: the plan stays the same for every
    -- limit, and the dispatcher's sessions can use the prepared statement's generic plan
    -- instead of planning this statement on every call (see dispatcher.Start).
    UPDATE webhook_outbox o
    SET lease_until = now() + $2::bigint * interval '1 millisecond',
        leased_by = $4
    WHERE o.id = ANY (ARRAY(
        SELECT id
        FROM webhook_outbox
        WHERE NOT processed
          AND created_at <= now()
          AND (created_at, id) > ($6::timestamptz, $7::bigint)
          AND (lease_until IS NULL OR lease_until < now())
          AND NOT (coalesce(endpoint_url, '') = ANY ($3::text[]))
        ORDER BY created_at, id
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING o.id, o.delivery_id::text, coalesce(o.stream_id, ''), o.event_type, o.payload::text,
              o.attempt, o.enqueued_at, o.created_at, coalesce(o.endpoint_url, '')
), arm AS (
    -- The flag says "NOTIFY me": set by a claim made in arming mode ($5) that took less than
    -- a full batch (it saw every due row it could take, so the next one is news), cleared by
    -- any other claim. A dispatcher that keeps finding full batches, or that claims without
    -- arming for a moment after a busy spell, is not notified: producers then commit without
    -- NOTIFY's commit-time lock. Written only when the flag changes, so neither a busy
    -- dispatcher nor an idle one touches this row on every claim.
    UPDATE webhook_dispatcher
    SET armed = ($5::boolean AND (SELECT count(*) FROM claimed) < $1), seen_at = now()
    WHERE instance_id = $4
      AND armed <> ($5::boolean AND (SELECT count(*) FROM claimed) < $1)
), next AS (
    -- Asked only by a claim that arms (a busy dispatcher claims again at once and needs no
    -- timer), and answered from this statement's own snapshot: a row committed after it
    -- sends a NOTIFY, so the only rows claimable "now" here are those another session's
    -- claim holds locked (SKIP LOCKED passed them), and the answer is 0 for them. A separate
    -- statement after the claim also counted the rows committed in between, whose NOTIFYs
    -- had already woken the dispatcher: every such row cost one more, empty, claim.
    -- Otherwise the earliest future due time (one probe of the partial index), or the
    -- earliest lease expiring among the first 1,000 due rows (a crashed dispatcher's rows;
    -- leased rows sit at the head of the due index, since claims take the oldest). The head
    -- look-up is bounded on purpose: lease_until is in no index, and finding the earliest over
    -- the whole backlog scanned it all (measured: 176 ms at 100k rows). Leases further back
    -- are left to the backstop poll. The rows this statement claims still look unleased in
    -- its snapshot, hence the id filter.
    SELECT CASE WHEN $5::boolean AND (SELECT count(*) FROM claimed) < $1 THEN least(
        (SELECT min(created_at) FROM webhook_outbox WHERE NOT processed AND created_at > now()),
        (SELECT min(greatest(coalesce(lease_until, now()), now())) FROM (
            SELECT lease_until FROM webhook_outbox
            WHERE NOT processed AND created_at <= now()
              AND NOT (coalesce(endpoint_url, '') = ANY ($3::text[]))
              AND id <> ALL (ARRAY(SELECT id FROM claimed))
            ORDER BY created_at, id
            LIMIT 1000) head)
    ) - now() END AS wait, pg_current_snapshot()::text AS snapshot
)
SELECT c.*, NULL::interval, NULL::text FROM claimed c
UNION ALL
SELECT 0, '', '', '', '{}', 1, now(), now(), '', wait, snapshot FROM next
