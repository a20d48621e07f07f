-- fluxhook schema 8: vacuum never shrinks the queue's file.
--
-- webhook_outbox grows and shrinks with its backlog: every row is inserted, leased and deleted
-- within milliseconds, so the pages at the end of the file are often empty when autovacuum
-- comes by (every 10 s at the recommended naptime), and a vacuum with empty pages at the end
-- truncates them. Truncating takes the table's ACCESS EXCLUSIVE lock: producers' inserts,
-- claims and settles wait behind it, the next inserts extend the file again at once, and on a
-- hot standby the replayed lock blocks every read of the table. The space is wanted back within
-- seconds; keeping it costs nothing. (Measured in a 12-minute soak at 1,380 events/s: 16 of the
-- queue's 70 autovacuums truncated it, by 38 to 626 pages.)
--
-- ALTER TABLE ... SET of a vacuum parameter takes a SHARE UPDATE EXCLUSIVE lock, which
-- producers' inserts, claims and settles do not wait for: this upgrades a running
-- installation in place.
ALTER TABLE webhook_outbox SET (vacuum_truncate = false);

INSERT INTO webhook_schema_version (version) VALUES (8) ON CONFLICT (version) DO NOTHING;
