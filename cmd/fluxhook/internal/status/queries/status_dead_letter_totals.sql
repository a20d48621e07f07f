-- fluxhook status: how many dead letters exist, and how many have never been replayed.
SELECT count(*), count(*) FILTER (WHERE replayed_at IS NULL)
FROM webhook_dead_letter
