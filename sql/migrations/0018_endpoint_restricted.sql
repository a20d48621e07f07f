-- fluxhook schema 18: an endpoint whose URL a tenant wrote reaches only what a producer's
-- endpoint_url may.
--
-- The management API lets a tenant (a tenant key, a portal session) set an endpoint's URL and
-- read back what its server answered: status, timing, the start of the body. Held to the
-- operator's policy (loopback URLs, WEBHOOK_ALLOWED_NETWORKS), such an endpoint would let a
-- tenant reach, and read, the services on the dispatcher's host and in its private network.
-- restricted marks it: the dispatcher dials it as it dials a row's endpoint_url (public
-- addresses, plus WEBHOOK_ROW_URL_NETWORKS), and the API checks its URL the same way. A tenant's
-- write of the URL sets it; an admin key's or the CLI's write of the URL clears it (the
-- operator vouches for the URL). false for every existing endpoint: the operator made them, or
-- an API that checked them against the operator's policy did; an operator who let tenants
-- create endpoints before this schema reviews them (restricted = true where the URL is the
-- tenant's).
ALTER TABLE webhook_endpoints ADD COLUMN IF NOT EXISTS restricted boolean NOT NULL DEFAULT false;

-- Dispatchers reload their endpoints when the version moves, and restricted changes how one is
-- dialled: the column counts. The trigger is schema 13's with restricted added, and stays
-- ENABLE ALWAYS (schema 10) so that logical replication and session_replication_role =
-- replica bump too.
DROP TRIGGER IF EXISTS webhook_endpoints_changed_update ON webhook_endpoints;
CREATE TRIGGER webhook_endpoints_changed_update
    AFTER UPDATE ON webhook_endpoints
    FOR EACH ROW
    WHEN ((OLD.url, OLD.tenant, OLD.event_types, OLD.scheme, OLD.secret, OLD.previous_secret,
           OLD.previous_secret_expires_at, OLD.enabled, OLD.disabled_reason, OLD.retry_rps,
           OLD.max_concurrency, OLD.headers, OLD.created_at, OLD.ordering, OLD.ordering_failure,
           OLD.permanent_statuses, OLD.restricted)
          IS DISTINCT FROM
          (NEW.url, NEW.tenant, NEW.event_types, NEW.scheme, NEW.secret, NEW.previous_secret,
           NEW.previous_secret_expires_at, NEW.enabled, NEW.disabled_reason, NEW.retry_rps,
           NEW.max_concurrency, NEW.headers, NEW.created_at, NEW.ordering, NEW.ordering_failure,
           NEW.permanent_statuses, NEW.restricted))
    EXECUTE FUNCTION webhook_endpoints_changed();
ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_changed_update;

INSERT INTO webhook_schema_version (version) VALUES (18) ON CONFLICT (version) DO NOTHING;
