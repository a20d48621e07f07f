package dispatcher_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
)

// OnBacklog is what widens serve's runtime for a drain: it must come with full claims, and
// never with live traffic that one claim takes whole.
func TestOnBacklogComesWithFullClaimsOnly(t *testing.T) {
	b := setup(t)
	c := newConsumer(t, nil)
	cfg := b.config(c.URL())
	cfg.BatchSize = 5
	var calls atomic.Int64
	cfg.OnBacklog = func() { calls.Add(1) }
	b.start(cfg)

	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the single event delivered", func() bool { return c.received() == 1 })
	b.waitSettled(10 * time.Second)
	if n := calls.Load(); n != 0 {
		t.Fatalf("OnBacklog called %d times for one event, which a claim of 5 takes whole", n)
	}

	const backlog = 23 // four full claims of 5, then a short one
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_outbox (event_type, payload)
		SELECT 'backlog', jsonb_build_object('i', i) FROM generate_series(1, $1) i`, backlog); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the backlog delivered", func() bool { return c.received() == 1+backlog })
	b.waitSettled(10 * time.Second)
	if n := int(calls.Load()); n < 1 || n > backlog/cfg.BatchSize {
		t.Fatalf("OnBacklog called %d times for %d rows claimed 5 at a time, want 1 to %d", n, backlog, backlog/cfg.BatchSize)
	}
}
