-- fluxhook schema 5: endpoints. Many consumers, each with its own URL, secret, event filter,
-- tenant and lifecycle; one event fans out to every enabled endpoint it matches.
--
-- Producers are unchanged: they insert one row per event into webhook_outbox, optionally with
-- a tenant. The dispatcher routes each claimed event (one statement per claimed batch) by
-- inserting one delivery row per matching endpoint (endpoint_id set), already leased to
-- itself, and marks the event row routed. Each delivery row then has its own retries, breaker,
-- rate limit and dead letter, like any outbox row. The event's delivery_id is shared by its
-- endpoints' deliveries, as Standard Webhooks' message id is: it is the id the producer got
-- back and logged, and a consumer that owns several endpoints sees one event once.
--
-- With no rows in webhook_endpoints nothing is routed, and WEBHOOK_URL and per-row
-- endpoint_url work exactly as in schema 4.

CREATE TABLE IF NOT EXISTS webhook_endpoints (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    url             text        NOT NULL,
    description     text        NOT NULL DEFAULT '',
    -- NULL: the endpoint receives events without a tenant only; otherwise only its tenant's.
    tenant          text,
    -- Event-type filter: exact names and "prefix.*" patterns; empty receives every event.
    event_types     text[]      NOT NULL DEFAULT '{}',
    scheme          text        NOT NULL DEFAULT 'fluxora' CHECK (scheme IN ('fluxora', 'standard')),
    -- The signing secret: "enc:v1:<base64>" when encrypted with WEBHOOK_ENCRYPTION_KEY
    -- (AES-256-GCM), otherwise the secret itself, in clear.
    secret          text        NOT NULL,
    -- The secret being rotated out, and until when it still signs (Standard sends both).
    previous_secret text,
    previous_secret_expires_at timestamptz,
    enabled         boolean     NOT NULL DEFAULT true,
    disabled_at     timestamptz,
    disabled_reason text,
    -- Overrides of WEBHOOK_RETRY_RPS and WEBHOOK_ENDPOINT_CONCURRENCY; NULL = the default.
    retry_rps       integer     CHECK (retry_rps > 0),
    max_concurrency integer     CHECK (max_concurrency > 0),
    -- Extra request headers, a JSON object of strings; the signature headers are reserved.
    headers         jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    -- Lifecycle: the last 2xx, and since when every attempt has failed (NULL while healthy).
    last_success_at timestamptz,
    failing_since   timestamptz,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX IF NOT EXISTS webhook_endpoints_tenant_idx ON webhook_endpoints (tenant) WHERE enabled;

-- Bumped by every change to what dispatchers use of webhook_endpoints (SQL or CLI): they read it
-- with each claim, without a snapshot, and reload their endpoint cache when it moved. The
-- lifecycle columns the dispatchers write themselves (last_success_at, failing_since) do not
-- bump it, or every healthy endpoint would make every dispatcher reload.
-- START 1: the first change makes it 1, so 0 (never called, NULL) means "no endpoint was ever written".
CREATE SEQUENCE IF NOT EXISTS webhook_endpoints_version AS bigint MINVALUE 0 START 1;

CREATE OR REPLACE FUNCTION webhook_endpoints_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('webhook_endpoints_version');
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION webhook_endpoints_touch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := clock_timestamp();
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS webhook_endpoints_changed ON webhook_endpoints;
CREATE TRIGGER webhook_endpoints_changed
    AFTER INSERT OR DELETE ON webhook_endpoints
    FOR EACH ROW EXECUTE FUNCTION webhook_endpoints_changed();

DROP TRIGGER IF EXISTS webhook_endpoints_changed_update ON webhook_endpoints;
CREATE TRIGGER webhook_endpoints_changed_update
    AFTER UPDATE ON webhook_endpoints
    FOR EACH ROW
    WHEN ((OLD.url, OLD.tenant, OLD.event_types, OLD.scheme, OLD.secret, OLD.previous_secret,
           OLD.previous_secret_expires_at, OLD.enabled, OLD.disabled_reason, OLD.retry_rps,
           OLD.max_concurrency, OLD.headers, OLD.created_at)
          IS DISTINCT FROM
          (NEW.url, NEW.tenant, NEW.event_types, NEW.scheme, NEW.secret, NEW.previous_secret,
           NEW.previous_secret_expires_at, NEW.enabled, NEW.disabled_reason, NEW.retry_rps,
           NEW.max_concurrency, NEW.headers, NEW.created_at))
    EXECUTE FUNCTION webhook_endpoints_changed();

DROP TRIGGER IF EXISTS webhook_endpoints_truncated ON webhook_endpoints;
CREATE TRIGGER webhook_endpoints_truncated
    AFTER TRUNCATE ON webhook_endpoints
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_endpoints_changed();

DROP TRIGGER IF EXISTS webhook_endpoints_touch ON webhook_endpoints;
CREATE TRIGGER webhook_endpoints_touch
    BEFORE UPDATE ON webhook_endpoints
    FOR EACH ROW EXECUTE FUNCTION webhook_endpoints_touch();

-- tenant: the producer's optional tenant of an event. endpoint_id: the endpoint a delivery
-- row goes to (NULL for an event row and for rows sent to endpoint_url or WEBHOOK_URL).
-- routed_at: when the dispatcher fanned the event out (NULL: not yet, or never needed).
-- Nullable, no default: adding them rewrites nothing.
ALTER TABLE webhook_outbox ADD COLUMN IF NOT EXISTS tenant text;
ALTER TABLE webhook_outbox ADD COLUMN IF NOT EXISTS endpoint_id uuid;
ALTER TABLE webhook_outbox ADD COLUMN IF NOT EXISTS routed_at timestamptz;

ALTER TABLE webhook_dead_letter ADD COLUMN IF NOT EXISTS tenant text;
ALTER TABLE webhook_dead_letter ADD COLUMN IF NOT EXISTS endpoint_id uuid;

INSERT INTO webhook_schema_version (version) VALUES (5) ON CONFLICT (version) DO NOTHING;
