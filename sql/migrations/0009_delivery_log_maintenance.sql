-- fluxhook schema 9: the delivery log's partition maintenance, made safe under load, under any
-- session settings and against other roles' functions. It replaces the three functions of
-- schema 7 (same names, arguments and results; CREATE OR REPLACE keeps their grants):
--
-- * Catching up while settles go on. When maintenance has fallen behind (a long query of the
--   log held its locks past the partitions made ahead), settles land in the default
--   partition. Creating the partition for their range moves them out of it and attaches the
--   new table; a settle that landed in the default partition in between made the attach fail,
--   and with it the whole run, so maintenance could not catch up while dispatchers kept
--   settling. Now the default partition is locked before anything moves. When settles may be
--   landing in it (the first range to create begins within the next minute), the log itself is
--   locked against new writes first (SHARE): settles wait while rows move (about a second per
--   200,000 rows) and then go to the new partition; otherwise settles go on meanwhile. A range
--   that cannot be created (say, a table of its name exists) is reported and the others are
--   still created.
--
-- * Bounds independent of the session. Bounds are read back from the catalog as text; under a
--   DateStyle that prints zone abbreviations, an abbreviation that names two zones ("IST":
--   India, Ireland, Israel) read back hours off, so maintain tried to create an existing
--   partition again, or drop_one dropped one before its retention. The functions now run with
--   DateStyle ISO, TimeZone UTC and IntervalStyle postgres, whatever the caller's, and write
--   bounds as UTC ISO 8601.
--
-- * An empty future partition (one wider than the step, made while the retention was longer)
--   is dropped only if it is still empty once locked: a settle could write to it between the
--   check and the lock (when the clock reaches the partition's start during the call), and
--   the drop took the row with it.
--
-- * The two SECURITY DEFINER functions run as the schema owner. Their search_path put their
--   schema first for functions, and an exact match there beats a polymorphic built-in
--   (array_length, format, ||): a role allowed to CREATE in the schema could make the owner run
--   its code. Every built-in function is now called as pg_catalog.name, pg_catalog comes first in
--   search_path, no operator depends on an implicit coercion, and tables are named with their
--   schema. Still, revoke CREATE on the schema from roles that do not own it (see
--   docs/operations.md).
--
-- Only CREATE OR REPLACE FUNCTION: no table is locked, settles and producers go on.

-- webhook_delivery_log_partitions(): the log's dated partitions and their bounds, from the
-- catalog, in order of start.
--
-- webhook_delivery_log_drop_one(retention, step) drops one partition: the oldest whose whole
-- range is older than retention (the log holds between retention and retention + step), or
-- else an empty future one wider than step (after the retention was shortened, the log keeps
-- the current wide partition until it has passed, then partitions of the new step). It locks
-- the partition first, which no settle uses (up to 5 s: an autovacuum of it yields, a reader of
-- old rows finishes), looks again whether a future one is empty, then locks the log (at most
-- 100 ms, behind settles in progress) and drops it. Returns 'dropped <name>', 'drop of <name>
-- postponed: the log is busy' when a lock was not had in time (the next run tries again), or
-- NULL when there is nothing to drop. The janitor calls it until it returns something else
-- than 'dropped ...': each drop is a transaction of its own, short, so the log's ACCESS
-- EXCLUSIVE lock, which settles queue behind, is held from the drop to the commit and no longer.
--
-- webhook_delivery_log_maintain(retention, step, ahead) creates partitions of width step,
-- aligned to step in UTC, from the one holding now until now + ahead, around those that exist,
-- moving into each what the default partition holds for its range, and deletes
-- default-partition rows older than retention. It waits at most 500 ms for each lock (a long
-- query reading the whole log holds them): then it returns 'creation of <name> postponed: the
-- log is busy' and leaves the rest to the next run, which is why partitions are created ahead.
-- Returns one line per partition created ('created <name>', with the rows moved if any) or not
-- ('creation of <name> failed: <error>'). Partitions are named by their start, in UTC:
-- webhook_delivery_log_YYYYMMDD_HHMMSS.
--
-- Several instances may run these at once: an advisory lock makes the others return at once.
-- SECURITY DEFINER: creating and dropping partitions needs the log's owner, which the
-- dispatcher's role need not be; it only needs EXECUTE (granted to no one by default).
DO $do$
DECLARE
    sch text;
BEGIN
    -- Qualified here too: the migration runs as the owner, under the migrating session's
    -- search_path.
    SELECT n.nspname INTO sch
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
    WHERE c.oid OPERATOR(pg_catalog.=) 'webhook_outbox'::pg_catalog.regclass;

    -- The bounds, read back as text: the SET clauses fix how pg_get_expr prints them and how
    -- the casts read them, whatever the caller's settings.
    EXECUTE pg_catalog.format($fn$
        CREATE OR REPLACE FUNCTION %1$I.webhook_delivery_log_partitions()
        RETURNS TABLE (rel regclass, lo timestamptz, hi timestamptz)
        LANGUAGE sql STABLE
        SET search_path = pg_catalog, %1$I, pg_temp
        SET DateStyle = 'ISO, YMD' SET TimeZone = 'UTC' SET IntervalStyle = 'postgres'
        AS $body$
            SELECT c.oid::pg_catalog.regclass, m[1]::pg_catalog.timestamptz, m[2]::pg_catalog.timestamptz
            FROM pg_catalog.pg_inherits h
            JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) h.inhrelid,
            LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid),
                                            $re$FROM \('([^']*)'\) TO \('([^']*)'\)$re$) m
            WHERE h.inhparent OPERATOR(pg_catalog.=) %2$L::pg_catalog.regclass AND m IS NOT NULL
            ORDER BY 2
        $body$
    $fn$, sch, pg_catalog.format('%I.webhook_delivery_log', sch));

    EXECUTE pg_catalog.format($fn$
        CREATE OR REPLACE FUNCTION %1$I.webhook_delivery_log_drop_one(retention interval, step interval)
        RETURNS text
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, %1$I, pg_temp
        SET DateStyle = 'ISO, YMD' SET TimeZone = 'UTC' SET IntervalStyle = 'postgres'
        AS $body$
        DECLARE
            p     record;
            part  text;
            past  boolean;
            empty boolean;
        BEGIN
            IF step < interval '1 minute' OR retention < interval '1 minute' THEN
                RAISE EXCEPTION 'webhook_delivery_log_drop_one: step and retention must be at least 1 minute (got step %%, retention %%)',
                    step, retention;
            END IF;
            IF NOT pg_catalog.pg_try_advisory_xact_lock(2037604416, 7) THEN
                RETURN NULL;
            END IF;
            FOR p IN SELECT * FROM %1$I.webhook_delivery_log_partitions() LOOP
                past := p.hi <= pg_catalog.now() - retention;
                CONTINUE WHEN NOT (past OR (p.lo > pg_catalog.now() AND p.hi - p.lo > step));
                -- p.rel prints unqualified (its schema is on search_path) and names the same
                -- table in the statements below: pg_catalog, before it, holds no such name.
                part := p.rel::text;
                IF NOT past THEN
                    -- A future partition with rows is kept: skip it without locking it.
                    EXECUTE pg_catalog.format('SELECT NOT EXISTS (SELECT FROM %%s)', p.rel) INTO empty;
                    CONTINUE WHEN NOT empty;
                END IF;
                BEGIN
                    PERFORM pg_catalog.set_config('lock_timeout', '5s', true);
                    EXECUTE pg_catalog.format('LOCK TABLE %%s IN ACCESS EXCLUSIVE MODE', p.rel);
                    IF NOT past THEN
                        -- Again under the lock: a settle may have written to it since (one
                        -- whose transaction began once the clock reached its start), and no
                        -- settle can now. Under READ COMMITTED this statement sees every
                        -- commit before the lock; under a stricter isolation the snapshot
                        -- predates the call, so only a partition without a page counts as empty.
                        EXECUTE pg_catalog.format('SELECT NOT EXISTS (SELECT FROM %%s)', p.rel) INTO empty;
                        IF NOT empty OR (pg_catalog.current_setting('transaction_isolation') <> 'read committed'
                                         AND pg_catalog.pg_relation_size(p.rel) > 0) THEN
                            -- Rolls the block back, which releases the lock at once.
                            RAISE EXCEPTION USING ERRCODE = 'FXH01', MESSAGE = 'written to';
                        END IF;
                    END IF;
                    PERFORM pg_catalog.set_config('lock_timeout', '100ms', true);
                    EXECUTE pg_catalog.format('DROP TABLE %%s', p.rel);
                    RETURN pg_catalog.format('dropped %%s', part);
                EXCEPTION
                    WHEN lock_not_available OR deadlock_detected THEN
                        RETURN pg_catalog.format('drop of %%s postponed: the log is busy', part);
                    WHEN SQLSTATE 'FXH01' THEN
                        CONTINUE;
                END;
            END LOOP;
            RETURN NULL;
        END;
        $body$
    $fn$, sch);

    EXECUTE pg_catalog.format($fn$
        CREATE OR REPLACE FUNCTION %1$I.webhook_delivery_log_maintain(retention interval, step interval, ahead interval)
        RETURNS SETOF text
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, %1$I, pg_temp
        SET DateStyle = 'ISO, YMD' SET TimeZone = 'UTC' SET IntervalStyle = 'postgres'
        AS $body$
        DECLARE
            sch     CONSTANT text := %1$L;
            p       record;
            lo      timestamptz;
            hi      timestamptz;
            part    text;
            moved   bigint;
            los     timestamptz[] := '{}';
            his     timestamptz[] := '{}';
            new_los timestamptz[] := '{}';
            new_his timestamptz[] := '{}';
            i       integer;
            step_s  float8 := pg_catalog.date_part('epoch', step);
        BEGIN
            IF step < interval '1 minute' OR retention < interval '1 minute' OR ahead < step THEN
                RAISE EXCEPTION 'webhook_delivery_log_maintain: step and retention must be at least 1 minute and ahead at least step (got step %%, retention %%, ahead %%)',
                    step, retention, ahead;
            END IF;
            IF NOT pg_catalog.pg_try_advisory_xact_lock(2037604416, 7) THEN
                RETURN;
            END IF;
            PERFORM pg_catalog.set_config('lock_timeout', '500ms', true);
            FOR p IN SELECT * FROM %1$I.webhook_delivery_log_partitions() LOOP
                los := pg_catalog.array_append(los, p.lo);
                his := pg_catalog.array_append(his, p.hi);
            END LOOP;

            -- The ranges no partition covers, from the step holding now to now + ahead.
            lo := pg_catalog.to_timestamp(pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.now()) / step_s) * step_s);
            WHILE lo < pg_catalog.now() + ahead LOOP
                hi := lo + step;
                FOR i IN 1 .. pg_catalog.cardinality(los) LOOP
                    IF los[i] <= lo AND his[i] > lo THEN
                        hi := NULL;
                        lo := his[i];
                        EXIT;
                    ELSIF los[i] > lo AND los[i] < hi THEN
                        hi := los[i];
                    END IF;
                END LOOP;
                CONTINUE WHEN hi IS NULL;
                new_los := pg_catalog.array_append(new_los, lo);
                new_his := pg_catalog.array_append(new_his, hi);
                lo := hi;
            END LOOP;

            -- Every attach takes the default partition's ACCESS EXCLUSIVE lock and checks it
            -- holds no row of the new range; taken before any row moves, no settle lands in it
            -- between the move and the attach. Settles write to the default partition only for
            -- a time no partition covers: when the first range to create begins before the call
            -- can end, settles may be writing there now, and one that chose the default
            -- partition before the attach committed would fail its partition check after it.
            -- So the log is locked against writes (SHARE) first: settles wait, then choose the
            -- new partition. Otherwise SHARE UPDATE EXCLUSIVE, the attach's own lock, lets
            -- settles go on. The log before its default partition, in the order settles lock them.
            IF pg_catalog.cardinality(new_los) > 0 THEN
                BEGIN
                    IF new_los[1] < pg_catalog.clock_timestamp() + interval '1 minute' THEN
                        LOCK TABLE ONLY %1$I.webhook_delivery_log IN SHARE MODE;
                    ELSE
                        LOCK TABLE ONLY %1$I.webhook_delivery_log IN SHARE UPDATE EXCLUSIVE MODE;
                    END IF;
                    LOCK TABLE %1$I.webhook_delivery_log_default IN ACCESS EXCLUSIVE MODE;
                EXCEPTION WHEN lock_not_available THEN
                    RETURN NEXT pg_catalog.format('creation of webhook_delivery_log_%%s postponed: the log is busy',
                                                  pg_catalog.to_char(new_los[1] AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS'));
                    new_los := '{}';
                END;
            END IF;

            FOR i IN 1 .. pg_catalog.cardinality(new_los) LOOP
                lo := new_los[i];
                hi := new_his[i];
                part := pg_catalog.format('webhook_delivery_log_%%s', pg_catalog.to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS'));
                BEGIN
                    -- Only ever inserted into: autovacuum visits its pages once (insert
                    -- thresholds) and, with freeze_min_age 0, freezes them in that pass, so
                    -- that no anti-wraparound vacuum has to read the partition again before it
                    -- is dropped (producers' transactions use up transaction ids fast).
                    EXECUTE pg_catalog.format('CREATE TABLE %%I.%%I (LIKE %%I.webhook_delivery_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS) '
                                              'WITH (autovacuum_freeze_min_age = 0)', sch, part, sch);
                    EXECUTE pg_catalog.format('WITH moved AS (DELETE FROM %%I.webhook_delivery_log_default '
                                              'WHERE processed_at >= $1 AND processed_at < $2 RETURNING *) '
                                              'INSERT INTO %%I.%%I SELECT * FROM moved', sch, sch, part) USING lo, hi;
                    GET DIAGNOSTICS moved = ROW_COUNT;
                    EXECUTE pg_catalog.format('ALTER TABLE %%I.webhook_delivery_log ATTACH PARTITION %%I.%%I FOR VALUES FROM (%%L) TO (%%L)',
                                              sch, sch, part,
                                              pg_catalog.to_char(lo AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                                              pg_catalog.to_char(hi AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
                EXCEPTION
                    WHEN lock_not_available THEN
                        RETURN NEXT pg_catalog.format('creation of %%s postponed: the log is busy', part);
                        EXIT;
                    WHEN OTHERS THEN
                        -- Rolled back, the moved rows with it; the other ranges go on.
                        RETURN NEXT pg_catalog.format('creation of %%s failed: %%s (SQLSTATE %%s)', part, SQLERRM, SQLSTATE);
                        CONTINUE;
                END;
                IF moved > 0 THEN
                    RETURN NEXT pg_catalog.format('created %%s, moving %%s rows from the default partition', part, moved);
                ELSE
                    RETURN NEXT pg_catalog.format('created %%s', part);
                END IF;
            END LOOP;

            DELETE FROM %1$I.webhook_delivery_log_default WHERE processed_at < pg_catalog.now() - retention;
        END;
        $body$
    $fn$, sch);
END
$do$;
-- CREATE OR REPLACE keeps a function's grants; repeated so that this file states them.
REVOKE EXECUTE ON FUNCTION webhook_delivery_log_maintain(interval, interval, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION webhook_delivery_log_drop_one(interval, interval) FROM PUBLIC;

INSERT INTO webhook_schema_version (version) VALUES (9) ON CONFLICT (version) DO NOTHING;
