-- fluxhook schema 16: the management API's keys, and the audit trail of every change.
--
-- webhook_api_keys holds the keys the HTTP API (`fluxhook serve` with API_ADDR, `fluxhook api`)
-- accepts. A key is shown once, when it is made (`fluxhook api-keys add`, POST /v1/api-keys);
-- only its SHA-256 is stored, so a copy of this table (a backup, a replica, a SELECT by the
-- wrong role) lets nobody call the API. lookup is the key's public part, the characters after
-- "fhk_" up to the second underscore: the API finds the row by it and compares the hash in
-- constant time. tenant NULL is an admin key, which sees every tenant; a tenant key sees only
-- its tenant's endpoints, events, deliveries and dead letters. A revoked key stays, so that the
-- audit trail can still name it. last_used_at is written at most once a minute per key, so
-- that a busy key costs no write per request.
--
-- A portal session (kind 'portal', "fhp_..." instead of "fhk_...") is a key that expires: an
-- admin key makes one for a tenant (POST /v1/tenants/{tenant}/portal-sessions) and the
-- application shows its link to that tenant's people. It can do exactly what a key of that
-- tenant can, until expires_at.
CREATE TABLE IF NOT EXISTS webhook_api_keys (
    id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    lookup       text        NOT NULL UNIQUE,
    hash         bytea       NOT NULL,
    tenant       text,
    description  text        NOT NULL DEFAULT '',
    created_by   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz,
    kind         text        NOT NULL DEFAULT 'key' CHECK (kind IN ('key', 'portal')),
    expires_at   timestamptz
);

-- webhook_audit records every change made through the API or the CLI: endpoints (add, update,
-- rotate, enable, disable, remove), keys (add, revoke), replays and recoveries. actor names
-- the API key ("key:<id>") or the CLI's operating-system user ("cli:<user>"); tenant is the
-- changed object's tenant (NULL for an object without one), which is what a tenant key's
-- GET /v1/audit is scoped by. before and after are the object as JSON with its secrets and
-- header values left out: the trail says that a secret was rotated, never what it was.
CREATE TABLE IF NOT EXISTS webhook_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text        NOT NULL,
    tenant      text,
    action      text        NOT NULL,
    object_type text        NOT NULL,
    object_id   text        NOT NULL,
    before      jsonb,
    after       jsonb
);

-- A tenant's trail, newest first, is a walk of this index.
CREATE INDEX IF NOT EXISTS webhook_audit_tenant_idx ON webhook_audit (tenant, id);

INSERT INTO webhook_schema_version (version) VALUES (16) ON CONFLICT (version) DO NOTHING;
