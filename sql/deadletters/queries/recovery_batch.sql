-- A batch of RunRecovery: the next dead letters of endpoint $1 that failed since $2 and before
-- the job started ($3), after the job's cursor ($4, $5) in (failed_at, id) order, at most $7
-- of them; of the job's tenant ($6) when it has one. Oldest first, as they failed. Read
-- without locks: Replay locks them, and then skips those another replay (another job, an
-- operator) dealt with meanwhile.
--
-- A dead letter replayed before the job started was not counted in its total and is not
-- read; one replayed since is, so that it counts as done: another job got to it first.
SELECT d.id, d.failed_at
FROM webhook_dead_letter d
WHERE d.endpoint_id = $1::uuid AND d.failed_at >= $2::timestamptz AND d.failed_at < $3::timestamptz
  AND (d.failed_at, d.id) > ($4::timestamptz, $5::bigint)
  AND (d.replayed_at IS NULL OR d.replayed_at >= $3::timestamptz)
  AND ($6::text IS NULL OR d.tenant = $6::text)
ORDER BY d.failed_at, d.id
LIMIT $7::bigint
