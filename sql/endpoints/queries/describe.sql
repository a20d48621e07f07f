-- What `endpoints show` adds to an endpoint ($1): its secrets as stored (to tell sealed from
-- clear, never printed), whether the previous secret is still in its grace (as the dispatcher
-- decides it: an expiry ahead; one without an expiry never signs), and how many deliveries
-- to it are pending, and how many of its ordered streams are stopped at a dead letter (their
-- heads parked at 'infinity', schema 6), in one pass over its pending rows.
SELECT e.secret, e.previous_secret,
       e.previous_secret IS NOT NULL AND e.previous_secret_expires_at > clock_timestamp(),
       p.pending, p.stopped
FROM webhook_endpoints e,
     LATERAL (SELECT count(*) AS pending,
                     count(DISTINCT o.stream_id) FILTER (WHERE o.created_at = 'infinity'
                                                           AND o.deferred_reason LIKE 'stream stopped%') AS stopped
              FROM webhook_outbox o WHERE o.endpoint_id = e.id AND NOT o.processed) p
WHERE e.id = $1::uuid
