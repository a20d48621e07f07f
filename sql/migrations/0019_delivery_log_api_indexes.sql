-- fluxhook schema 19: the delivery log indexed for the management API's read of an endpoint's
-- deliveries, newest first (GET /v1/endpoints/{id}/deliveries). Schema 15 indexed it by
-- delivery_id, for a delivery by the id consumers see.
--
-- Without it, an endpoint's deliveries read every row of the window (the last 24 hours by
-- default) of every endpoint: 88 to 805 ms at 1,000,000 rows, growing with the log.
--
-- On the partitioned parent, so that the janitor's new partitions get them when attached;
-- each partition has its own, so what a settle pays depends on the current partition's size,
-- not on the whole log's. Creating them on the parent attaches a partition's equivalent index
-- instead of building one: on a big log, build it beforehand, partition by partition, with
-- CREATE INDEX CONCURRENTLY (docs/upgrading.md).

-- Partial: rows without an endpoint (deliveries to WEBHOOK_URL or a row's endpoint_url, and the
-- routed events' own rows) are never listed by endpoint, and a deployment without managed
-- endpoints pays nothing for it. A delivery to an endpoint pays one more btree insert, into
-- the end of its endpoint's range (processed_at grows). The read's "endpoint_id = $1" implies
-- the predicate, so the planner uses it with a generic plan too.
CREATE INDEX IF NOT EXISTS webhook_delivery_log_endpoint_idx ON webhook_delivery_log (endpoint_id, processed_at)
    WHERE endpoint_id IS NOT NULL;

INSERT INTO webhook_schema_version (version) VALUES (19) ON CONFLICT (version) DO NOTHING;
