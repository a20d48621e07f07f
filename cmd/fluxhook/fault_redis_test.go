package main

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// TestFaultRedisRestartUnderLoad stops the Redis that two instances share for their breaker
// and rate limit (a private redis-server on a free loopback port, never the shared test
// server) while a producer inserts at a steady rate: deliveries continue, failing open; after
// Redis is back on the same port (empty, as after a crash without persistence), failures
// recorded by the two instances open the shared breaker again, and once the consumer recovers
// every event is delivered, none lost.
func TestFaultRedisRestartUnderLoad(t *testing.T) {
	t.Parallel()
	const rate = 100
	const events = 4 * rate // 4 s of load
	db := sqltest.NewMigrated(t)
	srv := redistest.StartServer(t)

	// Events of type test.fail are refused with 503 while failing is set; every other event,
	// and every event once the consumer recovers, is accepted.
	var failing atomic.Bool
	c := newHookConsumer(t, func(ctx context.Context, req *hookRequest) int {
		if req.Event == "test.fail" && failing.Load() {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	env := faultEnv(db.URL, c.URL())
	env["REDIS_URL"] = srv.URL()
	env["WEBHOOK_CIRCUIT_BREAKER_THRESHOLD"] = "5"
	env["WEBHOOK_CIRCUIT_BREAKER_RESET_MS"] = "1000"
	env["METRICS_ADDR"] = "127.0.0.1:0"
	env["WEBHOOK_TIMEOUT_MS"] = "2000"
	// Enough attempts (about 4 s of retries) that the failing events are never dead-lettered
	// before the breaker opens: a failure recorded while a gate still fails open after the
	// restart (until its next try of the store) does not count towards the threshold.
	env["WEBHOOK_RETRY_SCHEDULE"] = strings.Join(slices.Repeat([]string{"200ms"}, 20), ",")
	procs := []*serveProc{startServe(t, "serve 1", env), startServe(t, "serve 2", env)}
	var addrs []string
	for _, p := range procs {
		p.instanceID() // started
		addrs = append(addrs, p.metricsAddr())
	}
	sum := func(series string) (total float64) {
		for _, a := range addrs {
			total += scrapeMetric(t, a, series)
		}
		return total
	}
	const failOpen = "fluxora_webhook_gate_fail_open_total"
	const opened = `fluxora_webhook_circuit_breaker_transitions_total{from_state="closed",to_state="open"}`

	prod := startProducer(t, db.Pool, events, rate, loadEvent)
	waitAll(t, faultWait, "deliveries under load with Redis up", procs, func() bool {
		_, _, ok := c.counts()
		return ok >= 50
	})
	if n := sum(failOpen); n != 0 {
		t.Fatalf("%s = %v with Redis up, want 0", failOpen, n)
	}
	if n := prod.produced(); n >= events {
		t.Fatalf("the producer had finished (%d events) before Redis stopped; the stop must strike under load", n)
	}
	producedAtStop := prod.produced()
	srv.Stop()
	_, _, okAtStop := c.counts()
	waitAll(t, faultWait, "deliveries with Redis down, failing open", procs, func() bool {
		_, _, ok := c.counts()
		return ok >= okAtStop+50 && sum(failOpen) > 0
	})
	var perInstance []float64
	for _, a := range addrs {
		perInstance = append(perInstance, scrapeMetric(t, a, failOpen))
	}
	if !slices.ContainsFunc(perInstance, func(v float64) bool { return v > 0 }) {
		t.Fatalf("%s per instance = %v, want > 0 on at least one", failOpen, perInstance)
	}
	if n := prod.produced(); n >= events {
		t.Errorf("the producer had finished (%d events) before Redis came back; the outage must strike under load", n)
	}

	srv.Start()
	restartedAt := prod.produced()
	ids := prod.wait(t, faultWait) // the rest of the load, with Redis back
	waitSettled(t, db, faultWait, procs, []*hookConsumer{c}, len(ids))
	if n := sum(opened); n != 0 {
		t.Fatalf("%s = %v before any failure, want 0", opened, n)
	}

	// The consumer fails for a set of events until the breaker opens on the restarted Redis.
	// A gate that failed open last may still skip the store until its next try, and the
	// failures it sees are not recorded; so keep adding failing events until it opens.
	failing.Store(true)
	var failIDs []string
	addFailing := func() {
		failIDs = append(failIDs, enqueueOne(t, db, outbox.Event{EventType: "test.fail", Payload: map[string]any{"n": len(failIDs)}}))
	}
	for range 5 {
		addFailing()
	}
	waitAll(t, 30*time.Second, "the breaker to open on the restarted Redis", procs, func() bool {
		if sum(opened) >= 1 {
			return true
		}
		addFailing()
		return false
	})
	var opens []float64
	for _, a := range addrs {
		opens = append(opens, scrapeMetric(t, a, opened))
	}
	failing.Store(false) // the consumer recovers; the breaker's probe finds out after its reset

	all := append(slices.Clone(ids), failIDs...)
	waitSettled(t, db, faultWait, procs, []*hookConsumer{c}, len(all))
	tally := checkNoneLost(t, db, all, []*hookConsumer{c}, faultExpect{})
	var closes float64
	for _, a := range addrs {
		closes += scrapeMetric(t, a, `fluxora_webhook_circuit_breaker_transitions_total{from_state="half_open",to_state="closed"}`)
	}
	if closes < 1 {
		t.Errorf("the circuit did not close after the consumer recovered")
	}
	t.Logf("Redis stopped after %d and restarted after %d of %d events were enqueued; fail-open per instance %v; "+
		"breaker opened (per instance %v) after %d failing events; %s",
		producedAtStop, restartedAt, events, perInstance, opens, len(failIDs), tally)
}
