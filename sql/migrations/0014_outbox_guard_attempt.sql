-- fluxhook schema 14: the producers' insert guard (schema 11) also covers attempt and
-- enqueued_at.
--
-- A producer's row with attempt 2 or more was taken for a retry of a routed delivery: it was
-- never routed, and went to WEBHOOK_URL whatever its tenant, past the managed endpoints'
-- tenants and filters and an ordered endpoint's streams. A row with enqueued_at in the future
-- reached endpoints created after it was inserted, whose rule is to receive only the events
-- enqueued after they exist. A role that may not UPDATE the outbox (a producer) may now insert
-- only attempt 1 (the column's default) and an enqueued_at no later than its transaction's
-- start (the default is that start). The condition stays in the trigger's WHEN clause: a
-- producer's plain row calls no function.

CREATE OR REPLACE FUNCTION webhook_outbox_routing_refused() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cols text[] := ARRAY[]::text[];
BEGIN
    IF NEW.endpoint_id IS NOT NULL THEN cols := pg_catalog.array_append(cols, 'endpoint_id'); END IF;
    IF NEW.routed_at IS NOT NULL THEN cols := pg_catalog.array_append(cols, 'routed_at'); END IF;
    IF NEW.order_key IS NOT NULL THEN cols := pg_catalog.array_append(cols, 'order_key'); END IF;
    IF NEW.lease_until IS NOT NULL THEN cols := pg_catalog.array_append(cols, 'lease_until'); END IF;
    IF NEW.leased_by IS NOT NULL THEN cols := pg_catalog.array_append(cols, 'leased_by'); END IF;
    IF NEW.lease_token IS NOT NULL THEN cols := pg_catalog.array_append(cols, 'lease_token'); END IF;
    IF NEW.attempt IS DISTINCT FROM 1 THEN cols := pg_catalog.array_append(cols, 'attempt (other than 1)'); END IF;
    IF NEW.enqueued_at > pg_catalog.now() THEN cols := pg_catalog.array_append(cols, 'enqueued_at (in the future)'); END IF;
    RAISE EXCEPTION 'webhook_outbox: a producer may not set %: fluxhook''s dispatcher sets them when it routes the event',
        pg_catalog.array_to_string(cols, ', ')
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Insert the event without these columns (leave them NULL, attempt and enqueued_at at their defaults); the dispatcher delivers it to every endpoint of its tenant whose filter matches its event_type. Only a role that may UPDATE webhook_outbox (the dispatcher, an operator) may set them.';
END;
$$;

DO $do$
DECLARE
    tbl text;
BEGIN
    SELECT format('%I.%I', n.nspname, c.relname) INTO tbl
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'webhook_outbox'::regclass;
    EXECUTE 'DROP TRIGGER IF EXISTS webhook_outbox_routing_guard ON ' || tbl;
    EXECUTE format($tg$
        CREATE TRIGGER webhook_outbox_routing_guard
            BEFORE INSERT ON %1$s
            FOR EACH ROW
            WHEN ((NEW.endpoint_id IS NOT NULL OR NEW.routed_at IS NOT NULL OR NEW.order_key IS NOT NULL
                   OR NEW.lease_until IS NOT NULL OR NEW.leased_by IS NOT NULL OR NEW.lease_token IS NOT NULL
                   OR NEW.attempt IS DISTINCT FROM 1 OR NEW.enqueued_at > pg_catalog.now())
                  AND NOT pg_catalog.has_table_privilege(%2$L::pg_catalog.regclass, 'UPDATE'))
            EXECUTE FUNCTION webhook_outbox_routing_refused()
    $tg$, tbl, tbl);
END
$do$;

INSERT INTO webhook_schema_version (version) VALUES (14) ON CONFLICT (version) DO NOTHING;
