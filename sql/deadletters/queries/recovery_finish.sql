-- RunRecovery's end of a job ($1): state $2, done or failed, with the error $3 for failed. Only
-- a running job ends: a job ended by another process stays as that one left it.
UPDATE webhook_recoveries
SET state = $2::text, error = $3::text, finished_at = now(), updated_at = now()
WHERE id = $1::uuid AND state = 'running'
