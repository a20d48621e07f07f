-- fluxhook schema 4: the wake-up moves from a trigger into a column's DEFAULT.
--
-- Why. Schema 3's statement trigger cost producers 9-18% of their commit throughput while a
-- dispatcher was busy, that is, while its condition was false and it sent nothing (fluxhook
-- bench, producers workload, 8 and 32 producers with prepared inserts; their backends spent
-- 12-16% more CPU per commit). Most of that is the trigger's existence: PostgreSQL sets up
-- the after-trigger machinery for every statement that can fire it, prepares its WHEN afresh
-- and calls PL/pgSQL for it once per transaction. A column DEFAULT is part of the INSERT's
-- own plan: a prepared insert plans it once and then evaluates a few built-in functions per
-- row (the bench: backends' CPU per commit +4-7%). An insert planned on every execution
-- (node-postgres, psql, poolers in transaction mode) plans the DEFAULT each time, which costs
-- about what the trigger cost (perf on one pgbench connection: +5% of the backend's samples,
-- the trigger +4%). README, Measurements, has the numbers and the commands.
--
-- Why an expression and not a function. The expression is stored parsed, with the switch's
-- sequence as an OID: planning an insert reads the stored tree. An SQL function in the
-- DEFAULT would be inlined, but inlining parses and analyses the function's text on every
-- planning (16% of an unprepared insert's backend CPU); a PL/pgSQL function is a call per row
-- with a per-transaction setup (as costly as the trigger in the bench).
--
-- What changes for producers: nothing they write. An INSERT or COPY that does not name the
-- column (every INSERT fluxhook documents) evaluates the default for each row, which tests
-- schema 3's condition and NOTIFYs when it holds. NOTIFY collapses one transaction's identical
-- notifications into one, so a multi-row INSERT or COPY still sends at most one; the test runs
-- per row (about half a microsecond: 200,000 rows in one INSERT took 0.85-0.90 s without it,
-- 0.91-1.07 s with it). An INSERT that names wake_notified, or a COPY that lists it, supplies
-- its own value and sends no NOTIFY: its rows wait for the next claim (at most the poll
-- interval). The column holds true when the row's insert sent a NOTIFY, NULL otherwise;
-- nothing reads it. Producers need SELECT on the sequence (granted to PUBLIC by schema 2) and
-- nothing else; their search_path does not matter, since the expression names everything by
-- OID.
--
-- The order inside the test matters. pg_current_xact_id() comes first: it gives the producer
-- its transaction id before it reads the switch, as the trigger did by running after the row
-- was inserted. A dispatcher that sets the switch then claims with a snapshot in which every
-- producer that read the switch too early is either committed (its rows claimed) or in
-- progress (watched until it commits); see stages/dispatcher's looks after arming. A
-- dispatcher's own inserts (retries, deferrals) notify no one, as before.
--
-- The column is added without a default first: a volatile default given in ADD COLUMN
-- rewrites the whole table under an exclusive lock; SET DEFAULT afterwards only applies to new
-- rows. The trigger goes in the same transaction, so no insert notifies twice or not at all.
ALTER TABLE webhook_outbox ADD COLUMN IF NOT EXISTS wake_notified boolean;
ALTER TABLE webhook_outbox ALTER COLUMN wake_notified SET DEFAULT
    CASE WHEN pg_current_xact_id() IS NOT NULL
          AND to_timestamp(pg_sequence_last_value('webhook_outbox_notify_until'::regclass)::float8 / 1000) > statement_timestamp()
          AND current_setting('fluxhook.dispatcher', true) IS DISTINCT FROM 'on'
         THEN pg_notify('webhook_outbox', pg_current_xact_id()::text)::text IS NOT NULL
    END;

DROP TRIGGER IF EXISTS webhook_outbox_notify ON webhook_outbox;
DROP FUNCTION IF EXISTS webhook_outbox_notify();
DROP FUNCTION IF EXISTS webhook_outbox_notify_wanted();

INSERT INTO webhook_schema_version (version) VALUES (4) ON CONFLICT (version) DO NOTHING;
