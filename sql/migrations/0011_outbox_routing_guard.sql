-- fluxhook schema 11: producers cannot address managed endpoints.
--
-- The columns by which the dispatcher routes and leases a row (endpoint_id, routed_at,
-- order_key, lease_until, leased_by, lease_token) are the dispatcher's. A producer that set
-- endpoint_id sent its event to that endpoint, signed with its secret and carrying its
-- headers, past its filter and its creation time. An INSERT that sets any of them is now
-- refused (insufficient_privilege, naming the columns) unless the inserting role may UPDATE
-- webhook_outbox: such a role (the dispatcher, an operator replaying dead letters) could set
-- them on any row anyway, while a producer needs, and should have, INSERT alone. The rule is
-- the role's privilege, which a producer cannot grant itself, rather than a setting any
-- session can make (fluxhook.dispatcher only quiets the wake-up).
--
-- Producers pay nothing for it: the trigger's WHEN tests the six columns for NULL, and a row
-- that sets none of them calls no function. Rows that set them (the dispatcher's own) add one
-- privilege check from the catalog cache, and still call no function.

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
    RAISE EXCEPTION 'webhook_outbox: a producer may not set %: fluxhook''s dispatcher sets them when it routes the event',
        pg_catalog.array_to_string(cols, ', ')
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Insert the event without these columns (leave them NULL); the dispatcher delivers it to every endpoint of its tenant whose filter matches its event_type. Only a role that may UPDATE webhook_outbox (the dispatcher, an operator) may set them.';
END;
$$;

-- The table is named in the condition with its schema, resolved here (a regclass constant):
-- the condition is evaluated under the inserting session's search_path.
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
                   OR NEW.lease_until IS NOT NULL OR NEW.leased_by IS NOT NULL OR NEW.lease_token IS NOT NULL)
                  AND NOT pg_catalog.has_table_privilege(%2$L::pg_catalog.regclass, 'UPDATE'))
            EXECUTE FUNCTION webhook_outbox_routing_refused()
    $tg$, tbl, tbl);
END
$do$;

INSERT INTO webhook_schema_version (version) VALUES (11) ON CONFLICT (version) DO NOTHING;
