-- fluxhook schema 7: the queue and the delivery log apart.
--
-- Until schema 6 a settled row stayed in webhook_outbox, marked processed, until the janitor
-- deleted it after WEBHOOK_RETENTION: the queue's heap and primary key held the whole history,
-- every settle was a non-HOT update (processed is in both partial indexes' predicates), and
-- the janitor's DELETEs left dead tuples that only a vacuum of the whole table cleared, a
-- vacuum that autovacuum started later the more history was kept.
--
-- From schema 7, webhook_outbox holds only undelivered rows. Settling a row (delivered, retry,
-- dead letter, routed to endpoints, released by a dlq command) deletes it from the outbox and
-- inserts its outcome into webhook_delivery_log, in the same statement. The log is
-- partitioned by range of processed_at, and retention drops whole partitions
-- (webhook_delivery_log_maintain below): no DELETE, no dead tuples, no vacuum of history.
-- Producers are unchanged: they still INSERT INTO webhook_outbox.
--
-- Upgrading in place. Nothing is moved and nothing is rewritten: rows settled before the
-- upgrade stay in webhook_outbox, processed, where no claim looks (claims read only
-- unprocessed rows), and the janitor deletes them by processed_at after the retention, as
-- before; after one retention the outbox holds only the queue. webhook_deliveries (below)
-- shows both. The statements of a fluxhook older than schema 7 still work against this
-- schema (they settle in place, as before): instances can be upgraded one by one.

-- The log: one row per settled attempt, with the outcome, and one per event routed to managed
-- endpoints (error says how many matched, or 'no endpoint matched'). The outbox row's columns,
-- less the lease's expiry and the deferral, which end with the attempt. leased_by and
-- lease_token are the instance and the claim that settled it. No primary key: a partitioned table's key must include processed_at, and
-- nothing looks a row up by key (add an index on delivery_id, on the parent table, to find a
-- delivery by the id consumers see; it costs every settle one more index insert).
CREATE TABLE IF NOT EXISTS webhook_delivery_log (
    id           bigint      NOT NULL,
    stream_id    text,
    event_type   text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL,
    delivery_id  uuid        NOT NULL,
    attempt      integer     NOT NULL,
    enqueued_at  timestamptz NOT NULL,
    leased_by    text,
    lease_token  bigint,
    endpoint_url text,
    processed_at timestamptz NOT NULL,
    status_code  integer,
    error        text,
    duration_ms  integer,
    tenant       text,
    endpoint_id  uuid,
    routed_at    timestamptz,
    order_key    bigint
) PARTITION BY RANGE (processed_at);

-- Rows settled when no partition covers their time land here: only when partition
-- maintenance has fallen behind (the dispatchers create partitions ahead of time). The next
-- maintenance moves them into the partition it creates for their range.
CREATE TABLE IF NOT EXISTS webhook_delivery_log_default PARTITION OF webhook_delivery_log DEFAULT;

-- processed_at grows with insertion order: a block-range index is a few pages per gigabyte
-- and costs a settle next to nothing, and serves the time-range reads (status's last hour).
CREATE INDEX IF NOT EXISTS webhook_delivery_log_processed_at_idx
    ON webhook_delivery_log USING brin (processed_at);

-- Every outbox row the way webhook_outbox showed it up to schema 6: the queue (pending rows,
-- processed false, and rows settled before the upgrade, processed true) and the log
-- (processed true, no lease). Queries written against the old table's delivery log read this
-- view instead. Created only where it does not exist: schema 15 appends a column, which
-- CREATE OR REPLACE VIEW could not drop again when the whole script (migrate --print) is
-- applied to a database already past it.
DO $do$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_class c
                   WHERE c.relname = 'webhook_deliveries'
                     AND c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class
                                           WHERE oid = 'webhook_outbox'::pg_catalog.regclass)) THEN
        CREATE VIEW webhook_deliveries AS
        SELECT id, stream_id, event_type, payload, created_at, processed, delivery_id, attempt, enqueued_at,
               lease_until, leased_by, endpoint_url, processed_at, status_code, error, duration_ms,
               lease_token, deferred_reason, tenant, endpoint_id, routed_at, order_key
        FROM webhook_outbox
        UNION ALL
        SELECT id, stream_id, event_type, payload, created_at, true, delivery_id, attempt, enqueued_at,
               NULL::timestamptz, leased_by, endpoint_url, processed_at, status_code, error, duration_ms,
               lease_token, NULL::text, tenant, endpoint_id, routed_at, order_key
        FROM webhook_delivery_log;
    END IF;
