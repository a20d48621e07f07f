-- The endpoints whose ids are in $1, with their secrets as stored (load.sql's columns).
SELECT id::text, url, description, tenant, event_types, scheme, secret, previous_secret,
       previous_secret_expires_at, enabled, disabled_at, disabled_reason, retry_rps,
       max_concurrency, headers, last_success_at, failing_since, created_at, updated_at,
       ordering, ordering_failure, permanent_statuses, restricted
FROM webhook_endpoints
WHERE id = ANY ($1::uuid[])
ORDER BY created_at, id
