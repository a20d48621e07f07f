-- One page of endpoints for the management API, oldest first (created_at, id: stable while
-- endpoints are added), with their secrets as stored (the caller opens them, and never shows
-- them). $1 is the caller's tenant scope (NULL: an admin key, every tenant); $2 a tenant to
-- filter by (NULL: any); $3 enabled or not (NULL: both); $4/$5 the last row of the previous
-- page (NULL: the first page); $6 the page size. A created_at SQL set to ±infinity is ordered
-- and compared as the time it is read as (endpoints.finite), or a cursor at 'infinity' would
-- return its own row again, a client paging forever.
SELECT id::text, url, description, tenant, event_types, scheme, secret, previous_secret,
       previous_secret_expires_at, enabled, disabled_at, disabled_reason, retry_rps,
       max_concurrency, headers, last_success_at, failing_since, created_at, updated_at,
       ordering, ordering_failure, permanent_statuses, restricted
FROM webhook_endpoints
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::text IS NULL OR tenant = $2)
  AND ($3::boolean IS NULL OR enabled = $3)
  AND ($4::timestamptz IS NULL OR (least(greatest(created_at, '0001-01-01 00:00:01+00'), '9999-12-31 23:59:59+00'), id) > ($4, $5::uuid))
ORDER BY least(greatest(created_at, '0001-01-01 00:00:01+00'), '9999-12-31 23:59:59+00'), id
LIMIT $6
