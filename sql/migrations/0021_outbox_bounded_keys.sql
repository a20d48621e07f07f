-- fluxhook schema 21: an outbox row's stream_id and endpoint_url are bounded, and the insert
-- trigger's functions call PostgreSQL's built-ins by their qualified names.
--
-- Bounded keys. The stream index (built when something orders its streams) is keyed by
-- stream_id and the endpoint key (endpoint_url, or 'ep:<endpoint_id>' for a managed
-- endpoint's delivery), and a btree refuses a key over 2,704 bytes. With neither bounded, a
-- producer's event with a stream_id of about 2,660 bytes fitted as an event (key '') but not
-- as the delivery routing makes of it (key 'ep:<uuid>', 39 bytes more): every routing
-- statement with that event in its batch failed, and the event came back with the oldest rows
-- of every tenant at each lease's end, none of them delivered. A longer one, written before
-- the index existed, made every build of it fail. stream_id may now be at most 256 bytes and
-- endpoint_url 2,048 (a managed endpoint's URL limit): 2,304 bytes and the order key fit. The
-- error names the constraint.
--
-- NOT VALID: adding them reads no row. A claim's update of a row breaking one would fail (a
-- check holds for every row an update writes), so the pending rows already written so are
-- dealt with after the constraints are in place (adding them waits for the inserts in flight
-- and refuses later ones, so these statements see every such row): a longer stream_id becomes
-- its SHA-256 ('sha256:<hex>', 71 bytes), which keeps the rows of one stream together and in
-- order; a longer endpoint_url, which no row may have any more, is dead-lettered with the
-- reason. Dead letters are rewritten likewise, before the outbox's lock is taken, so that a
-- replay writes a row the constraint accepts. stream_id is never sent to consumers.
--
-- Schema 20's '-infinity' rows are made due again here: that migration made them due before
-- adding its constraint, and a producer's row committed meanwhile was left, failing every claim.

UPDATE webhook_dead_letter
SET stream_id = 'sha256:' || encode(sha256(convert_to(stream_id, 'UTF8')), 'hex')
WHERE octet_length(stream_id) > 256;

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'webhook_outbox_stream_id_length'
                   AND conrelid = 'webhook_outbox'::regclass) THEN
        ALTER TABLE webhook_outbox ADD CONSTRAINT webhook_outbox_stream_id_length
            CHECK (octet_length(stream_id) <= 256) NOT VALID;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'webhook_outbox_endpoint_url_length'
                   AND conrelid = 'webhook_outbox'::regclass) THEN
        ALTER TABLE webhook_outbox ADD CONSTRAINT webhook_outbox_endpoint_url_length
            CHECK (octet_length(endpoint_url) <= 2048) NOT VALID;
    END IF;
END
$do$;

COMMENT ON CONSTRAINT webhook_outbox_stream_id_length ON webhook_outbox IS
    'stream_id may be at most 256 bytes: the stream index, which ordered delivery reads, cannot hold longer keys.';
COMMENT ON CONSTRAINT webhook_outbox_endpoint_url_length ON webhook_outbox IS
    'endpoint_url may be at most 2048 bytes, as a managed endpoint''s URL.';

-- First the rows no row may be any more: moved to the dead letters (a delete checks no
-- constraint), their stream id hashed there as below.
WITH settled AS (
    DELETE FROM webhook_outbox
    WHERE NOT processed AND octet_length(endpoint_url) > 2048
    RETURNING id, delivery_id, stream_id, event_type, payload, endpoint_url, attempt, enqueued_at, tenant, endpoint_id,
              order_key, created_at, routed_at
), logged AS (
    INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
                                      enqueued_at, endpoint_url, processed_at, error, tenant, endpoint_id,
                                      routed_at, order_key)
    SELECT id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, endpoint_url,
           now(), 'endpoint_url is over 2048 bytes', tenant, endpoint_id, routed_at, order_key
    FROM settled
)
INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload, endpoint_url, attempts,
                                 reason, enqueued_at, tenant, endpoint_id, order_key)