END
$do$;

-- The queue stays small: vacuum it by a fixed number of dead tuples, not by a share of its
-- size, so that a table that grew (a backlog, or history kept from before schema 7) is not
-- vacuumed later for it. Every row is inserted, leased (a HOT update), then deleted.
ALTER TABLE webhook_outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 5000
);

-- Partition maintenance, run by every dispatcher's janitor once a minute (and once at start),
-- in two functions so that a drop is a transaction of its own, short, and the last thing in it:
-- the log's ACCESS EXCLUSIVE lock, which settles queue behind, is held from the drop to the
-- commit and no longer.
--
-- webhook_delivery_log_drop_one(retention, step) drops one partition: the oldest whose whole
-- range is older than retention (a partition is kept until its newest possible row is older
-- than retention: the log holds between retention and retention + step), or else an empty
-- future one wider than step (made while the retention was longer: after the retention is
-- shortened, the log holds the old, wider partition until it has passed, then partitions of
-- the new step). It locks the partition first, which no settle uses (up to 5 s: an autovacuum
-- of it yields, a reader of old rows finishes), then the log (at most 100 ms, behind settles
-- in progress). Returns 'dropped <name>', 'drop of <name> postponed: ...' when a lock was not
-- had in time (the next run tries again), or NULL when there is nothing to drop. The janitor
-- calls it until it returns something else than 'dropped ...'.
--
-- webhook_delivery_log_maintain(retention, step, ahead) creates partitions of width step,
-- aligned to step, until now + ahead, around those that exist, moving into each whatever the
-- default partition holds for its range, and deletes default-partition rows older than
-- retention. Creating attaches a new table: SHARE UPDATE EXCLUSIVE on the log (settles go on)
-- and ACCESS EXCLUSIVE on the default partition, which no settle uses while partitions are in
-- place; a creation that cannot get its lock in 500 ms (a long query reading the whole log) is
-- left to the next run, which is why partitions are created ahead of time. Returns one line
-- per partition created. Partitions are named by their start, in UTC:
-- webhook_delivery_log_YYYYMMDD_HHMMSS.
--
-- Several instances may run these at once: an advisory lock makes the others return at once.
-- SECURITY DEFINER: creating and dropping partitions needs the log's owner, which the
-- dispatcher's role need not be; it only needs EXECUTE (granted to no one by default).
DO $do$
DECLARE
    sch text;
