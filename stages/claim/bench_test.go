package claim_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/dispatcher"
	"github.com/fluxora/fluxhook/stages/settle"
)

// BenchmarkClaimSettle measures the database side of delivering one event: its share of a
// claim statement and of a settle statement, against a real PostgreSQL with a prefilled
// backlog, per batch size and plan cache mode (the dispatcher forces generic plans; "auto" is
// PostgreSQL's default, which re-plans these statements on every call). It reports µs per
// event for each statement, sequentially, on the dispatcher's session settings. Run:
//
//	go test -run XXX -bench ClaimSettle -benchtime 5000x ./stages/claim/
func BenchmarkClaimSettle(b *testing.B) {
	for _, mode := range []string{"force_generic_plan", "auto"} {
		for _, batch := range []int{1, 10, 100} {
			b.Run(fmt.Sprintf("plan=%s/batch=%d", mode, batch), func(b *testing.B) {
				benchClaimSettle(b, mode, batch)
			})
		}
	}
}

func benchClaimSettle(b *testing.B, planMode string, batch int) {
	ctx := context.Background()
	_, c, s := benchDatabase(b, b.N+batch, 0, map[string]string{"plan_cache_mode": planMode})
	var claimT, settleT time.Duration
	b.ResetTimer()
	var cursor claim.Cursor // as the dispatcher drains: from the previous batch's last row
	for done := 0; done < b.N; {
		t0 := time.Now()
		res, err := c.Claim(ctx, min(batch, b.N-done), claim.Skip{}, false, cursor)
		rows := res.Rows
		cursor = res.Last
		if err != nil {
			b.Fatal(err)
		}
		if len(rows) == 0 {
			b.Fatalf("claim returned nothing after %d of %d rows", done, b.N)
		}
		t1 := time.Now()
		claimT += t1.Sub(t0)
		for _, d := range rows {
			d.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200, Duration: time.Millisecond}
		}
		if _, err := s.Settle(ctx, rows); err != nil {
			b.Fatal(err)
		}
		settleT += time.Since(t1)
		done += len(rows)
	}
	b.ReportMetric(float64(claimT.Microseconds())/float64(b.N), "claim-µs/event")
	b.ReportMetric(float64(settleT.Microseconds())/float64(b.N), "settle-µs/event")
}

// BenchmarkSettleThenClaim measures the lever "settle and the next claim in one round trip":
// settling a batch and claiming the next one as two statements, each its own round trip (what
// the dispatcher does), against both sent as one pgx.Batch. The batch runs both in one
// implicit transaction, so it also saves a commit: the saving it shows is an upper bound.
func BenchmarkSettleThenClaim(b *testing.B) {
	for _, batch := range []int{1, 100} {
		for _, mode := range []string{"two-round-trips", "one-round-trip"} {
			b.Run(fmt.Sprintf("batch=%d/%s", batch, mode), func(b *testing.B) {
				benchSettleThenClaim(b, batch, mode == "one-round-trip")
			})
		}
	}
}

func benchSettleThenClaim(b *testing.B, batch int, together bool) {
	ctx := context.Background()
	pool, c, s := benchDatabase(b, (b.N+1)*batch, 1, nil) // one backend, whose CPU time is measured
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		b.Fatal(err)
	}
	res, err := c.Claim(ctx, batch, claim.Skip{}, false, claim.Cursor{})
	if err != nil {
		b.Fatal(err)
	}
	client0, server0 := cpuTimes(b, backend)
	b.ResetTimer()
	for range b.N {
		prev := res.Rows
		if len(prev) == 0 {
			b.Fatal("claim returned nothing")
		}
		for _, d := range prev {
			d.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200, Duration: time.Millisecond}
		}
		var settled settle.Result
		if together {
			var q pgx.Batch
			s.Queue(&q, prev, &settled)
			c.Queue(&q, batch, claim.Skip{}, false, res.Last, &res)
			if err := pool.SendBatch(ctx, &q).Close(); err != nil {
				b.Fatal(err)
			}
		} else {
			if settled, err = s.Settle(ctx, prev); err != nil {
				b.Fatal(err)
			}
			if res, err = c.Claim(ctx, batch, claim.Skip{}, false, res.Last); err != nil {
				b.Fatal(err)
			}
		}
		if settled.Settled != len(prev) {
			b.Fatalf("settled %d of %d rows", settled.Settled, len(prev))
		}
	}
	b.StopTimer()
	client1, server1 := cpuTimes(b, backend)
	events := float64(b.N * batch)
	b.ReportMetric(float64(b.Elapsed().Microseconds())/events, "µs/event")
	// CPU time, unlike the wall time, does not count waiting for the other side, and moves
	// less with the machine's other load.
	b.ReportMetric(float64((client1-client0).Microseconds())/events, "client-cpu-µs/event")
	if server0 >= 0 && server1 >= 0 {
		b.ReportMetric(float64((server1-server0).Microseconds())/events, "server-cpu-µs/event")
	}
}

// cpuTimes returns this process's CPU time and the PostgreSQL backend's (from /proc, in clock
// ticks of 10 ms; -1 when the server is not a process of this machine).
func cpuTimes(b *testing.B, backend int) (client, server time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", backend))
	if err != nil {
		return client, -1
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return client, -1
	}
	return client, time.Duration(utime+stime) * 10 * time.Millisecond
}

