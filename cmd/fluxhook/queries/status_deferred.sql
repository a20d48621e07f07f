-- fluxhook status: rows the gate is holding back (open circuit, probe in flight, retry rate
-- limit), by the reason stored on the row when it was deferred, with the soonest time one of
-- them comes due again.
SELECT deferred_reason, count(*), coalesce(extract(epoch FROM min(created_at) - now()), 0)::float8
FROM webhook_outbox
WHERE NOT processed AND created_at > now() AND deferred_reason IS NOT NULL
GROUP BY deferred_reason
ORDER BY count(*) DESC, deferred_reason
