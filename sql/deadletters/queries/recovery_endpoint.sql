-- StartRecovery and each batch of RunRecovery: the endpoint to recover ($1), if it exists and
-- is of the caller's tenant ($2, when set; another tenant's endpoint is not found, as a
-- missing one), and whether it is enabled. Locked (FOR SHARE) for the rest of the
-- transaction: a batch's replays go to an endpoint that is still there, enabled and of its
-- tenant when they commit.
SELECT tenant, enabled
FROM webhook_endpoints
WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2::text)
FOR SHARE
