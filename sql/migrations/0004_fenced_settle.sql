-- fluxhook schema 4: settles fenced by the claim that leased the row, and deferrals that move a
-- row in place.
--
-- lease_token. A claim stamps every row it leases with a token of its own (with leased_by, the
-- instance). Every settle of the row (delivered, retry, dead letter, deferral, release)
-- writes only while both still match: when a lease runs out during a slow attempt and another
-- claim takes the row, the first holder's late outcome (a 410 after the new holder's 200, a
-- second retry row) is refused instead of overwriting the current holder's. Like lease_until
-- it is in no index, so taking a lease stays a HOT update.
--
-- deferred_reason. A row held back by the gate (open circuit, probe in flight, retry rate
-- limit) is no longer re-enqueued as a new row: its due time (created_at) moves in place and
-- the reason is kept here, for `fluxhook status` and the logs. It is cleared when the row is
-- next attempted.
--
-- Both are nullable columns without a default: adding them rewrites nothing (a brief lock on
-- the table while the catalog changes).
ALTER TABLE webhook_outbox ADD COLUMN IF NOT EXISTS lease_token bigint;
ALTER TABLE webhook_outbox ADD COLUMN IF NOT EXISTS deferred_reason text;

INSERT INTO webhook_schema_version (version) VALUES (4) ON CONFLICT (version) DO NOTHING;
