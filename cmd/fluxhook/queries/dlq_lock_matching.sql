-- fluxhook dlq replay --all-matching: lock every dead letter matching the filters (the same
-- filters as dlq list, $1..$5; the command requires at least one to be set). superseded_by,
-- tenant and endpoint_removed as in dlq_lock_ids.sql.
SELECT d.id, d.delivery_id::text, d.event_type, d.replayed_at, d.endpoint_id::text,
       (SELECT max(n.id) FROM webhook_dead_letter n
        WHERE n.delivery_id = d.delivery_id AND n.id > d.id
          AND n.endpoint_id IS NOT DISTINCT FROM d.endpoint_id
          AND n.endpoint_url IS NOT DISTINCT FROM d.endpoint_url) AS superseded_by,
       d.tenant,
       d.endpoint_id IS NOT NULL
         AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.endpoint_id) AS endpoint_removed
       , e.id IS NOT NULL AND e.tenant IS DISTINCT FROM d.tenant AS endpoint_other_tenant, e.tenant
FROM webhook_dead_letter d
-- Locked against a tenant change until the replay commits: an event replayed to its own
-- endpoint goes only while that endpoint is still of the event's tenant.
LEFT JOIN LATERAL (SELECT id, tenant FROM webhook_endpoints e WHERE e.id = d.endpoint_id FOR SHARE) e ON true
WHERE ($1::text IS NULL OR d.event_type = $1)
  AND ($2::text IS NULL OR strpos(lower(d.reason), lower($2)) > 0)
  AND ($3::bigint IS NULL OR d.failed_at > now() - $3 * interval '1 microsecond')
  AND ($4::uuid IS NULL OR d.delivery_id = $4)
  AND ($5::uuid IS NULL OR d.endpoint_id = $5)
ORDER BY d.id
FOR UPDATE OF d
