-- fluxhook status: the outbox at a glance, in one scan of the unprocessed rows (the partial
-- index's rows) plus the last hour of the delivery log (webhook_deliveries: the log's newest
-- partitions, and rows settled in place before schema 7). A row is in the backlog when it is due
-- and no live lease holds it: an expired lease is waiting to be claimed again. The oldest
-- undelivered age counts from the first enqueue of anything not yet delivered, scheduled
-- retries and deferred rows included: a consumer outage shows there even while the backlog
-- is empty (every retry waiting for its time). The last hour's log rows are counted up to $1
-- only: at 10,000 events/s an hour is 36 million rows, which no status call should read.
WITH last_hour AS (
    -- At most $1 of the last hour's settled rows, whichever the scan meets first: the
    -- processed count, and among them the events that matched no endpoint (counted in the
    -- same rows, so that a rare error does not make the scan read the whole hour).
    SELECT error FROM webhook_deliveries
    WHERE processed AND processed_at > now() - interval '1 hour'
    LIMIT $1
)
SELECT
    now(),
    count(*) FILTER (WHERE created_at <= now() AND (lease_until IS NULL OR lease_until <= now())),
    coalesce(extract(epoch FROM now() - min(created_at) FILTER (
        WHERE created_at <= now() AND (lease_until IS NULL OR lease_until <= now())
    )), 0)::float8,
    count(*) FILTER (WHERE lease_until > now()),
    count(*) FILTER (WHERE attempt > 1),
    count(*) FILTER (WHERE created_at > now()),
    (SELECT count(*) FROM last_hour),
    (SELECT count(*) FILTER (WHERE error = 'no endpoint matched') FROM last_hour),
    coalesce(extract(epoch FROM now() - min(enqueued_at)), 0)::float8
FROM webhook_outbox
WHERE NOT processed
