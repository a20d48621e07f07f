-- fluxhook status: the endpoint URLs in use lately (pending rows and the last hour's
-- deliveries), whose breaker state status reads from Redis. NULL is the configured WEBHOOK_URL.
SELECT DISTINCT endpoint_url
FROM webhook_deliveries
WHERE NOT processed OR processed_at > now() - interval '1 hour'
LIMIT 1000
