package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/fluxhooktest"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestBenchAPISmoke runs the api workload with a log of a few thousand rows, as a user would run
// it, and checks its plumbing: the fill in partitions with the log's indexes, both sides of a
// pair, every read answered 200 (so the ids the clients compute are the fill's), nothing lost.
// It never looks at the times, and never fills ten million rows.
func TestBenchAPISmoke(t *testing.T) {
	t.Parallel()
	bin := fluxhooktest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const rows, endpointCount = 5000, 250
	cmd := exec.CommandContext(ctx, bin, "bench", "--workload", "api", "--api-log-rows", "5000", "--api-endpoints", "250",
		"--api-rate", "30", "--api-steady-rate", "50", "--api-duration", "1s", "--api-pairs", "1", "--connections", "2",
		"--no-budget", "--json", "--quiet")
	cmd.Env = []string{"DATABASE_URL=" + sqltest.ServerURL(), "GORACE=atexit_sleep_ms=0", "PGOPTIONS=-c synchronous_commit=off"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("fluxhook bench --workload api: %v\nstderr:\n%s", err, stderr.String())
	}
	var rep struct {
		API *apiResult `json:"api"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, stdout.String())
	}
	a := rep.API
	if a == nil {
		t.Fatalf("no api in the JSON:\n%s", stdout.String())
	}
	if a.LogRows != rows || a.Events != apiEvents(rows) || a.Endpoints != endpointCount || a.Tenants != 2 ||
		a.DeadLetters != apiDeadLetters(rows) || a.DeadLetters == 0 || a.Partitions < 7 {
		t.Errorf("fill: %d rows, %d events, %d endpoints of %d tenants, %d dead letters, %d partitions; want %d, %d, %d of 2, %d, at least 7",
			a.LogRows, a.Events, a.Endpoints, a.Tenants, a.DeadLetters, a.Partitions, rows, apiEvents(rows), endpointCount, apiDeadLetters(rows))
	}
	for _, idx := range []string{"webhook_delivery_log_delivery_id_idx", "webhook_delivery_log_endpoint_idx"} {
		if a.Fill.IndexBytes[idx] <= 0 {
			t.Errorf("fill: index %s has %d bytes (%v), want schema 19's index on every partition", idx, a.Fill.IndexBytes[idx], a.Fill.IndexBytes)
		}
	}
	if a.Fill.Seconds <= 0 || a.Fill.LogBytes <= 0 {
		t.Errorf("fill: %v s, log %d bytes", a.Fill.Seconds, a.Fill.LogBytes)
	}
	if len(a.Runs) != 2 || a.Runs[0].API || !a.Runs[1].API || len(a.Runs[0].Reads) != 0 || len(a.Runs[1].Reads) != len(apiReads) {
		t.Fatalf("runs %+v: want one without the API, then one with it, reading %d routes", a.Runs, len(apiReads))
	}
	for _, rd := range a.Reads {
		if rd.Requests == 0 || rd.Errors != 0 || rd.Latency.N != rd.Requests {
			t.Errorf("%s: %d requests, %d errors (%s), %d measured; want every one answered 200", rd.Read, rd.Requests, rd.Errors, rd.FirstError, rd.Latency.N)
		}
	}
	for _, arm := range []apiArm{a.Without, a.With} {
		if arm.Runs != 1 || arm.Events != 50 || arm.Lost != 0 || arm.Rejected != 0 || arm.FromScheduled.N != 50 || arm.CPUMicrosPerEvent <= 0 {
			t.Errorf("steady side %+v: want 1 run of 50 events, none lost, CPU measured", arm)
		}
	}
	if a.CPURatio == nil || a.P99Ratio == nil {
		t.Errorf("ratios: CPU %v, p99 %v; want both computed", a.CPURatio, a.P99Ratio)
	}
}

// TestBenchAPILayout: the fill's partitions hold every row once, each inside its bounds, and
// the counts the clients rely on agree with the row layout apiLogRows writes.
func TestBenchAPILayout(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 3, 1, 13, 7, 11, 123e6, time.UTC)
	window := apiRetention - time.Hour - time.Minute
	for _, rows := range []int64{1, 203, 204, 5000, 10_000_000} {
		parts := apiLayout(start, window, rows)
		if len(parts) < 7 || len(parts) > 8 {
			t.Errorf("%d rows: %d partitions, want a week of daily ones", rows, len(parts))
		}
		next := int64(0)
		for _, p := range parts {
			if p.from != next || p.to < p.from || p.hi.Sub(p.lo) != 24*time.Hour || p.lo.Hour() != 0 {
				t.Fatalf("%d rows: partition %+v after row %d: want contiguous rows in a UTC day", rows, p, next)
			}
			at := func(r int64) time.Time {
				return start.Add(time.Duration(r*window.Milliseconds()/rows) * time.Millisecond)
			}
			if p.to > p.from && (at(p.from).Before(p.lo) || !at(p.to-1).Before(p.hi)) {
				t.Errorf("%d rows: rows %d–%d at %s–%s outside %s–%s", rows, p.from, p.to, at(p.from), at(p.to-1), p.lo, p.hi)
			}
			next = p.to
		}
		if next != rows {
			t.Errorf("%d rows: the partitions hold %d", rows, next)
		}
	}
	// Brute force over the layout apiLogRows writes: kind 0 is an event's routed row, row
	// 203 of every tenth block of 204 the dead-lettered attempt.
	var events, dead int64
	for r := range int64(5000) {
		if r%apiBlockRows < apiBlockEvents {
			events++
		}
		if r%apiBlockRows == apiBlockRows-1 && (r/apiBlockRows)%10 == 0 {
			dead++
		}
		if r == 202 || r == 203 || r == 2242 || r == 2243 || r == 4999 {
			if apiEvents(r+1) != events || apiDeadLetters(r+1) != dead {
				t.Errorf("%d rows: apiEvents %d, apiDeadLetters %d; want %d, %d", r+1, apiEvents(r+1), apiDeadLetters(r+1), events, dead)
			}
		}
	}
	// PostgreSQL's md5('')::uuid.
	if got := md5UUID(""); got != "d41d8cd9-8f00-b204-e980-0998ecf8427e" {
		t.Errorf("md5UUID(\"\") = %s", got)
	}
}
