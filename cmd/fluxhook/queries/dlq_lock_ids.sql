-- fluxhook dlq replay ID|DELIVERY-ID...: lock the dead letters named by row id ($1) or by
-- delivery id ($2) for the replay transaction, so two operators replaying the same row at once
-- cannot both re-enqueue it. superseded_by is the newest later dead letter of the same delivery
-- to the same destination (endpoint_id and endpoint_url, NULL being WEBHOOK_URL), if any: the
-- event went back to that endpoint and failed again, so replaying this older row as well would
-- send the event to it twice. The delivery_id index serves both the selection and the lookup.
-- endpoint_removed: the dead letter's managed endpoint no longer exists (endpoints remove), so
-- a replay to it would only be dead-lettered again; tenant is for --to-endpoint's check.
-- endpoint_other_tenant: the endpoint exists but its tenant was changed since (endpoints
-- update --tenant): the event never goes there again, and its current tenant is returned.
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
WHERE d.id = ANY($1::bigint[]) OR d.delivery_id = ANY($2::uuid[])
ORDER BY d.id
FOR UPDATE OF d