// benchDatabase makes a migrated database holding rows pending events, vacuumed and analyzed,
// and a pool on the dispatcher's session settings (plus params; maxConns 0 keeps pgxpool's
// default) with a registered claimer (with WEBHOOK_MAX_PAYLOAD_BYTES's default limit, as the
// dispatcher's) and a settler on it.
func benchDatabase(b *testing.B, rows int, maxConns int32, params map[string]string) (*pgxpool.Pool, *claim.Claimer, *settle.Settler) {
	db := sqltest.NewMigrated(b)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload)
		SELECT 'bench', jsonb_build_object('i', i, 'pad', repeat('x', 200)) FROM generate_series(1, $1) i`, rows); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE webhook_outbox`); err != nil {
		b.Fatal(err)
	}
	pool := poolWith(b, db.URL, params, func(cfg *pgxpool.Config) {
		dispatcher.SessionParams(cfg.ConnConfig.RuntimeParams, false)
		if maxConns > 0 {
			cfg.MaxConns = maxConns
		}
	})
	c := claim.New(pool, "bench", time.Minute)
	c.LimitPayload(1 << 20) // WEBHOOK_MAX_PAYLOAD_BYTES's default, as the dispatcher claims
	if err := c.Register(ctx); err != nil {
		b.Fatal(err)
	}
	return pool, c, settle.New(pool, settle.Config{InstanceID: "bench"})
}

// BenchmarkRouteSettle measures the database side of fan-out to 10 endpoints, per delivery,
// on one backend whose CPU time is reported next to each statement's wall time: a claim of
// events, then either (rows) the route statement, which makes a leased row per delivery, and
// the settles of those rows, or (memory) the settles of deliveries routed in memory, which
// replace the event's row (settle.SettleAnchored). Settles take about a quarter of the
// deliveries each, as the dispatcher's settle stage does. It is sequential, so it shows what a
// change to route.sql, settle.sql or anchored.sql costs PostgreSQL without the fanout bench's
// HTTP traffic and scheduling noise. Run:
//
//	go test -run XXX -bench RouteSettle -benchtime 100x ./stages/claim/
func BenchmarkRouteSettle(b *testing.B) {
	for _, mode := range []string{"rows", "memory"} {
		b.Run(mode, func(b *testing.B) { benchRouteSettle(b, mode == "memory") })
	}
}

func benchRouteSettle(b *testing.B, inMemory bool) {
	const batch, endpoints = 80, 10
	ctx := context.Background()
	pool, c, s := benchDatabase(b, b.N*batch, 1, nil)
	if _, err := pool.Exec(ctx, `UPDATE webhook_outbox SET enqueued_at = now() - interval '1 minute'`); err != nil {
		b.Fatal(err)
	}
	var eps []string
	for i := range endpoints {
		var id string
		if err := pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, created_at)
			VALUES ($1, 's', now() - interval '1 hour') RETURNING id::text`, fmt.Sprintf("http://127.0.0.1:1/ep/%d", i)).Scan(&id); err != nil {
			b.Fatal(err)
		}
		eps = append(eps, id)
	}
	slices.Sort(eps)
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE webhook_outbox`); err != nil {
		b.Fatal(err)
	}
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		b.Fatal(err)
	}
	delivered := delivery.Outcome{Kind: delivery.Delivered, Status: 204, Duration: time.Millisecond}
	var claimT, routeT, settleT time.Duration
	var deliveries int
	var cursor claim.Cursor
	client0, server0 := cpuTimes(b, backend)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		res, err := c.Claim(ctx, batch, claim.Skip{}, false, cursor)
		if err != nil || len(res.Rows) == 0 {
			b.Fatalf("claimed %d events: %v", len(res.Rows), err)
		}
		cursor = res.Last
		t1 := time.Now()
		if inMemory {
			for chunk := range slices.Chunk(res.Rows, len(res.Rows)/4) {
				in := make([]settle.Anchored, len(chunk))
				for i, ev := range chunk {
					in[i] = settle.Anchored{EventID: ev.ID, LeaseToken: ev.LeaseToken, NewToken: c.NextToken(), Endpoints: endpoints}
					for _, ep := range eps {
						in[i].Delivered = append(in[i].Delivered, &delivery.Delivery{EndpointID: ep, Outcome: delivered})
					}
				}
				if r, err := s.SettleAnchored(ctx, in, time.Minute); err != nil || len(r.Written) != len(chunk) {
					b.Fatalf("settled %d of %d events: %v", len(r.Written), len(chunk), err)
				}
			}
			settleT += time.Since(t1)
		} else {
			routed, err := c.Route(ctx, res.Rows, false)
			if err != nil {
				b.Fatal(err)
			}
			if len(routed.Deliveries) != len(res.Rows)*endpoints {
				b.Fatalf("routed %d deliveries for %d events", len(routed.Deliveries), len(res.Rows))
			}
			t2 := time.Now()
			for _, d := range routed.Deliveries {
				d.Outcome = delivered
			}
			for chunk := range slices.Chunk(routed.Deliveries, len(routed.Deliveries)/4) {
				if r, err := s.Settle(ctx, chunk); err != nil || r.Settled != len(chunk) {
					b.Fatalf("settled %d of %d deliveries: %v", r.Settled, len(chunk), err)
				}
			}
			routeT += t2.Sub(t1)
			settleT += time.Since(t2)
		}
		claimT += t1.Sub(t0)
		deliveries += len(res.Rows) * endpoints
	}
	b.StopTimer()
	client1, server1 := cpuTimes(b, backend)
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(deliveries) }
	b.ReportMetric(per(claimT), "claim-µs/delivery")
	b.ReportMetric(per(routeT), "route-µs/delivery")
	b.ReportMetric(per(settleT), "settle-µs/delivery")
	b.ReportMetric(per(client1-client0), "client-cpu-µs/delivery")
	if server0 >= 0 && server1 >= 0 {
		b.ReportMetric(per(server1-server0), "server-cpu-µs/delivery")
	}
}
