-- fluxhook schema 15: what the consumer answered, kept with each attempt, and the delivery log
-- indexed by the delivery id consumers see.
--
-- "Did my customer get event X, and what did their server say?" needs two things the log did
-- not have. The status code and the error say whether an attempt worked, not what the consumer
-- answered; and the log could only be searched by delivery id by reading every partition.

-- The index first, then the columns: the migration holds every lock it takes until it commits,
-- and building the index takes only SHARE on the log (settles wait, reads of the log go on),
-- where adding a column takes ACCESS EXCLUSIVE (reads wait too). Taken after the build, that
-- lock is held for a moment instead of for the build.
--
-- On the partitioned parent, so that the janitor's new partitions get it when attached. A btree
-- on delivery_id is one more index insert per settled attempt (docs/benchmarks.md says what it
-- costs). An index of the parent that already leads with delivery_id (one an operator added, as
-- docs/storage.md suggested up to schema 14) serves the same look-ups: none is added then. The
-- creation attaches the partitions' own equivalent indexes instead of building them, so a big
-- log can be indexed beforehand, partition by partition, with CREATE INDEX CONCURRENTLY
-- (docs/upgrading.md).
DO $do$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_index i
        JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
        JOIN pg_catalog.pg_am am ON am.oid = ic.relam
        WHERE i.indrelid = 'webhook_delivery_log'::pg_catalog.regclass
          AND am.amname = 'btree' AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL
          AND i.indkey[0] = (SELECT a.attnum FROM pg_catalog.pg_attribute a
                             WHERE a.attrelid = 'webhook_delivery_log'::pg_catalog.regclass
                               AND a.attname = 'delivery_id')) THEN
        CREATE INDEX webhook_delivery_log_delivery_id_idx ON webhook_delivery_log (delivery_id);
    END IF;
END
$do$;

-- The start of the consumer's response body, as the dispatcher read it
-- (WEBHOOK_RESPONSE_EXCERPT_BYTES, default 1024: valid UTF-8, no NUL). NULL when there was no
-- response (a network error, a timeout, no attempt) or excerpts are off; '' for an empty body.
-- Nullable, no default: adding it rewrites nothing, and the binaries of schema 14, which do not
-- name it, write NULL.
ALTER TABLE webhook_delivery_log ADD COLUMN IF NOT EXISTS response_excerpt text;

-- A dead letter shows the consumer's last answer beside its last status and error.
ALTER TABLE webhook_dead_letter ADD COLUMN IF NOT EXISTS last_response_excerpt text;

-- The view of schema 7 with the log's new column last: CREATE OR REPLACE VIEW may only append
-- columns, and queries that read the view by position keep working. Queue rows have no answer
-- kept: their attempt is not over.
CREATE OR REPLACE VIEW webhook_deliveries AS
SELECT id, stream_id, event_type, payload, created_at, processed, delivery_id, attempt, enqueued_at,
       lease_until, leased_by, endpoint_url, processed_at, status_code, error, duration_ms,
       lease_token, deferred_reason, tenant, endpoint_id, routed_at, order_key, NULL::text AS response_excerpt
FROM webhook_outbox
UNION ALL
SELECT id, stream_id, event_type, payload, created_at, true, delivery_id, attempt, enqueued_at,
       NULL::timestamptz, leased_by, endpoint_url, processed_at, status_code, error, duration_ms,
       lease_token, NULL::text, tenant, endpoint_id, routed_at, order_key, response_excerpt
FROM webhook_delivery_log;

INSERT INTO webhook_schema_version (version) VALUES (15) ON CONFLICT (version) DO NOTHING;
