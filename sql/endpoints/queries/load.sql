-- Every endpoint ($1 = ''), or the one with id $1, with its secrets as stored.
SELECT id::text, url, description, tenant, event_types, scheme, secret, previous_secret,
       previous_secret_expires_at, enabled, disabled_at, disabled_reason, retry_rps,
       max_concurrency, headers, last_success_at, failing_since, created_at, updated_at,
       ordering, ordering_failure, permanent_statuses, restricted
FROM webhook_endpoints
WHERE $1 = '' OR id::text = $1
ORDER BY created_at, id
