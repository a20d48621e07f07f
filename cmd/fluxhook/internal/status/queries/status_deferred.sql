-- fluxhook status: rows the gate is holding back (open circuit, probe in flight, retry rate
-- limit) and ordered rows parked behind their stream's head ('behind its stream', settle.sql),
-- by the reason stored on the row when it was deferred, with the soonest time one of
-- them comes due again. The heads of ordered streams stopped behind a dead letter (schema 6:
-- parked at 'infinity', due at no time) are counted under one reason, with -1 for the due time.
SELECT CASE WHEN created_at = 'infinity' THEN 'ordered stream stopped at a dead letter (replay or purge it)'
            ELSE deferred_reason END AS reason,
       count(*),
       coalesce(extract(epoch FROM min(created_at) FILTER (WHERE created_at < 'infinity') - now()), -1)::float8
FROM webhook_outbox
WHERE NOT processed AND created_at > now() AND deferred_reason IS NOT NULL
GROUP BY 1
ORDER BY count(*) DESC, 1
