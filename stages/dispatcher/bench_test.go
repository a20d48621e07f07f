package dispatcher_test

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/sql/outbox"
)

// BenchmarkDrain measures how fast one dispatcher drains a prefilled backlog to a local
// consumer: b.N events per iteration's run, reported as events/s. The consumer verifies
// every signature. Run: go test -run XXX -bench Drain -benchtime 10000x ./stages/dispatcher/
func BenchmarkDrain(b *testing.B) {
	bu := setup(b)
	c := newConsumer(b, nil)
	ctx := context.Background()
	if _, err := bu.pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload)
		SELECT 'bench', jsonb_build_object('i', i, 'pad', repeat('x', 200)) FROM generate_series(1, $1) i`, b.N); err != nil {
		b.Fatal(err)
	}
	cfg := bu.config(c.URL())
	cfg.Logger = zap.NewNop()
	b.ResetTimer()
	start := time.Now()
	bu.start(cfg)
	// Poll the consumer, not the database: counting the backlog every few milliseconds
	// would itself load PostgreSQL and distort the measurement.
	eventually(b, 10*time.Minute, "every event received", func() bool { return c.received() >= b.N })
	elapsed := time.Since(start)
	b.StopTimer()
	bu.waitSettled(time.Minute)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	if n := len(c.byDelivery()); n != b.N {
		b.Fatalf("delivered %d of %d", n, b.N)
	}
	for _, a := range c.arrivals() {
		if a.VerifyErr != nil {
			b.Fatalf("bad signature: %v", a.VerifyErr)
		}
	}
}

// BenchmarkIdleLatency measures insert start → arrival at the consumer for single events
// well apart (the dispatcher idle and armed between them). Reports p50 and p99 in ms.
// Run: go test -run XXX -bench IdleLatency -benchtime 300x ./stages/dispatcher/
func BenchmarkIdleLatency(b *testing.B) {
	bu := setup(b)
	var mu sync.Mutex
	arrivedAt := map[string]time.Time{}
	got := make(chan string, 1)
	c := newConsumer(b, func(a arrival, w http.ResponseWriter) {
		mu.Lock()
		arrivedAt[a.DeliveryID] = a.At
		mu.Unlock()
		got <- a.DeliveryID
	})
	cfg := bu.config(c.URL())
	cfg.Logger = zap.NewNop()
	bu.start(cfg)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		time.Sleep(5 * time.Millisecond) // let the dispatcher go idle and arm itself
		start := time.Now()
		e, err := outbox.Enqueue(ctx, bu.pool, outbox.Event{EventType: "idle", Payload: map[string]int{"x": 1}})
		if err != nil {
			b.Fatal(err)
		}
		if id := <-got; id != e.DeliveryID {
			b.Fatalf("unexpected delivery %s", id)
		}
		mu.Lock()
		lat = append(lat, arrivedAt[e.DeliveryID].Sub(start))
		mu.Unlock()
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.5), "p50_ms")
	b.ReportMetric(q(0.99), "p99_ms")
}
