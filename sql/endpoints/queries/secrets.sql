-- Every endpoint's secrets and headers as stored, for Reencrypt.
SELECT id::text, secret, previous_secret, headers::text
FROM webhook_endpoints
ORDER BY id
