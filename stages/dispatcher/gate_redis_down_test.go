package dispatcher_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// TestRedisDownEndsTheHoldBehindAProbe: instance B holds the endpoint behind instance A's
// half-open probe (probe timeout 2 min). When Redis goes down, B's gate fails open, and B's
// claims stop skipping the endpoint: rows enqueued during the outage go within seconds
// (StoreRetry 1 s), not at the probe's expiry.
func TestRedisDownEndsTheHoldBehindAProbe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := redistest.StartServer(t)
	open := func() gate.Store {
		s, err := redisstore.Open(srv.URL(), redisstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	h := newHeldProbe()
	c := newConsumer(t, h.respond)
	cfgA := b.config(c.URL())
	cfgA.Timeout = 30 * time.Second
	cfgA.RetrySchedule = []time.Duration{100 * time.Millisecond, time.Hour}
	cfgA.MaxInFlight = 1
	gA, err := gate.NewBreakerGate(open(), gate.Params{Threshold: 1, Reset: time.Second, RetryRPS: 100, ProbeTimeout: 2 * time.Minute},
		gate.Hooks{Logger: cfgA.Logger})
	if err != nil {
		t.Fatal(err)
	}
	cfgA.Gate = gA
	b.start(cfgA)
	b.enqueue(outbox.Event{EventType: tripEvent})
	select {
	case <-h.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for the half-open probe")
	}
	cfgB := b.config(c.URL())
	cfgB.Timeout = 30 * time.Second
	cfgB.RetrySchedule = []time.Duration{100 * time.Millisecond, time.Hour}
	// B's reset at its default (5 min), as in TestProbeElsewhereReleasesTheEndpointAtTheNextClaim.
	gB, err := gate.NewBreakerGate(open(), gate.Params{Threshold: 1, Reset: gate.Params{}.WithDefaults().Reset, RetryRPS: 100, ProbeTimeout: 2 * time.Minute},
		gate.Hooks{Logger: cfgB.Logger})
	if err != nil {
		t.Fatal(err)
	}
	ogB := &observedGate{Gate: gB}
	cfgB.Gate = ogB
	b.start(cfgB)
	behind := enqueueTogether(t, b, outbox.Event{}, outbox.Event{})
	deferredBehindProbe(t, b, []*observedGate{ogB}, behind)

	srv.Stop()
	start := time.Now()
	after := enqueueTogether(t, b, outbox.Event{}, outbox.Event{})
	eventually(t, 15*time.Second, "rows enqueued during the Redis outage delivered (gate fails open)", func() bool {
		return b.count(`SELECT count(DISTINCT delivery_id) FROM webhook_deliveries WHERE status_code = 200 AND delivery_id::text = ANY ($1::text[])`, after) == len(after)
	})
	t.Logf("delivered %s after Redis went down", time.Since(start))
	h.release <- http.StatusOK
}
