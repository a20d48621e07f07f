-- Replay's last statement, when replay.sql returned rows that need an order key (see there):
-- each takes its own id. They are rows of this transaction, which no claim sees before it
-- commits: none can be taken without its key.
UPDATE webhook_outbox SET order_key = id WHERE id = ANY ($1::bigint[])
