-- Record what one settled batch says about managed endpoints: $1 endpoint ids, $2 per endpoint
-- 1 a success (last_success_at now, no longer failing), 2 a failure (failing since now, unless
-- already), 3 a 410 Gone (disabled with the reason, as the Standard Webhooks specification asks),
-- $3 and $4 the URL and tenant (NULL: none) the endpoint had when the request was made. An
-- outcome is recorded only while the endpoint still has both: recorded later (the record waited
-- for the row), a 410 from a URL since replaced disabled the new one, and a success from before
-- a move to another tenant showed the new tenant the old one's delivery time.
-- Returns the ids of endpoints this statement disabled, so that the caller logs it once and
-- dead-letters their pending deliveries.
--
-- The rows to change are locked first, in the order of their ids: two instances recording the
-- same endpoints in different orders deadlocked, and PostgreSQL aborted one's record.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::smallint[], $3::text[], $4::text[]) AS t(id, result, url, tenant)
), locked AS (
    SELECT e.id
    FROM webhook_endpoints e JOIN input i ON e.id = i.id
    -- Only real changes: a healthy endpoint's success every batch would bump the endpoints'
    -- version (and every dispatcher's cache) for nothing; a success is written at most once
    -- a minute. Checked again on the row's latest version once it is locked, so that the
    -- update below needs no check of its own.
    WHERE e.url = i.url AND e.tenant IS NOT DISTINCT FROM i.tenant
      AND (i.result = 3 AND e.enabled
           OR i.result = 2 AND e.failing_since IS NULL
           OR i.result = 1 AND (e.failing_since IS NOT NULL OR e.last_success_at IS NULL
                                OR e.last_success_at < now() - interval '1 minute'))
    ORDER BY e.id
    FOR NO KEY UPDATE OF e
)
UPDATE webhook_endpoints e
SET last_success_at = CASE WHEN i.result = 1 THEN now() ELSE e.last_success_at END,
    failing_since = CASE WHEN i.result = 1 THEN NULL ELSE coalesce(e.failing_since, now()) END,
    enabled = e.enabled AND i.result <> 3,
    disabled_at = CASE WHEN i.result = 3 AND e.enabled THEN now() ELSE e.disabled_at END,
    disabled_reason = CASE WHEN i.result = 3 AND e.enabled THEN 'the endpoint answered 410 Gone' ELSE e.disabled_reason END
FROM input i
WHERE e.id = ANY (ARRAY(SELECT id FROM locked)) AND e.id = i.id
RETURNING e.id::text, i.result = 3 AND NOT e.enabled
