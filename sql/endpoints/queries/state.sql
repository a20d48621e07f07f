-- What Update and RotateSecret decide from, read before they write: the scheme (a secret is
-- checked against it; changing it replaces the secret), the headers (added to by a merge) and
-- the secret as stored (a rotation re-seals it as the previous secret), and the tenant (a move
-- may not carry credential headers over). Their write is guarded
-- by these same values, so that a decision taken on this state is never applied over a
-- concurrent change of it. Not by updated_at: the dispatcher moves that whenever it records an
-- endpoint's successes and failures.
SELECT scheme, headers, secret, tenant
FROM webhook_endpoints
WHERE id = $1::uuid
