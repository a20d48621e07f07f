-- Before a replay rejoins ordered streams ($1 the dead letters to replay, $2 the endpoint they
-- go to instead, or NULL, as replay.sql takes them): lock the undelivered rows after each one
-- in its stream, for its endpoint. A claim that is leasing one of them holds it, and this waits
-- for that claim to commit, so that the replayed row, marked 'rejoined', sees the lease and
-- waits for the request (claim.sql); a claim that starts meanwhile skips them (SKIP LOCKED), and
-- once the replay commits finds the replayed row before them. Without it, a replay committed
-- while a claim was leasing the stream's next row was sent beside it. FOR KEY SHARE: the
-- weakest lock that a claim's FOR UPDATE waits for or skips. A row already in flight (its
-- lease committed) is not locked: the replayed row sees its lease, and its settle, which waits
-- at most a second for a row lock, must not find it held for the rest of a long replay (a
-- recovery batch, a filtered replay): it was then left to its lease and sent again. A row a
-- claim is leasing is still waited for, then passed over once its lease shows.
SELECT count(*) FROM (
    SELECT 1
    FROM webhook_dead_letter d
    JOIN webhook_outbox o ON o.stream_id = d.stream_id AND NOT o.processed
     AND coalesce(o.order_key, o.id) > d.order_key
     AND o.endpoint_id IS NOT DISTINCT FROM coalesce($2::uuid, d.endpoint_id)
     AND (o.endpoint_id IS NOT NULL OR o.endpoint_url IS NOT DISTINCT FROM d.endpoint_url)
     AND (o.lease_until IS NULL OR o.lease_until < now())
    WHERE d.id = ANY ($1::bigint[]) AND d.order_key IS NOT NULL AND d.stream_id IS NOT NULL
    FOR KEY SHARE OF o
) locked
