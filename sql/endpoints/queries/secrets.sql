-- Every endpoint's secrets as stored, for Reencrypt.
SELECT id::text, secret, previous_secret
FROM webhook_endpoints
ORDER BY id
