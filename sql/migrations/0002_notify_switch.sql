-- fluxhook schema 2: the insert trigger decides whether to NOTIFY without running a query.
--
-- Version 1's trigger function looked up webhook_dispatcher on every producer statement. That
-- look-up needs a snapshot, and taking one contends on the server's process array with every
-- committing transaction: with 32 producers on 2 cores it cost them ~19% of their commit
-- throughput even with no dispatcher listening (pgbench, single-row inserts; a trigger whose
-- WHEN reads this sequence instead cost ~3%, within the noise).
--
-- webhook_outbox_notify_until holds a time (milliseconds since the epoch, by the server's
-- clock) until which producers must NOTIFY. A dispatcher with nothing to do pushes it a few
-- seconds ahead and keeps it there while it waits; a busy one lets it lapse, and producers
-- stop notifying within those seconds. Sequences are not transactional, so a dispatcher's
-- setval is visible to every producer at once, and pg_sequence_last_value reads it without a
-- snapshot or a lock. webhook_dispatcher.armed stays as each instance's state for operators
-- (fluxhook status); the trigger no longer reads it.
CREATE SEQUENCE IF NOT EXISTS webhook_outbox_notify_until AS bigint MINVALUE 0 START 0;

-- Every role that inserts into webhook_outbox fires the trigger, whose WHEN reads the sequence:
-- it needs SELECT on it (the value is only a time). Dispatchers need UPDATE to set it, which
-- the owner of the schema has.
GRANT SELECT ON SEQUENCE webhook_outbox_notify_until TO PUBLIC;

CREATE OR REPLACE FUNCTION webhook_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Called only when the trigger's WHEN holds: a dispatcher is waiting for work.
    -- Statement-level and a constant payload: one cheap NOTIFY per producer statement at most.
    PERFORM pg_notify('webhook_outbox', '');
    RETURN NULL;
END;
$$;

-- The WHEN runs in the executor, before any function call: no snapshot, no query, and
-- float arithmetic (date_part) rather than numeric (extract), which measured cheaper. Rows a
-- dispatcher inserts itself (retries, deferrals: never due at once; it sets its own timer for
-- them) notify no one: its sessions set fluxhook.dispatcher = on.
DROP TRIGGER IF EXISTS webhook_outbox_notify ON webhook_outbox;
CREATE TRIGGER webhook_outbox_notify
    AFTER INSERT ON webhook_outbox
    FOR EACH STATEMENT
    WHEN (pg_sequence_last_value('webhook_outbox_notify_until') > date_part('epoch', clock_timestamp()) * 1000
          AND current_setting('fluxhook.dispatcher', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION webhook_outbox_notify();

INSERT INTO webhook_schema_version (version) VALUES (2) ON CONFLICT (version) DO NOTHING;
