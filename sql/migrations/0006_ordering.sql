-- fluxhook schema 6: ordered delivery per stream, opt-in per endpoint (and for WEBHOOK_URL with
-- WEBHOOK_ORDERING=stream).
--
-- What order means. A stream's events are delivered in the order of their ids: the order in
-- which the producers' INSERTs took them from the identity sequence. Within one transaction
-- that is statement order; for transactions that serialize on the stream (they lock the
-- stream's own row before inserting its event, as an UPDATE of that row does) it is their
-- commit order. Two producers that insert events of one stream concurrently, without such a
-- lock, have no order between them but the one their ids give, and fluxhook keeps that one:
-- it never sends an event while a transaction that could still commit an event with a smaller
-- id is in progress (the hold-back, see webhook_outbox_horizon below), so a late commit never
-- makes a stream go backwards. Producers need to do nothing for this.
--
-- order_key. An ordered delivery row carries its event's id: the routed delivery of a managed
-- endpoint with ordering = 'stream', and every retry and replay of an ordered row (a retry is
-- a new row with a new id; the key keeps its place). NULL: the row is unordered. The configured
-- WEBHOOK_URL consumer orders by the event row's own id when WEBHOOK_ORDERING=stream.
--
-- A claim takes an ordered row only when it is its stream's head for its endpoint: no
-- undelivered row of the same endpoint and stream has a smaller key (a retry waiting for its
-- time, a deferred row and a delivery in flight all hold the stream), and no event of the
-- stream with a smaller id is still waiting to be routed. Rows without a stream_id are
-- unordered.
ALTER TABLE webhook_outbox ADD COLUMN IF NOT EXISTS order_key bigint;
ALTER TABLE webhook_dead_letter ADD COLUMN IF NOT EXISTS order_key bigint;

-- The head check's index (webhook_outbox_stream_idx) is not created here: producers would pay
-- for it on every insert with a stream_id whether or not anything is ordered. It is created
-- (CONCURRENTLY) once something orders its streams; see StreamIndexSQL in sql/stream_index.go.

-- ordering: 'none' (the default) or 'stream'. ordering_failure: what an ordered stream does
-- when its head is dead-lettered: 'skip' (the stream moves on; the dead letter says it was
-- skipped) or 'stop' (the stream waits until the dead letter is replayed or purged).
ALTER TABLE webhook_endpoints ADD COLUMN IF NOT EXISTS ordering text NOT NULL DEFAULT 'none';
ALTER TABLE webhook_endpoints ADD COLUMN IF NOT EXISTS ordering_failure text NOT NULL DEFAULT 'skip';
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'webhook_endpoints_ordering_check') THEN
        ALTER TABLE webhook_endpoints ADD CONSTRAINT webhook_endpoints_ordering_check
            CHECK (ordering IN ('none', 'stream'));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'webhook_endpoints_ordering_failure_check') THEN
        ALTER TABLE webhook_endpoints ADD CONSTRAINT webhook_endpoints_ordering_failure_check
            CHECK (ordering_failure IN ('skip', 'stop'));
    END IF;
END
$do$;

-- Dispatchers reload their endpoints when the version moves: the new columns count.
DROP TRIGGER IF EXISTS webhook_endpoints_changed_update ON webhook_endpoints;
CREATE TRIGGER webhook_endpoints_changed_update
    AFTER UPDATE ON webhook_endpoints
    FOR EACH ROW
    WHEN ((OLD.url, OLD.tenant, OLD.event_types, OLD.scheme, OLD.secret, OLD.previous_secret,
           OLD.previous_secret_expires_at, OLD.enabled, OLD.disabled_reason, OLD.retry_rps,
           OLD.max_concurrency, OLD.headers, OLD.created_at, OLD.ordering, OLD.ordering_failure)
          IS DISTINCT FROM
          (NEW.url, NEW.tenant, NEW.event_types, NEW.scheme, NEW.secret, NEW.previous_secret,
           NEW.previous_secret_expires_at, NEW.enabled, NEW.disabled_reason, NEW.retry_rps,
           NEW.max_concurrency, NEW.headers, NEW.created_at, NEW.ordering, NEW.ordering_failure))
    EXECUTE FUNCTION webhook_endpoints_changed();

-- The hold-back. Returns '<last id>:<holders>': the identity sequence's last value, read
-- first, then the virtual transaction ids of the other sessions that hold webhook_outbox's
-- RowExclusiveLock (every transaction that inserted a row, or is inserting one, holds it until
-- it ends; it is taken before the row's id is drawn). Any id up to <last id> that is not
-- visible yet belongs to one of the holders: once none of them is running any more, every
-- such id is committed or gone, and a snapshot taken after that sees all of them. The
-- dispatcher keeps these readings across claims and sends ordered rows only up to the last id
-- whose holders have all ended. A transaction that stays open with an insert into the outbox
-- holds back newer ordered events (not unordered ones) until it ends.
--
-- Names are resolved here, with the migration's search_path, not the caller's.
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
            last := pg_sequence_last_value(%L::regclass);
            SELECT string_agg(virtualtransaction, ',') INTO holders
            FROM pg_locks
            WHERE locktype = 'relation' AND relation = %L::regclass AND mode = 'RowExclusiveLock'
              AND granted AND pid IS DISTINCT FROM pg_backend_pid();
            RETURN coalesce(last, 0) || ':' || coalesce(holders, '');
        END;
        $body$
    $fn$, seq, tbl);
END
$do$;

INSERT INTO webhook_schema_version (version) VALUES (6) ON CONFLICT (version) DO NOTHING;
