-- Add one endpoint and return it in load.sql's columns, so that scan reads it.
--   $1 url, $2 description, $3 tenant (NULL: none), $4 event-type filter, $5 scheme,
--   $6 secret as stored (sealed, or in clear without a key), $7 enabled, $8 retry rps and
--   $9 max concurrency (NULL: the dispatcher's default), $10 headers (a JSON object, its
--   values as stored), $11 ordering and $12 ordering_failure (Add has put the defaults in for
--   ""), $13 the id (made by Add: the sealed secret and header values are bound to it),
--   $14 permanent statuses (NULL: the dispatcher's WEBHOOK_PERMANENT_STATUSES), $15 restricted
--   (the URL is a tenant's: dialled under the row-URL policy, schema 18).
-- An endpoint added disabled gets a reason, so that list and show say why it sends nothing.
INSERT INTO webhook_endpoints (id, url, description, tenant, event_types, scheme, secret, enabled,
                               disabled_at, disabled_reason, retry_rps, max_concurrency, headers,
                               ordering, ordering_failure, permanent_statuses, restricted)
VALUES ($13::uuid, $1::text, $2::text, $3::text, $4::text[], $5::text, $6::text, $7::boolean,
        CASE WHEN NOT $7::boolean THEN clock_timestamp() END,
        CASE WHEN NOT $7::boolean THEN 'added disabled' END,
        $8::integer, $9::integer, $10::jsonb, $11::text, $12::text, $14::integer[], $15::boolean)
RETURNING id::text, url, description, tenant, event_types, scheme, secret, previous_secret,
          previous_secret_expires_at, enabled, disabled_at, disabled_reason, retry_rps,
          max_concurrency, headers, last_success_at, failing_since, created_at, updated_at,
          ordering, ordering_failure, permanent_statuses, restricted
