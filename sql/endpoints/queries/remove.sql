-- Remove an endpoint ($1) and decide the fate of its pending deliveries (unprocessed outbox
-- rows with its endpoint_id) by $2:
--   'refuse'       remove nothing if any is pending;
--   'dead-letter'  settle them as the dispatcher settles a dead letter (moved to the delivery
--                  log, with the reason in error) and copy them to webhook_dead_letter, reason 'endpoint removed',
--                  with their order keys as the dispatcher's dead letters keep them. A row parked
--                  by an ordered stream that stopped (schema 6: created_at 'infinity') is settled
--                  but not copied: it has its dead letter already, and a second one would have
--                  the event replayed twice (the CTEs of dead_letter.sql, which update.sql shares);
--   'drop'         delete them.
-- One statement, so that the check, the deliveries and the endpoint change together. Locking
-- the endpoint row makes a concurrent update or rotation wait. A row that a dispatcher settles
-- meanwhile is re-checked by PostgreSQL (gone from the queue) and left to the dispatcher; one that is
-- mid-attempt is settled here, and the dispatcher's later, fenced settle of it finds nothing
-- to write. Returns: whether the endpoint existed, the pending count seen, the rows
-- dead-lettered, the rows dropped, and whether the endpoint was deleted.
WITH target AS (
    SELECT id FROM webhook_endpoints WHERE id = $1::uuid FOR UPDATE
), pending AS (
    SELECT count(*) AS n FROM webhook_outbox WHERE endpoint_id = $1::uuid AND NOT processed
), decision AS (
    SELECT EXISTS (SELECT 1 FROM target) AND ($2::text <> 'refuse' OR (SELECT n FROM pending) = 0) AS ok
), settled AS (
    DELETE FROM webhook_outbox
    WHERE endpoint_id = $1::uuid AND NOT processed AND $2::text = 'dead-letter' AND (SELECT ok FROM decision)
    RETURNING {{template "settled_columns"}}
), {{template "dead_letter" "endpoint removed"}}, dropped AS (
    DELETE FROM webhook_outbox
    WHERE endpoint_id = $1::uuid AND NOT processed AND $2::text = 'drop' AND (SELECT ok FROM decision)
    RETURNING 1
), removed AS (
    DELETE FROM webhook_endpoints
    WHERE id IN (SELECT id FROM target) AND (SELECT ok FROM decision)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM target), (SELECT n FROM pending), (SELECT count(*) FROM dead),
       (SELECT count(*) FROM dropped), EXISTS (SELECT 1 FROM removed)
