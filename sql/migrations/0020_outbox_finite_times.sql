-- fluxhook schema 20: an outbox row may not be due, or enqueued, at '-infinity'; a change of an
-- endpoint's id moves the endpoints' version.
--
-- PostgreSQL accepts '-infinity' in a timestamptz, but no client time type holds it: the claim
-- that took such a row (the first of the due index, so in every claim) failed as it read it,
-- after its leases were taken, and each lease's end brought the row back with the oldest due
-- rows beside it, none of them ever delivered. The row is refused as it is written, every
-- role alike, with the constraint's name in the error: write the time it is due (created_at
-- defaults to now()) and leave enqueued_at to its default. 'infinity' stays allowed in
-- created_at: the dispatcher parks a stopped stream's rows there.
--
-- NOT VALID: adding it reads no row. The pending rows already written so are made due now,
-- which is what '-infinity' asked for; a processed one is no claim's concern. Producers pay two
-- comparisons per row.

-- An UPDATE of an endpoint's id moves the endpoints' version too: it is another endpoint to a
-- dispatcher's cache, which otherwise kept routing by the old id until its periodic re-read.
-- The trigger is schema 18's with id added, and stays ENABLE ALWAYS (schema 10). First: its
-- ACCESS EXCLUSIVE lock on webhook_endpoints may wait behind a reader of that table, and
-- waiting there before the outbox's lock is taken holds back claims, not producers.
DROP TRIGGER IF EXISTS webhook_endpoints_changed_update ON webhook_endpoints;
CREATE TRIGGER webhook_endpoints_changed_update
    AFTER UPDATE ON webhook_endpoints
    FOR EACH ROW
    WHEN ((OLD.id, OLD.url, OLD.tenant, OLD.event_types, OLD.scheme, OLD.secret, OLD.previous_secret,
           OLD.previous_secret_expires_at, OLD.enabled, OLD.disabled_reason, OLD.retry_rps,
           OLD.max_concurrency, OLD.headers, OLD.created_at, OLD.ordering, OLD.ordering_failure,
           OLD.permanent_statuses, OLD.restricted)
          IS DISTINCT FROM
          (NEW.id, NEW.url, NEW.tenant, NEW.event_types, NEW.scheme, NEW.secret, NEW.previous_secret,
           NEW.previous_secret_expires_at, NEW.enabled, NEW.disabled_reason, NEW.retry_rps,
           NEW.max_concurrency, NEW.headers, NEW.created_at, NEW.ordering, NEW.ordering_failure,
           NEW.permanent_statuses, NEW.restricted))
    EXECUTE FUNCTION webhook_endpoints_changed();
ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_changed_update;

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'webhook_outbox_times_finite'
                   AND conrelid = 'webhook_outbox'::regclass) THEN
        ALTER TABLE webhook_outbox ADD CONSTRAINT webhook_outbox_times_finite
            CHECK (created_at <> '-infinity' AND enqueued_at <> '-infinity') NOT VALID;
    END IF;
END
$do$;

-- After the constraint: adding it waits for the inserts in flight, and refuses later ones, so
-- this update sees every such row (run before it, it missed a producer's row committed
-- meanwhile, which then failed every claim's update of it). One update for both columns: the
-- constraint checks every row an update writes, and a row with both at '-infinity' fixed one
-- column at a time failed the first update, and the migration.
UPDATE webhook_outbox
SET created_at = CASE WHEN created_at = '-infinity' THEN now() ELSE created_at END,
    enqueued_at = CASE WHEN enqueued_at = '-infinity'
                       THEN least(CASE WHEN created_at = '-infinity' THEN now() ELSE created_at END, now())
                       ELSE enqueued_at END
WHERE NOT processed AND (created_at = '-infinity' OR enqueued_at = '-infinity');

COMMENT ON CONSTRAINT webhook_outbox_times_finite ON webhook_outbox IS
    'created_at and enqueued_at may not be -infinity, which no client time type holds: write the time the event is due (created_at defaults to now()), and leave enqueued_at to its default.';

INSERT INTO webhook_schema_version (version) VALUES (20) ON CONFLICT (version) DO NOTHING;
