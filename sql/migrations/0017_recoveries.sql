-- fluxhook schema 17: recovery jobs, and the dead-letter indexes the management API reads by.
--
-- A recovery replays every dead letter of one endpoint since a time: what a team does once
-- the consumer behind that endpoint is fixed. It can be thousands of dead letters, too many
-- for one transaction and one HTTP request, so it is a job: started by a request
-- (deadletters.StartRecovery), run in the background in batches, each batch one transaction
-- that replays its dead letters and records the progress (deadletters.RunRecovery), and read
-- back while it runs (GET shows done of total). Nothing here delivers anything: a replay is
-- an ordinary outbox row, as `fluxhook dlq replay` writes.
--
-- Safe to run twice: a batch replays only dead letters not replayed yet, under their row
-- locks, so two jobs over the same dead letters (or one job resumed by two processes) never
-- enqueue an event twice: the second finds replayed_at set and skips the row.
--
-- One job runs per endpoint at a time (the unique index below): each job is a goroutine in the
-- API process holding its connections for its batches, shared with every tenant's requests, so
-- a caller must not start any number of them. A second start is answered with the running job;
-- a running job is cancelled by its id, and stops at its next batch.

CREATE TABLE IF NOT EXISTS webhook_recoveries (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- The endpoint whose dead letters are replayed, to that same endpoint. No foreign key:
    -- the job's record outlives an endpoint removed while (or after) it runs, as dead
    -- letters do; a job whose endpoint is gone or disabled stops as 'failed'.
    endpoint_id uuid        NOT NULL,
    -- The endpoint's tenant when the job started (NULL for none): a tenant's API key sees
    -- only its tenant's jobs, and the job's replays are scoped to that tenant in SQL.
    tenant      text,
    -- Dead letters that failed at or after since, and before created_at: the upper bound
    -- keeps the job from chasing the failures of its own replays.
    since       timestamptz NOT NULL,
    -- running until every batch is done; done; failed (error says why); or cancelled by a
    -- caller, which the job sees at its next batch. A process that dies leaves its job
    -- 'running': another resumes it from its cursor (below), since the cursor and the replays
    -- of a batch commit together.
    state       text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed', 'cancelled')),
    -- total: the dead letters not yet replayed when the job started. done: those the job has
    -- dealt with since, replayed or skipped (already replayed meanwhile, superseded by a later
    -- dead letter of the same delivery, of another tenant); replayed: of those, the events it
    -- enqueued again. total is raised if done passes it (a dead letter committed late).
    total       integer     NOT NULL DEFAULT 0 CHECK (total >= 0),
    done        integer     NOT NULL DEFAULT 0 CHECK (done >= 0),
    replayed    integer     NOT NULL DEFAULT 0 CHECK (replayed >= 0),
    error       text,
    -- Who started it: an API key's id or a CLI user, for the audit trail and the UI.
    created_by  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Moved by every batch: a 'running' job not updated for a while was left by a process
    -- that died (deadletters.ResumeStale).
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    -- The last dead letter dealt with, in (failed_at, id) order: where a resumed job goes on.
    cursor_failed_at timestamptz,
    cursor_id   bigint
);

-- ResumeStale looks for running jobs only; there are few, and the finished ones pile up.
CREATE INDEX IF NOT EXISTS webhook_recoveries_running_idx ON webhook_recoveries (updated_at) WHERE state = 'running';

-- One running job per endpoint: StartRecovery inserts ON CONFLICT against this index, so two
-- starts at once make one job, and the other is told which.
CREATE UNIQUE INDEX IF NOT EXISTS webhook_recoveries_one_running_idx ON webhook_recoveries (endpoint_id) WHERE state = 'running';

-- The API lists an endpoint's dead letters, and a tenant's, newest first with a keyset cursor
-- ((failed_at, id) below the last row's), and a recovery reads an endpoint's since a time in
-- the opposite order. Without these, a small tenant's or a quiet endpoint's first page walks
-- the failed_at index across every other dead letter (the table is never purged by itself).
-- Partial: a WEBHOOK_URL delivery has no endpoint and an event may have no tenant, and such
-- rows are never looked up by these. Each dead-lettering pays up to two index entries: dead
-- letters are the rare path.
CREATE INDEX IF NOT EXISTS webhook_dead_letter_endpoint_idx ON webhook_dead_letter (endpoint_id, failed_at, id)
    WHERE endpoint_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS webhook_dead_letter_tenant_idx ON webhook_dead_letter (tenant, failed_at, id)
    WHERE tenant IS NOT NULL;

INSERT INTO webhook_schema_version (version) VALUES (17) ON CONFLICT (version) DO NOTHING;
