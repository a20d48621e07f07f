-- Replay with Options.ToEndpoint: the endpoint the dead letters go to instead of their own
-- ($1), locked against removal, disabling or a tenant change until the replay commits. $2,
-- when set, is the caller's tenant: another tenant's endpoint is not found, as a missing one.
SELECT tenant, enabled, ordering = 'stream'
FROM webhook_endpoints
WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2::text)
FOR SHARE
