-- StartRecovery: a running job for endpoint $1 of tenant $2 (the endpoint's, NULL for none),
-- replaying its dead letters that failed since $3, started by $4. total counts those not yet
-- replayed, failed before now (the job's created_at: its upper bound), of the job's tenant
-- when it has one; the endpoint's index (schema 17) serves the count. Nothing is inserted, and
-- nothing returned, while a job of the endpoint is running (the unique index of schema 17):
-- StartRecovery then reads that job (recovery_running.sql).
INSERT INTO webhook_recoveries (endpoint_id, tenant, since, created_by, total)
SELECT $1::uuid, $2::text, $3::timestamptz, $4::text, count(*)
FROM webhook_dead_letter d
WHERE d.endpoint_id = $1::uuid AND d.failed_at >= $3::timestamptz AND d.failed_at < now()
  AND d.replayed_at IS NULL
  AND ($2::text IS NULL OR d.tenant = $2::text)
ON CONFLICT (endpoint_id) WHERE state = 'running' DO NOTHING
RETURNING id::text, endpoint_id::text, tenant, since, state, total, done, replayed, error, created_by, created_at,
          updated_at, finished_at
