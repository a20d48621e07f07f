-- What `endpoints show` adds to an endpoint ($1): its secrets as stored (to tell sealed from
-- clear, never printed), whether the previous secret is still in its grace (as the dispatcher
-- decides it: an expiry ahead; one without an expiry never signs), and how many deliveries
-- to it are pending, and how many of its ordered streams are stopped at a dead letter (each
-- has one head parked at 'infinity', schema 6).
SELECT e.secret, e.previous_secret,
       e.previous_secret IS NOT NULL AND e.previous_secret_expires_at > clock_timestamp(),
       (SELECT count(*) FROM webhook_outbox o WHERE o.endpoint_id = e.id AND NOT o.processed),
       (SELECT count(*) FROM webhook_outbox o WHERE o.endpoint_id = e.id AND NOT o.processed
          AND o.created_at = 'infinity' AND o.deferred_reason LIKE 'stream stopped%')
FROM webhook_endpoints e
WHERE e.id = $1::uuid
