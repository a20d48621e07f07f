-- fluxhook schema 20: an outbox row may not be due, or enqueued, at '-infinity'.
--
-- PostgreSQL accepts '-infinity' in a timestamptz, but no client time type holds it: the claim
-- that took such a row (the first of the due index, so in every claim) failed as it read it,
-- after its leases were taken, and each lease's end brought the row back with the oldest due
-- rows beside it, none of them ever delivered. The row is refused as it is written, every
-- role alike, with the constraint's name in the error: write the time it is due (created_at
-- defaults to now()) and leave enqueued_at to its default. 'infinity' stays allowed in
-- created_at: the dispatcher parks a stopped stream's rows there.
--
-- NOT VALID: adding it reads no row, and holds the outbox's lock for an instant only. The
-- pending rows already written so are made due now, which is what '-infinity' asked for; a
-- processed one is no claim's concern. Producers pay two comparisons per row.

UPDATE webhook_outbox SET created_at = now()
WHERE NOT processed AND created_at = '-infinity';

UPDATE webhook_outbox SET enqueued_at = least(created_at, now())
WHERE NOT processed AND enqueued_at = '-infinity';

DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'webhook_outbox_times_finite'
                   AND conrelid = 'webhook_outbox'::regclass) THEN
        ALTER TABLE webhook_outbox ADD CONSTRAINT webhook_outbox_times_finite
            CHECK (created_at <> '-infinity' AND enqueued_at <> '-infinity') NOT VALID;
    END IF;
END
$do$;

COMMENT ON CONSTRAINT webhook_outbox_times_finite ON webhook_outbox IS
    'created_at and enqueued_at may not be -infinity, which no client time type holds: write the time the event is due (created_at defaults to now()), and leave enqueued_at to its default.';

INSERT INTO webhook_schema_version (version) VALUES (20) ON CONFLICT (version) DO NOTHING;
