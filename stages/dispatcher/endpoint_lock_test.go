package dispatcher_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
)

// lockedEndpoint starts a dispatcher with endpoint A (event types a.*, answered by a) and
// endpoint B (b.*, answered by other), then locks A's row in another session's transaction
// (mode: a row-locking clause), as an operator's psql session, an API change or a recovery
// batch would; the transaction is rolled back at cleanup unless the test ends it.
func lockedEndpoint(t *testing.T, a, other *consumer, mode string) (*bundle, endpoints.Endpoint, pgx.Tx) {
	t.Helper()
	b := setup(t)
	epA := b.addEndpoint(endpoints.New{URL: a.URL(), EventTypes: []string{"a.*"}})
	b.addEndpoint(endpoints.New{URL: other.URL(), EventTypes: []string{"b.*"}})
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	b.start(cfg)
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM webhook_endpoints WHERE id = $1 `+mode, epA.ID); err != nil {
		t.Fatal(err)
	}
	return b, epA, tx
}

// TestLockedEndpointRowHoldsNoSettle: a transaction that holds one managed endpoint's row
// locked does not hold up the settles of other endpoints' deliveries. Recording endpoint A's
// first success waited for the lock inside the one settle goroutine: endpoint B's deliveries
// stayed unsettled for as long as the transaction lived, and were sent again at each lease's
// end.
func TestLockedEndpointRowHoldsNoSettle(t *testing.T) {
	t.Parallel()
	a, other := newConsumer(t, nil), newConsumer(t, nil)
	b, epA, tx := lockedEndpoint(t, a, other, "FOR UPDATE")
	first := b.enqueue(outbox.Event{EventType: "a.first"}) // A's first success: an outcome to record
	eventually(t, 10*time.Second, "A's delivery settled while its endpoint's row is locked", func() bool {
		return b.count(`SELECT count(*) FROM webhook_outbox WHERE delivery_id = $1`, first) == 0 && a.received() == 1
	})
	for range 5 {
		b.enqueue(outbox.Event{EventType: "b.event"})
	}
	eventually(t, 10*time.Second, "B's deliveries settled while A's row is locked", func() bool {
		return b.count(`SELECT count(*) FROM webhook_outbox`) == 0
	})
	if n := other.received(); n != 5 {
		t.Errorf("endpoint B received %d requests for its 5 events, want 5", n)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A's success, waiting for its row while it was locked, is recorded once it is free.
	eventually(t, 10*time.Second, "A's success recorded once its row is free", func() bool {
		return b.count(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND last_success_at IS NOT NULL`, epA.ID) == 1
	})
}

// TestLockedEndpointRowKeepsItsGone: a 410 Gone answered while another session holds the
// endpoint's row locked disables the endpoint once the row is free: the record waits for the
// lock (off the settle goroutine), it is not dropped.
func TestLockedEndpointRowKeepsItsGone(t *testing.T) {
	t.Parallel()
	gone := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusGone) })
	b, epA, tx := lockedEndpoint(t, gone, newConsumer(t, nil), "FOR SHARE")
	first := b.enqueue(outbox.Event{EventType: "a.first"})
	eventually(t, 10*time.Second, "A's 410 settled while its row is locked", func() bool {
		return b.count(`SELECT count(*) FROM webhook_outbox WHERE delivery_id = $1`, first) == 0
	})
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "A disabled for its 410 once its row is free", func() bool {
		return b.count(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND NOT enabled AND disabled_reason LIKE '%410%'`, epA.ID) == 1
	})
}

// TestLockedOutboxRowHoldsNoSettle: a transaction outside fluxhook that locks a delivery's row
// of the queue while it is in flight (an operator's SELECT ... FOR UPDATE) does not hold up the
// settles of the others: the settle waits a second for the row, then leaves it to its lease,
// saying so in the log, and the delivery is sent again once the transaction has ended. Waiting
// for it stopped every settle of the instance for as long as the transaction lived. Both ways a
// delivery is held: its own row (WEBHOOK_URL), and its event's row (a managed endpoint's
// delivery routed in memory).
func TestLockedOutboxRowHoldsNoSettle(t *testing.T) {
	t.Parallel()
	for _, managed := range []bool{false, true} {
		name := "default URL"
		if managed {
			name = "endpoint routed in memory"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lockedOutboxRow(t, managed)
		})
	}
}

func lockedOutboxRow(t *testing.T, managed bool) {
	held := make(chan struct{})
	answer := make(chan struct{})
	var once sync.Once
	c := newConsumer(t, func(a arrival, _ http.ResponseWriter) {
		if a.Event == "held" && a.Attempt == "1" {
			once.Do(func() { close(held) })
			select {
			case <-answer:
			case <-a.Ctx.Done():
			}
		}
	})
	b := setup(t)
	cfg, logs := b.observedConfig(c.URL(), zapcore.ErrorLevel)
	if managed {
		b.addEndpoint(endpoints.New{URL: c.URL()})
		cfg.DefaultURL, cfg.EncryptionKey = "", testKey
	}
	cfg.Timeout, cfg.Lease = 2*time.Second, 5*time.Second // the locked row comes back soon
	b.start(cfg)
	b.enqueue(outbox.Event{EventType: "held"})
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the first delivery did not arrive")
	}
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var locked int64
	if err := tx.QueryRow(ctx, `SELECT id FROM webhook_outbox FOR UPDATE`).Scan(&locked); err != nil {
		t.Fatalf("locking the one row in flight: %v", err)
	}
	close(answer) // delivered: its settle finds the row locked
	for range 5 {
		b.enqueue(outbox.Event{EventType: "free"})
	}
	eventually(t, 20*time.Second, "the other deliveries settled while the row in flight is locked", func() bool {
		return b.count(`SELECT count(*) FROM webhook_outbox WHERE id <> $1`, locked) == 0 && c.received() == 6
	})
	if n := b.count(`SELECT count(*) FROM webhook_outbox WHERE id = $1 AND NOT processed`, locked); n != 1 {
		t.Fatalf("the locked row: %d in the queue, want it left there to its lease", n)
	}
	eventually(t, 10*time.Second, "the unsettled delivery logged", func() bool {
		return logs.FilterMessageSnippet("will be delivered again after").Len() > 0
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the locked delivery sent again and settled once its row is free", func() bool {
		n := 0
		for _, a := range c.arrivals() {
			if a.Event == "held" {
				n++
			}
		}
		return n == 2 && b.count(`SELECT count(*) FROM webhook_outbox`) == 0
	})
}
