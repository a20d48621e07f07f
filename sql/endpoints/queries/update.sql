-- Apply a patch to one endpoint ($1). $2 names the columns the patch sets; the others are
-- left as they are, so that two operators changing different fields do not undo each other.
-- Guarded by the scheme and headers Update read ($3, $4; see state.sql).
--   $5 url, $6 description, $7 tenant (NULL: none), $8 event types, $9 retry rps and
--   $10 max concurrency (NULL: the dispatcher's default), $11 headers, $12 scheme,
--   $13 a new secret as stored (NULL: keep the secret). A new secret comes only with a scheme
--   change, and drops the previous secret: that one belongs to the other scheme, which the
--   consumer no longer verifies. $14 ordering, $15 ordering_failure, $16 permanent statuses
--   (NULL: the dispatcher's WEBHOOK_PERMANENT_STATUSES), $17 restricted (schema 18: set with
--   the URL by whoever wrote it, a tenant or the operator).
--
-- A tenant change moves the endpoint's pending deliveries (routed under the old tenant) to the
-- dead-letter table, reason 'endpoint tenant changed', in the same statement, by remove's
-- 'dead-letter' CTEs (dead_letter.sql): an event never goes to an endpoint of another tenant,
-- and the dead letters can be replayed to an endpoint of their own tenant (dlq replay
-- --to-endpoint). A row parked by a stopped ordered stream (created_at 'infinity') is settled
-- without a second dead letter. Returns the endpoint's id and how many deliveries were
-- dead-lettered.
WITH updated AS (
UPDATE webhook_endpoints
SET url = CASE WHEN 'url' = ANY ($2::text[]) THEN $5::text ELSE url END,
    description = CASE WHEN 'description' = ANY ($2::text[]) THEN $6::text ELSE description END,
    tenant = CASE WHEN 'tenant' = ANY ($2::text[]) THEN $7::text ELSE tenant END,
    event_types = CASE WHEN 'event_types' = ANY ($2::text[]) THEN $8::text[] ELSE event_types END,
    retry_rps = CASE WHEN 'retry_rps' = ANY ($2::text[]) THEN $9::integer ELSE retry_rps END,
    max_concurrency = CASE WHEN 'max_concurrency' = ANY ($2::text[]) THEN $10::integer ELSE max_concurrency END,
    headers = CASE WHEN 'headers' = ANY ($2::text[]) THEN $11::jsonb ELSE headers END,
    scheme = CASE WHEN 'scheme' = ANY ($2::text[]) THEN $12::text ELSE scheme END,
    ordering = CASE WHEN 'ordering' = ANY ($2::text[]) THEN $14::text ELSE ordering END,
    ordering_failure = CASE WHEN 'ordering_failure' = ANY ($2::text[]) THEN $15::text ELSE ordering_failure END,
    permanent_statuses = CASE WHEN 'permanent_statuses' = ANY ($2::text[]) THEN $16::integer[] ELSE permanent_statuses END,
    restricted = CASE WHEN 'restricted' = ANY ($2::text[]) THEN $17::boolean ELSE restricted END,
    -- A new tenant starts with no health: the old tenant's last delivery time is not its to
    -- read, and the old tenant's failures must not count towards disabling it.
    last_success_at = CASE WHEN 'tenant' = ANY ($2::text[]) AND $7::text IS DISTINCT FROM tenant THEN NULL ELSE last_success_at END,
    failing_since = CASE WHEN 'tenant' = ANY ($2::text[]) AND $7::text IS DISTINCT FROM tenant THEN NULL ELSE failing_since END,
    secret = coalesce($13::text, secret),
    previous_secret = CASE WHEN $13::text IS NULL THEN previous_secret END,
    previous_secret_expires_at = CASE WHEN $13::text IS NULL THEN previous_secret_expires_at END
WHERE id = $1::uuid AND scheme = $3::text AND headers = $4::jsonb
RETURNING id AS endpoint, tenant AS new_tenant
), unparked AS (
    -- An endpoint that stops ordering its streams lets the rows parked behind their streams'
    -- heads ('behind its stream', which the dispatcher parks) go: they go on without order, at
    -- once, as the rows left due do. (Rows the tenant change below dead-letters are not
    -- touched: one statement may not write a row twice.)
    UPDATE webhook_outbox o
    SET created_at = now(), deferred_reason = NULL
    FROM updated u
    WHERE 'ordering' = ANY ($2::text[]) AND $14::text IS DISTINCT FROM 'stream'
      AND o.endpoint_id = u.endpoint AND NOT o.processed AND o.tenant IS NOT DISTINCT FROM u.new_tenant
      AND o.deferred_reason = 'behind its stream' AND o.created_at > now()
), settled AS (
    DELETE FROM webhook_outbox
    USING updated
    WHERE endpoint_id = updated.endpoint AND NOT processed AND tenant IS DISTINCT FROM updated.new_tenant
    RETURNING {{template "settled_columns"}}
), {{template "dead_letter" "endpoint tenant changed"}}
SELECT endpoint::text, (SELECT count(*) FROM dead) FROM updated
