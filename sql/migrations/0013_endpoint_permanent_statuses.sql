-- fluxhook schema 13: an endpoint may override WEBHOOK_PERMANENT_STATUSES.
--
-- permanent_statuses lists the answers that dead-letter its deliveries at once, besides 410
-- Gone: NULL (the default) keeps the dispatcher's setting (WEBHOOK_PERMANENT_STATUSES, default
-- 413); '{}' dead-letters none but 410. Every element is an HTTP status from 300 to 599 (a 2xx
-- is delivered whatever the list says). Written by `fluxhook endpoints add|update
-- --permanent-statuses`.
ALTER TABLE webhook_endpoints ADD COLUMN IF NOT EXISTS permanent_statuses integer[];
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'webhook_endpoints_permanent_statuses_check') THEN
        ALTER TABLE webhook_endpoints ADD CONSTRAINT webhook_endpoints_permanent_statuses_check
            CHECK (300 <= ALL (permanent_statuses) AND 599 >= ALL (permanent_statuses)
                   AND array_position(permanent_statuses, NULL) IS NULL);
    END IF;
END
$do$;

-- Dispatchers reload their endpoints when the version moves: the new column counts. The
-- trigger is the one of schema 6 with permanent_statuses added, and stays ENABLE ALWAYS
-- (schema 10) so that logical replication and session_replication_role = replica bump too.
DROP TRIGGER IF EXISTS webhook_endpoints_changed_update ON webhook_endpoints;
CREATE TRIGGER webhook_endpoints_changed_update
    AFTER UPDATE ON webhook_endpoints
    FOR EACH ROW
    WHEN ((OLD.url, OLD.tenant, OLD.event_types, OLD.scheme, OLD.secret, OLD.previous_secret,
           OLD.previous_secret_expires_at, OLD.enabled, OLD.disabled_reason, OLD.retry_rps,
           OLD.max_concurrency, OLD.headers, OLD.created_at, OLD.ordering, OLD.ordering_failure,
           OLD.permanent_statuses)
          IS DISTINCT FROM
          (NEW.url, NEW.tenant, NEW.event_types, NEW.scheme, NEW.secret, NEW.previous_secret,
           NEW.previous_secret_expires_at, NEW.enabled, NEW.disabled_reason, NEW.retry_rps,
           NEW.max_concurrency, NEW.headers, NEW.created_at, NEW.ordering, NEW.ordering_failure,
           NEW.permanent_statuses))
    EXECUTE FUNCTION webhook_endpoints_changed();
ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_changed_update;

INSERT INTO webhook_schema_version (version) VALUES (13) ON CONFLICT (version) DO NOTHING;
