-- CancelRecovery: the running job $1, of tenant $2 when set, cancelled. Waits for the batch in
-- progress (it holds the job's row lock, recovery_lock.sql) to commit; the job's next batch
-- then finds it cancelled and stops. No row for a job that is not running, or not found.
UPDATE webhook_recoveries
SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2::text) AND state = 'running'
RETURNING id::text, endpoint_id::text, tenant, since, state, total, done, replayed, error, created_by, created_at,
          updated_at, finished_at
