package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// BenchmarkGate measures the gate's Redis cost per claimed batch (Check) and per settled batch
// (Record) against a private redis-server, and reports round trips per batch twice: counted by
// a go-redis hook (one per command sent alone, one per pipeline), and from the server's INFO
// commandstats (script calls per batch; one per endpoint, all in that one round trip).
//
//	go test -run XXX -bench Gate -benchtime 2000x ./stages/gate/redisstore/
func BenchmarkGate(b *testing.B) {
	srv := redistest.StartServer(b)
	for _, endpoints := range []int{1, 3} {
		for _, op := range []string{"Check", "Record"} {
			for _, rps := range []int{10, 1 << 30} {
				if op == "Record" && rps != 10 {
					continue // the limiter plays no part in Record
				}
				b.Run(fmt.Sprintf("%s/batch=100/endpoints=%d/rps=%d", op, endpoints, rps), func(b *testing.B) {
					benchGate(b, srv, op, endpoints, rps)
				})
			}
		}
	}
}

func benchGate(b *testing.B, srv *redistest.Server, op string, endpoints, rps int) {
	s, err := redisstore.Open(srv.URL(), redisstore.Options{KeyPrefix: redistest.Prefix(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	c := countRoundTrips(s)
	// A threshold that never trips, so that every batch reads the breaker and counts its
	// attempts: with the default limit (10 per second, most retries refused) and with a limit
	// that is never reached (every attempt added to the window).
	g, err := gate.NewBreakerGate(s, gate.Params{Threshold: 1 << 30, Reset: time.Minute, RetryRPS: rps, StoreTimeout: 10 * time.Second},
		gate.Hooks{OnFailOpen: func() { b.Error("gate failed open") }})
	if err != nil {
		b.Fatal(err)
	}
	eps := make([]*delivery.Endpoint, endpoints)
	for i := range eps {
		eps[i] = endpoint("https://bench-" + strconv.Itoa(i) + ".example/hook")
	}
	ctx := context.Background()
	run := func() {
		rows := batch(100, eps...)
		if op == "Check" {
			g.Check(ctx, rows)
			return
		}
		for i, d := range rows {
			d.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
			if i%2 == 0 {
				d.Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503}
			}
		}
		g.Record(ctx, rows)
	}
	run() // load the scripts (NOSCRIPT → EVAL) and open the connection
	if err := s.Client().ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	c.reset()
	b.ResetTimer()
	for range b.N {
		run()
	}
	b.StopTimer()
	b.ReportMetric(float64(c.roundTrips())/float64(b.N), "roundtrips/batch")
	b.ReportMetric(float64(scriptCalls(b, s.Client()))/float64(b.N), "scripts/batch")
}

// scriptCalls reads how many EVALSHA and EVAL commands the server ran since CONFIG RESETSTAT.
func scriptCalls(b *testing.B, client redis.UniversalClient) int {
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				v, _ := strconv.Atoi(calls)
				n += v
			}
		}
	}
	return n
}

// BenchmarkInspect measures one read of a breaker's state (Store.Inspect, one round trip),
// which a dispatcher makes before each claim while its claims hold an endpoint behind a
// half-open probe (dispatcher.recheckProbes), against a private redis-server.
//
//	go test -run XXX -bench Inspect ./stages/gate/redisstore/
func BenchmarkInspect(b *testing.B) {
	srv := redistest.StartServer(b)
	s, err := redisstore.Open(srv.URL(), redisstore.Options{KeyPrefix: redistest.Prefix(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	hashes := []string{endpoint("https://bench.example/hook").Hash}
	if _, err := s.Inspect(ctx, hashes); err != nil { // load the script
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := s.Inspect(ctx, hashes); err != nil {
			b.Fatal(err)
		}
	}
}