SELECT id, delivery_id,
       CASE WHEN octet_length(stream_id) > 256 THEN 'sha256:' || encode(sha256(convert_to(stream_id, 'UTF8')), 'hex')
            ELSE stream_id END,
       event_type, payload, endpoint_url, attempt,
       'invalid endpoint_url: it is ' || octet_length(endpoint_url) || ' bytes, over the limit of 2048',
       enqueued_at, tenant, endpoint_id, order_key
FROM settled;

-- Then every other pending row that breaks a constraint, in one update: each update is checked
-- against all of them, so a row fixed one column at a time (a long stream id, and '-infinity')
-- failed the first, and the migration. One pass over the queue under its lock: about 0.5 s per
-- million pending rows, which producers wait.
UPDATE webhook_outbox
SET created_at = CASE WHEN created_at = '-infinity' THEN now() ELSE created_at END,
    enqueued_at = CASE WHEN enqueued_at = '-infinity'
                       THEN least(CASE WHEN created_at = '-infinity' THEN now() ELSE created_at END, now())
                       ELSE enqueued_at END,
    stream_id = CASE WHEN octet_length(stream_id) > 256 THEN 'sha256:' || encode(sha256(convert_to(stream_id, 'UTF8')), 'hex')
                     ELSE stream_id END
WHERE NOT processed AND (created_at = '-infinity' OR enqueued_at = '-infinity' OR octet_length(stream_id) > 256);

-- Qualified built-ins. A function body resolves names with the search_path of the session
-- that runs it: every producer's insert runs the first, the API, the CLI and the dispatcher (an
-- endpoint it disables) the second, and a role that can create a function in a schema on their
-- path could plant pg_sequence_last_value(text) or nextval(text), which outrank the built-ins'
-- regclass for a quoted name, and have it run as whoever inserts. The sequences are named with
-- their schema. Written as quoted strings (format's %L), not dollar-quoted bodies: a schema
-- name may hold any dollar tag.
DO $do$
DECLARE
    until_seq text;
    version_seq text;
BEGIN
    SELECT max(format('%I.%I', n.nspname, c.relname)) FILTER (WHERE c.oid = 'webhook_outbox_notify_until'::regclass),
           max(format('%I.%I', n.nspname, c.relname)) FILTER (WHERE c.oid = 'webhook_endpoints_version'::regclass)
    INTO until_seq, version_seq
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid IN ('webhook_outbox_notify_until'::regclass, 'webhook_endpoints_version'::regclass);
    EXECUTE format('CREATE OR REPLACE FUNCTION webhook_outbox_notify_wanted() RETURNS boolean LANGUAGE plpgsql STABLE AS %L',
        format('BEGIN
            RETURN pg_catalog.to_timestamp(pg_catalog.pg_sequence_last_value(%L::pg_catalog.regclass)::pg_catalog.float8 / 1000)
                       > pg_catalog.statement_timestamp()
                AND pg_catalog.current_setting(''fluxhook.dispatcher'', true) IS DISTINCT FROM ''on'';
        END;', until_seq));
    EXECUTE format('CREATE OR REPLACE FUNCTION webhook_endpoints_changed() RETURNS trigger LANGUAGE plpgsql AS %L',
        format('BEGIN
            PERFORM pg_catalog.nextval(%L::pg_catalog.regclass);
            RETURN NULL;
        END;', version_seq));
END
$do$;

CREATE OR REPLACE FUNCTION webhook_endpoints_touch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := pg_catalog.clock_timestamp();
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION webhook_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Called only when the trigger's WHEN holds: a dispatcher is waiting for work.
    PERFORM pg_catalog.pg_notify('webhook_outbox', pg_catalog.pg_current_xact_id()::text);
    RETURN NULL;
END;
$$;

INSERT INTO webhook_schema_version (version) VALUES (21) ON CONFLICT (version) DO NOTHING;
