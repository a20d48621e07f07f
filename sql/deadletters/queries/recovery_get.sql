-- GetRecovery: a job by id ($1). $2, when set, is the caller's tenant: another tenant's job is
-- not found, as a missing one.
SELECT id::text, endpoint_id::text, tenant, since, state, total, done, replayed, error, created_by, created_at,
       updated_at, finished_at
FROM webhook_recoveries
WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2::text)
