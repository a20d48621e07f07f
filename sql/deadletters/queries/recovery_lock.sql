-- The first statement of each batch of RunRecovery: the job ($1), locked until the batch
-- commits, so that two processes running one job (one resuming it while the other still
-- runs) take its batches in turn, each from the cursor the other left.
SELECT endpoint_id::text, tenant, since, state, created_at, cursor_failed_at, cursor_id
FROM webhook_recoveries
WHERE id = $1::uuid
FOR UPDATE
