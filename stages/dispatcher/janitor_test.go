package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestJanitorPrunesOldProcessedRows checks the janitor's wiring in a running dispatcher: the
// maintenance loop deletes processed rows settled longer ago than Retention, and keeps newer
// processed rows, unprocessed rows however old, and dead letters however old. The maintenance
// interval follows the poll interval, so a short poll makes the first pass come at once.
func TestJanitorPrunesOldProcessedRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	exec := func(q string) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Two hours old and ten minutes old, against a retention of one hour.
	exec(`INSERT INTO webhook_outbox (event_type, payload, processed, processed_at, status_code, created_at)
		SELECT 'old', '{}', true, now() - interval '2 hours', 200, now() - interval '2 hours'
		FROM generate_series(1, 3)`)
	exec(`INSERT INTO webhook_outbox (event_type, payload, processed, processed_at, status_code, created_at)
		SELECT 'recent', '{}', true, now() - interval '10 minutes', 200, now() - interval '10 minutes'
		FROM generate_series(1, 2)`)
	exec(`INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, reason, enqueued_at, failed_at)
		VALUES (gen_random_uuid(), 'dead', '{}', 9, 'attempts exhausted', now() - interval '30 days', now() - interval '30 days')`)
	// Due later, so the dispatcher leaves it alone: unprocessed rows are never the janitor's.
	exec(`INSERT INTO webhook_outbox (event_type, payload, created_at) VALUES ('pending', '{}', now() + interval '1 hour')`)

	c := newConsumer(t, nil)
	cfg := b.config(c.URL())
	cfg.PollInterval = 100 * time.Millisecond
	cfg.Retention = time.Hour
	b.start(cfg)

	eventually(t, 15*time.Second, "the old processed rows deleted", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE event_type = 'old'`) == 0
	})
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE event_type = 'recent'`); n != 2 {
		t.Errorf("%d of 2 processed rows within the retention left", n)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE event_type = 'pending' AND NOT processed`); n != 1 {
		t.Errorf("the pending row is gone")
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 1 {
		t.Errorf("%d dead letters left, want the month-old one kept", n)
	}
	if c.received() != 0 {
		t.Errorf("the consumer got %d requests, want none", c.received())
	}
}

// TestFirstSettleLandsInADatedPartition: a dispatcher started on a database whose delivery log
// has no partition for now yet (a fresh install) creates it before its first settle: nothing
// is written to the default partition, which the next maintenance would have to empty again.
func TestFirstSettleLandsInADatedPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if n := b.count(`SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'webhook_delivery_log'::regclass AND c.relname <> 'webhook_delivery_log_default'`); n != 0 {
		t.Fatalf("the fresh database has %d dated partitions of the log, want none", n)
	}
	const events = 20
	for range events {
		b.enqueue(outbox.Event{})
	}
	c := newConsumer(t, nil)
	b.start(b.config(c.URL()))
	b.waitSettled(15 * time.Second)
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE status_code = 200`); n != events {
		t.Fatalf("%d delivered rows in the log, want %d", n, events)
	}
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log_default`); n != 0 {
		t.Errorf("%d rows settled into the default partition, want none", n)
	}
}
