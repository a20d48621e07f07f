package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
	fluxgate "github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
)

// TestStatusShowsOpenBreakers opens a circuit in the shared Redis for an endpoint that has a
// pending row, and checks that `status` reports it by hash, never by URL.
func TestStatusShowsOpenBreakers(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	store, hash := breakerFixture(t, db, "?token=sekrit")
	params := fluxgate.Params{Threshold: 2, Reset: time.Hour}.WithDefaults()
	fail := fluxgate.EndpointResult{Hash: hash, Rows: []fluxgate.RowResult{{Result: fluxgate.Failure}, {Result: fluxgate.Failure}}}
	if _, err := store.Record(context.Background(), params, []fluxgate.EndpointResult{fail}); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, db.URL, "status", "--json", "--redis-url", breakerRedisURL)
	if r.code != 0 {
		t.Fatalf("status: %d %s", r.code, r.stderr)
	}
	if strings.Contains(r.stdout, "consumer-") || strings.Contains(r.stdout, "sekrit") {
		t.Fatal("status printed the endpoint URL")
	}
	var rep struct {
		Breakers []breakerStatus `json:"breakers"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Breakers) != 1 || rep.Breakers[0].Endpoint != hash || rep.Breakers[0].State != "open" || rep.Breakers[0].OpenForSeconds < 3500 {
		t.Fatalf("breakers = %+v; want the endpoint open for about an hour", rep.Breakers)
	}
	if b := rep.Breakers[0]; b.OpenSince == nil || time.Since(*b.OpenSince) > time.Minute || b.FailedProbes != 0 {
		t.Fatalf("breaker %+v: want open since just now, no failed probes", b)
	}
	// Without REDIS_URL the report says where the state lives instead of showing it closed.
	r = runCLI(t, db.URL, "status")
	if r.code != 0 || !strings.Contains(r.stdout, "in-process") {
		t.Fatalf("status without Redis: %d\n%s", r.code, r.stdout)
	}
}

// TestStatusWithRedisDown: when the Redis holding the breakers cannot be reached, status
// still prints everything PostgreSQL knows, says the breaker part is unavailable and why, and
// exits 0, in text and in JSON.
func TestStatusWithRedisDown(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('e', '{}')`)
	down := "redis://127.0.0.1:1/0" // nothing listens on port 1
	r := runCLI(t, db.URL, "status", "--json", "--redis-url", down, "--webhook-url", "https://consumer.example/hook")
	if r.code != 0 {
		t.Fatalf("status --json with Redis down exited %d: %s", r.code, r.stderr)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status --json printed %q: %v", r.stdout, err)
	}
	if rep.Backlog != 1 || rep.BreakersUnavailable == "" || !strings.Contains(rep.BreakersNote, "unavailable") {
		t.Errorf("backlog %d, breakers_unavailable %q, note %q; want the outbox read and the breakers marked unavailable",
			rep.Backlog, rep.BreakersUnavailable, rep.BreakersNote)
	}
	text := runCLI(t, db.URL, "status", "--redis-url", down, "--webhook-url", "https://consumer.example/hook")
	if text.code != 0 || !strings.Contains(text.stdout, "backlog") || !strings.Contains(text.stdout, "breaker state unavailable") {
		t.Errorf("status with Redis down: exit %d, output:\n%s%s", text.code, text.stdout, text.stderr)
	}
}

