-- fluxhook schema 12: the hold-back horizon needs no grant on the outbox's id sequence.
--
-- webhook_outbox_horizon() reads the last value of the outbox's id sequence, which needs USAGE
-- or SELECT on it. That grant is optional for dispatchers (without it they route every
-- delivery through a queue row), but every claim calls the function while an endpoint orders
-- its streams: a dispatcher role without the grant failed every claim, for every endpoint and
-- tenant, for as long as one endpoint ordered. The function now runs as the schema owner,
-- with pg_catalog first in its search_path (every name in it is qualified or a literal). It
-- reveals what pg_locks and the sequence already show any role that may claim: the last id
-- drawn and the virtual transaction ids of the outbox's writers.

ALTER FUNCTION webhook_outbox_horizon() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

INSERT INTO webhook_schema_version (version) VALUES (12) ON CONFLICT (version) DO NOTHING;
