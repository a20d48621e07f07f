package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/gatetest"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// TestTopologies runs the gate through a real one-node Redis Cluster and a real
// Sentinel-managed primary, each reached with a client built from REDIS_URL exactly as the
// daemon builds it: the whole contract suite (breaker opening, probes, rate limit, sharing
// across instances), and the round-trip budget (one decide and one record per batch). The
// servers are throwaway redis-server processes; without redis-server installed the test fails,
// telling to install it (CI does), rather than skipping.
func TestTopologies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start func(testing.TB) string
	}{
		{"cluster", redistest.StartCluster},
		{"sentinel", redistest.StartSentinel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := tc.start(t)
			if _, cluster := redistest.OpenURL(t, url, "").Client().(*redis.ClusterClient); cluster != (tc.name == "cluster") {
				t.Fatalf("REDIS_URL %s built a %T", url, redistest.OpenURL(t, url, "").Client())
			}
			t.Run("Contract", func(t *testing.T) {
				t.Parallel()
				gatetest.Run(t, contractBackend(url))
			})
			t.Run("OneRoundTripPerBatch", func(t *testing.T) {
				t.Parallel()
				testRoundTripsThrough(t, url)
			})
		})
	}
}

// testRoundTripsThrough checks that a batch over three endpoints (three slots on a cluster) is
// decided in one round trip and recorded in one, and that the breaker then defers them all.
func testRoundTripsThrough(t *testing.T, url string) {
	s := redistest.OpenURL(t, url, redistest.Prefix(t))
	c := countRoundTrips(s)
	g := newGate(t, s, gate.Params{Threshold: 1, RetryRPS: 1000, Reset: time.Minute})
	eps := []*delivery.Endpoint{endpoint("https://a.example/"), endpoint("https://b.example/"), endpoint("https://c.example/")}
	ctx := context.Background()
	g.Check(ctx, batch(30, eps...)) // loads decide.lua (NOSCRIPT, then EVAL)

	rows := batch(30, eps...)
	c.reset()
	g.Check(ctx, rows)
	if got := c.of(redisstore.OpDecide); got != 1 || c.roundTrips() != 1 {
		t.Fatalf("Check of 30 rows over 3 endpoints: %d round trips (%d decide), want 1", c.roundTrips(), got)
	}
	for i, d := range rows {
		if d.Outcome.Kind != delivery.Undecided {
			t.Fatalf("row %d held: %q", i, d.Outcome.Reason)
		}
		d.Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503}
	}
	g.Record(ctx, rows[:1]) // loads record.lua
	c.reset()
	g.Record(ctx, rows)
	if got := c.of(redisstore.OpRecord); got != 1 || c.roundTrips() != 1 {
		t.Fatalf("Record of 30 rows over 3 endpoints: %d round trips (%d record), want 1", c.roundTrips(), got)
	}
	rows = batch(30, eps...)
	g.Check(ctx, rows)
	for i, d := range rows {
		if d.Outcome.Kind != delivery.Defer || d.Outcome.Reason != gate.DeferOpen.String() {
			t.Fatalf("row %d after the failures: %v %q, want deferred by the open circuit", i, d.Outcome.Kind, d.Outcome.Reason)
		}
	}
}
