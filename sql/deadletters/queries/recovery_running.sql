-- StartRecovery, when its insert met a running job of endpoint $1: that job's id and tenant.
-- No row when it ended meanwhile (StartRecovery then tries again).
SELECT id::text, tenant
FROM webhook_recoveries
WHERE endpoint_id = $1::uuid AND state = 'running'
