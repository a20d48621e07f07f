-- Replay's first statement: lock the selected dead letters for the replay's transaction, so
-- that two replays of the same row at once (two operators, two recovery jobs) cannot both
-- re-enqueue it: the second waits for the first to commit, then reads replayed_at set. The
-- rows are locked in id order, whatever selected them, so that two replays of overlapping
-- sets wait for each other instead of deadlocking.
--
-- The selection is either by reference, row ids (@ids) and delivery ids (@delivery_ids, every
-- dead letter of the event), which the delivery_id index serves, or a Filter (filter.sql). In
-- both, @scope, when set, is the caller's tenant: another tenant's rows are not selected, so
-- they read as not found.
--
-- superseded_by is the newest later dead letter of the same delivery to the same destination
-- (endpoint_id and endpoint_url, NULL being WEBHOOK_URL), if any: the event went back to that
-- endpoint and failed again, so replaying this older row as well would send the event to it
-- twice. endpoint_removed: the dead letter's managed endpoint no longer exists (endpoints
-- remove), so a replay to it would only be dead-lettered again; tenant is for the target's
-- check (Options.ToEndpoint). endpoint_other_tenant: the endpoint exists but its tenant was
-- changed since (endpoints update --tenant): the event never goes there again, and the
-- endpoint's current tenant is returned. url_too_long: its endpoint_url is longer than the
-- outbox takes (webhook_outbox_endpoint_url_length, schema 21; only a dead letter written
-- before that schema can hold one), so it cannot go back to it.
SELECT d.id, d.delivery_id::text, d.event_type, d.replayed_at, d.endpoint_id::text,
       (SELECT max(n.id) FROM webhook_dead_letter n
        WHERE n.delivery_id = d.delivery_id AND n.id > d.id
          AND n.endpoint_id IS NOT DISTINCT FROM d.endpoint_id
          AND n.endpoint_url IS NOT DISTINCT FROM d.endpoint_url) AS superseded_by,
       d.tenant,
       d.endpoint_id IS NOT NULL
         AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.endpoint_id) AS endpoint_removed,
       e.id IS NOT NULL AND e.tenant IS DISTINCT FROM d.tenant AS endpoint_other_tenant, e.tenant,
       coalesce(octet_length(d.endpoint_url) > 2048, false) AS url_too_long
FROM webhook_dead_letter d
-- Locked against a tenant change until the replay commits: an event replayed to its own
-- endpoint goes only while that endpoint is still of the event's tenant.
LEFT JOIN LATERAL (SELECT id, tenant FROM webhook_endpoints e WHERE e.id = d.endpoint_id FOR SHARE) e ON true
{{- if .ByRef}}
WHERE (d.id = ANY (@ids::bigint[]) OR d.delivery_id = ANY (@delivery_ids::uuid[])){{if .Scope}} AND d.tenant = @scope{{end}}
{{- else}}
WHERE true{{template "filter" .}}
{{- end}}
ORDER BY d.id
FOR UPDATE OF d
