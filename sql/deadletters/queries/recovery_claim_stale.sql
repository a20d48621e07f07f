-- ResumeStale: the running jobs not moved for $1 microseconds, left by a process that died,
-- claimed by moving their updated_at: another process calling ResumeStale at the same time
-- skips them (SKIP LOCKED, then the age test), and so does one a little later. A job whose
-- batch is in progress is locked by it, and skipped.
UPDATE webhook_recoveries r
SET updated_at = now()
WHERE r.id IN (SELECT s.id FROM webhook_recoveries s
               WHERE s.state = 'running' AND s.updated_at < now() - $1::bigint * interval '1 microsecond'
               ORDER BY s.updated_at
               FOR UPDATE SKIP LOCKED)
RETURNING r.id::text