// TestStatusShowsBreakerSpell: after a failed probe, status still shows when the circuit first
// opened (open_since, unchanged by the probe) and counts the failed probe, while
// open_for_seconds (the time left before the next probe) started again; in text the OPEN SINCE
// age covers the whole spell, not the time since the last probe (the bug report: 5 s shown
// after 25 s open).
func TestStatusShowsBreakerSpell(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	store, hash := breakerFixture(t, db, "")
	// The limiter off: only the breaker's keys are written. The reset is long enough for the
	// status command below to run inside the new one after the failed probe on a loaded
	// machine (300 ms was not, under the whole suite with -race).
	params := fluxgate.Params{Threshold: 1, Reset: 3 * time.Second, RetryRPS: -1}.WithDefaults()
	if _, err := store.Record(ctx, params, []fluxgate.EndpointResult{{Hash: hash, Rows: []fluxgate.RowResult{{Result: fluxgate.Failure}}}}); err != nil {
		t.Fatal(err)
	}
	opened, err := store.Inspect(ctx, []string{hash})
	if err != nil || opened[0].State != fluxgate.Open || opened[0].OpenSince.IsZero() {
		t.Fatalf("opening the circuit: %+v %v", opened, err)
	}
	// The reset passes (by Redis's clock, which the scripts use); the probe fails.
	for {
		s, err := store.Inspect(ctx, []string{hash})
		if err != nil {
			t.Fatal(err)
		}
		if s[0].OpenFor == 0 {
			break
		}
		time.Sleep(s[0].OpenFor + time.Millisecond)
	}
	decs, err := store.Decide(ctx, params, []fluxgate.EndpointCheck{{Hash: hash, Token: "status-test-probe", Retry: []bool{true}}})
	if err != nil || decs[0].Err != nil || decs[0].Rows[0].Verdict != fluxgate.Probe {
		t.Fatalf("no probe granted after the reset: %+v %v", decs, err)
	}
	fail := fluxgate.EndpointResult{Hash: hash, Rows: []fluxgate.RowResult{{Result: fluxgate.Failure, Token: "status-test-probe"}}}
	if _, err := store.Record(ctx, params, []fluxgate.EndpointResult{fail}); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, db.URL, "status", "--json", "--redis-url", breakerRedisURL)
	if r.code != 0 {
		t.Fatalf("status: %d %s", r.code, r.stderr)
	}
	var rep struct {
		Breakers []map[string]any `json:"breakers"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Breakers) != 1 {
		t.Fatalf("breakers = %v, want the one endpoint", rep.Breakers)
	}
	br := rep.Breakers[0]
	since, _ := br["open_since"].(string)
	got, err := time.Parse(time.RFC3339Nano, since)
	if err != nil || !got.Equal(opened[0].OpenSince) {
		t.Errorf("open_since = %v, want %s: when the circuit first opened, not the failed probe", br["open_since"], opened[0].OpenSince.UTC().Format(time.RFC3339Nano))
	}
	if br["failed_probes"] != 1.0 || br["state"] != "open" {
		t.Errorf("breaker = %v, want open with failed_probes 1", br)
	}
	if left, _ := br["open_for_seconds"].(float64); left <= 0 || left > params.Reset.Seconds() {
		t.Errorf("open_for_seconds = %v, want (0, %.1f]: the new reset time after the failed probe", br["open_for_seconds"], params.Reset.Seconds())
	}

	text := runCLI(t, db.URL, "status", "--redis-url", breakerRedisURL)
	if text.code != 0 {
		t.Fatalf("status: %d %s", text.code, text.stderr)
	}
	if !strings.Contains(strings.Join(strings.Fields(text.stdout), " "), "ENDPOINT (sha256) STATE FAILURES OPEN SINCE FAILED PROBES NEXT PROBE IN PROBE") {
		t.Errorf("breaker columns missing:\n%s", text.stdout)
	}
	var row []string
	for _, l := range strings.Split(text.stdout, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == hash {
			row = f
		}
	}
	// hash, open, 0, <age>, ago, 1, <left>, no
	if len(row) != 8 || row[1] != "open" || row[4] != "ago" || row[5] != "1" || row[7] != "no" {
		t.Fatalf("breaker row %q, want open, OPEN SINCE '<age> ago', 1 failed probe", row)
	}
	age, err := time.ParseDuration(row[3])
	if err != nil || age < params.Reset {
		t.Errorf("OPEN SINCE %q ago, want at least the reset time (%s): the age of the spell, not of the last probe", row[3], params.Reset)
	}
}

// breakerRedisURL is the shared Redis the status tests write breaker state into (the README's
// test command starts it); each test's endpoint has keys of its own.
const breakerRedisURL = "redis://127.0.0.1:6379/0"

// breakerFixture inserts a pending row for a new endpoint (its URL ends with query) and opens
// the shared Redis store that will hold the endpoint's breaker, returning it and the
// endpoint's hash. At cleanup every key of the endpoint is deleted, then the store closed.
func breakerFixture(t *testing.T, db *sqltest.DB, query string) (*redisstore.Store, string) {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	url := "https://consumer-" + hex.EncodeToString(b[:]) + ".example/hook" + query
	sum := sha256.Sum256([]byte(url))
	hash := hex.EncodeToString(sum[:])
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, endpoint_url) VALUES ('e', '{}', $1)`, url)
	store, err := redisstore.Open(breakerRedisURL, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		br, probe, rl := store.Keys(hash)
		retries, slot := store.RetryKeys(hash)
		_ = store.Client().Del(context.Background(), br, probe, rl, retries, slot).Err()
		_ = store.Close()
	})
	if err := store.Ping(context.Background()); err != nil {
		t.Fatalf("Redis at %s (the README's test command starts it): %v", breakerRedisURL, err)
	}
	return store, hash
}