BEGIN
    SELECT n.nspname INTO sch
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'webhook_outbox'::regclass;

    -- The log's partitions and their bounds, read from the catalog.
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION webhook_delivery_log_partitions()
        RETURNS TABLE (rel regclass, lo timestamptz, hi timestamptz)
        LANGUAGE sql STABLE SET search_path = %I, pg_temp AS $body$
            SELECT c.oid::regclass, m[1]::timestamptz, m[2]::timestamptz
            FROM pg_inherits h
            JOIN pg_class c ON c.oid = h.inhrelid,
            LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                 $re$FROM \('([^']*)'\) TO \('([^']*)'\)$re$) m
            WHERE h.inhparent = 'webhook_delivery_log'::regclass AND m IS NOT NULL
            ORDER BY 2
        $body$
    $fn$, sch);

    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION webhook_delivery_log_drop_one(retention interval, step interval)
        RETURNS text
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp AS $body$
        DECLARE
            p     record;
            part  text;
            empty boolean;
        BEGIN
            IF step < interval '1 minute' OR retention < interval '1 minute' THEN
                RAISE EXCEPTION 'webhook_delivery_log_drop_one: step and retention must be at least 1 minute (got step %%, retention %%)',
                    step, retention;
            END IF;
            IF NOT pg_try_advisory_xact_lock(2037604416, 7) THEN
                RETURN NULL;
            END IF;
            FOR p IN SELECT * FROM webhook_delivery_log_partitions() LOOP
                CONTINUE WHEN NOT (p.hi <= now() - retention OR (p.lo > now() AND p.hi - p.lo > step));
                IF p.hi > now() - retention THEN
                    EXECUTE format('SELECT NOT EXISTS (SELECT FROM %%s)', p.rel) INTO empty;
                    CONTINUE WHEN NOT empty;
                END IF;
                part := p.rel::text;
                BEGIN
                    PERFORM set_config('lock_timeout', '5s', true);
                    EXECUTE format('LOCK TABLE %%s IN ACCESS EXCLUSIVE MODE', p.rel);
                    PERFORM set_config('lock_timeout', '100ms', true);
                    EXECUTE format('DROP TABLE %%s', p.rel);
                    RETURN 'dropped ' || part;
                EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
                    RETURN 'drop of ' || part || ' postponed: the log is busy';
                END;
            END LOOP;
            RETURN NULL;
        END;
        $body$
    $fn$, sch);

    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION webhook_delivery_log_maintain(retention interval, step interval, ahead interval)
        RETURNS SETOF text
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = %I, pg_temp AS $body$
        DECLARE
            p      record;
            lo     timestamptz;
            hi     timestamptz;
            part   text;
            los    timestamptz[] := '{}';
            his    timestamptz[] := '{}';
            i      integer;
            step_s float8 := extract(epoch FROM step);
        BEGIN
            IF step < interval '1 minute' OR retention < interval '1 minute' OR ahead < step THEN
                RAISE EXCEPTION 'webhook_delivery_log_maintain: step and retention must be at least 1 minute and ahead at least step (got step %%, retention %%, ahead %%)',
                    step, retention, ahead;
            END IF;
            IF NOT pg_try_advisory_xact_lock(2037604416, 7) THEN
                RETURN;
            END IF;
            PERFORM set_config('lock_timeout', '500ms', true);
            FOR p IN SELECT * FROM webhook_delivery_log_partitions() LOOP
                los := los || p.lo;
                his := his || p.hi;
            END LOOP;

            lo := to_timestamp(floor(extract(epoch FROM now()) / step_s) * step_s);
            WHILE lo < now() + ahead LOOP
                hi := lo + step;
                FOR i IN 1 .. coalesce(array_length(los, 1), 0) LOOP
                    IF los[i] <= lo AND his[i] > lo THEN
                        hi := NULL;
                        lo := his[i];
                        EXIT;
                    ELSIF los[i] > lo AND los[i] < hi THEN
                        hi := los[i];
                    END IF;
                END LOOP;
                CONTINUE WHEN hi IS NULL;
                part := 'webhook_delivery_log_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS');
                BEGIN
                    -- Only ever inserted into: autovacuum visits its pages once (insert
                    -- thresholds) and, with freeze_min_age 0, freezes them in that pass, so
                    -- that no anti-wraparound vacuum has to read the partition again before it
                    -- is dropped (producers' transactions use up transaction ids fast).
                    EXECUTE format('CREATE TABLE %%I (LIKE webhook_delivery_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS) '
                                   'WITH (autovacuum_freeze_min_age = 0)', part);
                    EXECUTE format('WITH moved AS (DELETE FROM webhook_delivery_log_default WHERE processed_at >= $1 AND processed_at < $2 RETURNING *) '
                                   'INSERT INTO %%I SELECT * FROM moved', part) USING lo, hi;
                    EXECUTE format('ALTER TABLE webhook_delivery_log ATTACH PARTITION %%I FOR VALUES FROM (%%L) TO (%%L)', part, lo, hi);
                EXCEPTION WHEN lock_not_available THEN
                    RETURN NEXT 'creation of ' || part || ' postponed: the log is busy';
                    EXIT;
                END;
                RETURN NEXT 'created ' || part;
                lo := hi;
            END LOOP;

            DELETE FROM webhook_delivery_log_default WHERE processed_at < now() - retention;
        END;
        $body$
    $fn$, sch);
END
$do$;
REVOKE EXECUTE ON FUNCTION webhook_delivery_log_maintain(interval, interval, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION webhook_delivery_log_drop_one(interval, interval) FROM PUBLIC;

INSERT INTO webhook_schema_version (version) VALUES (7) ON CONFLICT (version) DO NOTHING;
