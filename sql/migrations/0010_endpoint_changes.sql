-- fluxhook schema 10: endpoints and ordered delivery stay right while they change.
--
-- * An endpoint's created_at is when its creating transaction commits. It was the insert's
--   clock, before the commit: an event enqueued between the two, routed before the commit
--   (its routing did not see the endpoint), never reached it, while one routed after did. A
--   deferred trigger now sets it just before the commit, so an endpoint receives the events
--   enqueued after its creation committed and none enqueued while it was being created,
--   whichever instance routes them when. (The trigger fires at COMMIT, or earlier with SET
--   CONSTRAINTS ALL IMMEDIATE; it leaves alone a created_at written explicitly with a time
--   before the transaction began, and rows written by logical replication or a restore,
--   which do not fire it.)
--
-- * Changes that fire no ordinary trigger still reach the dispatchers. A subscriber of
--   logical replication, and any session with session_replication_role = replica, fired none
--   of the triggers that bump webhook_endpoints_version, so dispatchers never reloaded for such
--   a change. They are now ENABLE ALWAYS. (A restore with triggers disabled fires none at all:
--   dispatchers also reload their endpoints every 30 seconds, whatever the version says.)
--
-- * The hold-back horizon (schema 6) keeps its holders across PREPARE TRANSACTION and a
--   restart. A prepared transaction's locks belong to no session (pid NULL) and carry a virtual
--   transaction id other than the one its session had: a reading that listed the session's id
--   took the change for the transaction's end, and a later event of the stream went before the
--   prepared one. Holders that are prepared transactions are now marked ('p' before the
--   virtual transaction id), and a dispatcher holds back every reading while a prepared
--   transaction it did not see prepared holds the lock. Only sessions of this database count
--   (a database cloned from one with the schema has a table of the same oid).

-- The table is named with its schema, resolved here: the trigger fires at COMMIT under the
-- committing session's search_path, which need not include fluxhook's schema.
DO $do$
DECLARE
    tbl text;
BEGIN
    SELECT format('%I.%I', n.nspname, c.relname) INTO tbl
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'webhook_endpoints'::regclass;
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION webhook_endpoints_created() RETURNS trigger
        LANGUAGE plpgsql AS $body$
        BEGIN
            -- Only a created_at taken during this transaction (the column's default): one
            -- written explicitly with an earlier time (an import) is kept.
            UPDATE %s SET created_at = GREATEST(created_at, pg_catalog.clock_timestamp())
            WHERE id = NEW.id AND created_at >= pg_catalog.now();
            RETURN NULL;
        END;
        $body$
    $fn$, tbl);
END
$do$;

DROP TRIGGER IF EXISTS webhook_endpoints_created ON webhook_endpoints;
CREATE CONSTRAINT TRIGGER webhook_endpoints_created
    AFTER INSERT ON webhook_endpoints
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION webhook_endpoints_created();

ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_changed;
ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_changed_update;
ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_truncated;

DO $do$
DECLARE
    tbl text;
    seq text;
BEGIN
    SELECT format('%I.%I', n.nspname, c.relname) INTO tbl
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'webhook_outbox'::regclass;
    seq := pg_get_serial_sequence(tbl, 'id');
    EXECUTE format($fn$
        CREATE OR REPLACE FUNCTION webhook_outbox_horizon() RETURNS text
        LANGUAGE plpgsql VOLATILE AS $body$
        DECLARE
            last bigint;
            holders text;
        BEGIN
            last := pg_catalog.pg_sequence_last_value(%L::pg_catalog.regclass);
            SELECT pg_catalog.string_agg(CASE WHEN l.pid IS NULL THEN 'p' ELSE '' END OPERATOR(pg_catalog.||) l.virtualtransaction, ',')
            INTO holders
            FROM pg_catalog.pg_locks l
            WHERE l.locktype = 'relation' AND l.relation = %L::pg_catalog.regclass AND l.mode = 'RowExclusiveLock'
              AND l.granted AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
              AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database());
            RETURN pg_catalog.concat(coalesce(last, 0), ':', coalesce(holders, ''));
        END;
        $body$
    $fn$, seq, tbl);
END
$do$;

INSERT INTO webhook_schema_version (version) VALUES (10) ON CONFLICT (version) DO NOTHING;
