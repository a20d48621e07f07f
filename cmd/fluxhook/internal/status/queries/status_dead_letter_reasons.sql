-- fluxhook status: the ten most frequent dead-letter reasons.
SELECT reason, count(*), count(*) FILTER (WHERE replayed_at IS NULL)
FROM webhook_dead_letter
GROUP BY reason
ORDER BY count(*) DESC, reason
LIMIT 10
