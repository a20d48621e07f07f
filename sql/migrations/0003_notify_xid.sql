-- fluxhook schema 3: each NOTIFY names the producer's transaction.
--
-- A NOTIFY reaches the dispatcher a little after its transaction commits. When the dispatcher
-- claimed in between, its claim already saw (and took) the rows, and the late NOTIFY only
-- woke it for an empty claim: about one claim in ten under a steady 1,000 events/s (the
-- bench's steady workload). With the transaction id as the payload the dispatcher checks it
-- against the snapshot its last claim returned and ignores NOTIFYs that claim already
-- covered. pg_current_xact_id() is the top-level transaction's id (PostgreSQL 13 or later),
-- which the producer's insert has already assigned; NOTIFY still collapses one
-- transaction's statements into one notification, since their payload is the same.
CREATE OR REPLACE FUNCTION webhook_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Called only when the trigger's WHEN holds: a dispatcher is waiting for work.
    PERFORM pg_notify('webhook_outbox', pg_current_xact_id()::text);
    RETURN NULL;
END;
$$;

INSERT INTO webhook_schema_version (version) VALUES (3) ON CONFLICT (version) DO NOTHING;
