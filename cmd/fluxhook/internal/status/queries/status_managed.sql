-- fluxhook status: every managed endpoint (webhook_endpoints) with its deliveries pending (one
-- pass over the unprocessed rows, grouped), its last success, since when it has been failing
-- and, when disabled, why. The URL is shown without its query string, which may hold a token.
WITH pending AS (
    SELECT endpoint_id, count(*) AS n
    FROM webhook_outbox
    WHERE NOT processed AND endpoint_id IS NOT NULL
    GROUP BY endpoint_id
)
SELECT e.id::text, split_part(e.url, '?', 1) || CASE WHEN e.url LIKE '%?%' THEN '?…' ELSE '' END,
       coalesce(e.tenant, ''), e.enabled, coalesce(e.disabled_reason, ''), coalesce(p.n, 0),
       e.last_success_at, e.failing_since
FROM webhook_endpoints e LEFT JOIN pending p ON p.endpoint_id = e.id
ORDER BY e.created_at, e.id
LIMIT 1000
