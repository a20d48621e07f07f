package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// dbPassword is put in DATABASE_URL by the tests that check logs and errors for secrets; the
// test server trusts local connections and ignores it.
const dbPassword = "hunter2-db-pass"

// queryInt runs a query returning one integer.
func queryInt(t *testing.T, db *sqltest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// queryStrings runs a query returning one text column.
func queryStrings(t *testing.T, db *sqltest.DB, sql string, args ...any) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

func enqueueOne(t *testing.T, db *sqltest.DB, ev outbox.Event) string {
	t.Helper()
	if ev.EventType == "" {
		ev.EventType = "test.event"
	}
	if ev.Payload == nil {
		ev.Payload = map[string]any{"n": 1}
	}
	e, err := outbox.Enqueue(context.Background(), db.Pool, ev)
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return e.DeliveryID
}

func unprocessed(t *testing.T, db *sqltest.DB) int {
	t.Helper()
	return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE NOT processed`)
}

// TestServeSIGKILLLosesNothing kills a dispatcher with requests in flight and checks that a
// second one, on the same database, delivers everything, duplicating only what was in flight.
func TestServeSIGKILLLosesNothing(t *testing.T) {
	t.Parallel()
	const (
		events = 200
		hang   = 20 // the first requests hang until released or cancelled
	)
	db := sqltest.NewMigrated(t)
	release := newGate()
	c := newHookConsumer(t, func(ctx context.Context, req *hookRequest) int {
		if req.N <= hang && !release.wait(ctx) {
			return 0
		}
		return http.StatusOK
	})
	env := serveEnv(db.URL, c.URL())
	// The killed instance's leases must expire soon, and the lease must exceed the timeout by
	// dispatcher.LeaseAllowance; the timeout must outlast the wait below, or the hanging requests would time out
	// (and be settled as retries) before the kill.
	// Generous against a loaded CI machine, where answering the other 180 took over 3 s.
	env["WEBHOOK_TIMEOUT_MS"] = "10000"
	env["WEBHOOK_LEASE_MS"] = "12000"

	first := startServe(t, "first serve", env)
	evs := make([]outbox.Event, events)
	for i := range evs {
		evs[i] = outbox.Event{EventType: "test.kill", Payload: map[string]any{"n": i}}
	}
	if n, err := outbox.EnqueueMany(context.Background(), db.Pool, evs); err != nil || n != events {
		t.Fatalf("EnqueueMany = %d, %v", n, err)
	}
	ids := queryStrings(t, db, `SELECT delivery_id::text FROM webhook_deliveries`)
	if len(ids) != events {
		t.Fatalf("%d rows in the outbox, want %d", len(ids), events)
	}

	// Kill once everything but the hanging requests has been answered: the rows left in
	// flight are then the hanging ones plus those answered but not yet settled, few enough
	// for the bound on duplicates below to mean something.
	first.waitFor(30*time.Second, "the hanging requests in flight and the others answered", func() bool {
		_, active, ok := c.counts()
		return active >= hang && ok >= events-hang
	})
	arrivedAtKill, hangingAtKill, okAtKill := c.counts()
	first.kill()
	if code := first.waitExit(5 * time.Second); code != -1 {
		t.Fatalf("first serve exited with %d after SIGKILL, want death by signal", code)
	}
	// A statement the killed process had sent may still be finishing on the server; once its
	// sessions are gone, the table shows exactly what it left in flight.
	pollUntil(t, 5*time.Second, "the killed instance's sessions to end", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'fluxhook%'`) == 0
	})
	inFlight := map[string]bool{}
	for _, id := range queryStrings(t, db, `SELECT delivery_id::text FROM webhook_deliveries
		WHERE NOT processed AND leased_by IS NOT NULL`) {
		inFlight[id] = true
	}
	t.Logf("at the kill: %d requests arrived, %d hanging, %d answered 2xx; %d rows leased and unsettled",
		arrivedAtKill, hangingAtKill, okAtKill, len(inFlight))
	if len(inFlight) == 0 {
		t.Fatalf("no rows were in flight at the kill; the test did not exercise a crash mid-delivery")
	}

	second := startServe(t, "second serve", env)
	release.open()
	second.waitFor(45*time.Second, "every outbox row processed", func() bool { return unprocessed(t, db) == 0 })

	oks := map[string]int{}
	bodies := map[string][]byte{}
	for _, r := range c.requests() {
		if r.VerifyErr != nil {
			t.Errorf("request %d (%s): signature does not verify: %v", r.N, r.DeliveryID, r.VerifyErr)
		}
		if prev, ok := bodies[r.DeliveryID]; ok && !bytes.Equal(prev, r.Body) {
			t.Errorf("%s: body changed between attempts: %s then %s", r.DeliveryID, prev, r.Body)
		}
		bodies[r.DeliveryID] = r.Body
		if r.Status >= 200 && r.Status <= 299 {
			oks[r.DeliveryID]++
		}
	}
	var lost, duplicated []string
	for _, id := range ids {
		switch n := oks[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1:
			duplicated = append(duplicated, id)
			if !inFlight[id] {
				t.Errorf("%s was delivered %d times but was not in flight at the kill", id, n)
			}
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d events never reached the consumer with a 2xx: %v", len(lost), events, lost)
	}
	if len(duplicated) > len(inFlight) {
		t.Errorf("%d events delivered more than once, more than the %d in flight at the kill", len(duplicated), len(inFlight))
	}
	if n := queryInt(t, db, `SELECT count(DISTINCT delivery_id) FROM webhook_deliveries
		WHERE processed AND status_code BETWEEN 200 AND 299`); n != events {
		t.Errorf("%d delivery ids settled as delivered, want %d", n, events)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
	t.Logf("%d requests in all, %d events delivered more than once", len(c.requests()), len(duplicated))
}

// startHangingOne starts serve with one event whose first request hangs until release opens,
// and waits until that request is in flight.
func startHangingOne(t *testing.T, db *sqltest.DB, release *gate, env map[string]string) (*serveProc, *hookConsumer, string) {
	t.Helper()
	c := newHookConsumer(t, func(ctx context.Context, req *hookRequest) int {
		if req.N == 1 && !release.wait(ctx) {
			return 0
		}
		return http.StatusOK
	})
	env["WEBHOOK_URL"] = c.URL()
	p := startServe(t, "serve", env)
	id := enqueueOne(t, db, outbox.Event{EventType: "test.slow"})
	p.waitFor(15*time.Second, "the request to be in flight", func() bool {
		_, active, _ := c.counts()
		return active == 1
	})
	return p, c, id
}

// TestServeSIGTERMDrainsSlowRequest checks the graceful half of shutdown: SIGTERM waits for
// the request in flight, settles it, and exits 0.
func TestServeSIGTERMDrainsSlowRequest(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	release := newGate()
	env := serveEnv(db.URL, "")
	env["WEBHOOK_TIMEOUT_MS"] = "20000" // far beyond the test: only the release ends the request
	p, c, id := startHangingOne(t, db, release, env)

	p.signal(syscall.SIGTERM)
	p.waitLog(5*time.Second, "shutting down: draining in-flight deliveries")
	if p.exited() {
		t.Fatalf("serve exited (%s) while a request was in flight", p.cmd.ProcessState)
	}
	if _, active, _ := c.counts(); active != 1 {
		t.Fatalf("%d requests in flight after SIGTERM, want the one still hanging", active)
	}
	release.open()
	if code := p.waitExit(10 * time.Second); code != 0 {
		t.Fatalf("serve exited with %d, want 0", code)
	}
	var status int
	var processed bool
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT processed, coalesce(status_code, 0) FROM webhook_deliveries WHERE delivery_id = $1 AND attempt = 1`, id,
	).Scan(&processed, &status); err != nil {
		t.Fatal(err)
	}
	if !processed || status != http.StatusOK {
		t.Fatalf("row after drain: processed=%v status=%d, want settled with 200", processed, status)
	}
	if n := len(c.requests()); n != 1 {
		t.Errorf("consumer got %d requests, want 1", n)
	}
	if logs := p.stderr.String(); strings.Contains(logs, "shutdown incomplete") || !strings.Contains(logs, "dispatcher stopped") {
		t.Errorf("shutdown was not a clean drain")
	}
}

// TestServeSecondSignalCancels checks the forced half of shutdown: a second signal cancels the
// request in flight at once, and its row is released for another instance to deliver.
func TestServeSecondSignalCancels(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	release := newGate()
	env := serveEnv(db.URL, "")
	env["WEBHOOK_TIMEOUT_MS"] = "20000"
	p, c, id := startHangingOne(t, db, release, env)

	p.signal(syscall.SIGTERM)
	p.waitLog(5*time.Second, "shutting down: draining in-flight deliveries")
	start := time.Now()
	p.signal(syscall.SIGINT)
	code := p.waitExit(5 * time.Second) // the request's own timeout is 20 s
	t.Logf("exited with %d %s after the second signal", code, time.Since(start).Round(time.Millisecond))
	if !strings.Contains(p.stderr.String(), "second signal: cancelling in-flight deliveries") {
		t.Errorf("no log line about the second signal")
	}
	requireReleasedAndRedelivered(t, db, env, c, id)
}

// requireReleasedAndRedelivered checks the row of a request cancelled by a forced stop: not
// settled (neither processed nor retried nor dead-lettered) but released, so that another
// instance delivers it at once rather than after the lease.
func requireReleasedAndRedelivered(t *testing.T, db *sqltest.DB, env map[string]string, c *hookConsumer, id string) {
	t.Helper()
	var processed, released bool
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT processed, lease_until IS NULL OR lease_until <= now() + interval '1 second'
		 FROM webhook_deliveries WHERE delivery_id = $1`, id,
	).Scan(&processed, &released); err != nil {
		t.Fatal(err)
	}
	if processed || !released {
		t.Fatalf("row after a forced stop: processed=%v lease released=%v; want unprocessed and released", processed, released)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1`, id); n != 1 {
		t.Fatalf("%d rows for the cancelled delivery, want 1: it must not be settled as a failed attempt", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, id); n != 0 {
		t.Fatal("the cancelled delivery was dead-lettered")
	}

	// Released, not left leased for the full lease: another instance delivers it right away.
	next := startServe(t, "next serve", env)
	next.waitFor(15*time.Second, "the released row to be delivered", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries
			WHERE delivery_id = $1 AND processed AND status_code = 200`, id) == 1
	})
	if n := len(c.requests()); n != 2 {
		t.Errorf("consumer got %d requests, want 2 (the cancelled one and the redelivery)", n)
	}
}

// TestServeDrainTimeoutReleasesInFlightRow sends SIGTERM while a request hangs far beyond
// WEBHOOK_DRAIN_TIMEOUT_MS: serve must give up on it once the drain timeout passes (not wait
// for the request's own timeout), exit, and leave the row released for redelivery, neither
// lost nor settled as a failure.
func TestServeDrainTimeoutReleasesInFlightRow(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	release := newGate()
	const drain = 1500 * time.Millisecond
	env := serveEnv(db.URL, "")
	env["WEBHOOK_TIMEOUT_MS"] = "60000" // only the drain timeout can end the request in time
	env["WEBHOOK_DRAIN_TIMEOUT_MS"] = strconv.Itoa(int(drain.Milliseconds()))
	p, c, id := startHangingOne(t, db, release, env)

	start := time.Now()
	p.signal(syscall.SIGTERM)
	code := p.waitExit(30 * time.Second) // half the request timeout: only the drain timeout ends it
	took := time.Since(start)
	t.Logf("exited with %d %s after SIGTERM (drain timeout %s)", code, took.Round(time.Millisecond), drain)
	if took < drain {
		t.Errorf("serve exited %s after SIGTERM, before the drain timeout of %s", took, drain)
	}
	if code != 0 {
		t.Errorf("serve exited %d after a drain timeout, want 0", code)
	}
	if logs := p.stderr.String(); !strings.Contains(logs, "drain cut short") {
		t.Errorf("no log line saying the drain was cut short")
	}
	requireReleasedAndRedelivered(t, db, env, c, id)
}

// serveInProcess calls run([serve flags...]) in this process with env as the whole
// environment.
func serveInProcess(env map[string]string, flags ...string) (code int, stderr string) {
	var out, errBuf bytes.Buffer
	code = run(append([]string{"serve"}, flags...), &out, &errBuf, func(k string) string { return env[k] })
	return code, out.String() + errBuf.String()
}

// TestServeInvalidConfig checks that each bad variable stops serve before anything is
// claimed, with a non-zero status and a message naming the variable.
func TestServeInvalidConfig(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	id := enqueueOne(t, db, outbox.Event{})
	c := newHookConsumer(t, nil)

	cases := []struct {
		name string
		set  map[string]string
		want string // the variable the message must name
		leak string // a value that must not be repeated
		// flags follow serve on the command line.
		flags []string
		// notWant are variables the message must not name: set right by a flag over a
		// wrong environment value.
		notWant []string
	}{
		{"no database", map[string]string{"DATABASE_URL": ""}, "DATABASE_URL", "", nil, nil},
		{"database url does not parse", map[string]string{"DATABASE_URL": "postgres://root:" + dbPassword + "@127.0.0.1:notaport/db"}, "DATABASE_URL", "", nil, nil},
		// Without WEBHOOK_URL serve delivers to managed endpoints only; a secret without a
		// URL is fine, a URL without a secret is not ("no secret" below).
		{"encryption key not base64", map[string]string{"WEBHOOK_ENCRYPTION_KEY": "not-base64-key-9c1d"}, "WEBHOOK_ENCRYPTION_KEY", "not-base64-key-9c1d", nil, nil},
		{"encryption key too short", map[string]string{"WEBHOOK_ENCRYPTION_KEY": "c2hvcnQ="}, "WEBHOOK_ENCRYPTION_KEY", "c2hvcnQ=", nil, nil},
		{"retry share", map[string]string{"WEBHOOK_RETRY_SHARE": "1.5"}, "WEBHOOK_RETRY_SHARE", "", nil, nil},
		{"permanent statuses", map[string]string{"WEBHOOK_PERMANENT_STATUSES": "404,4xx"}, "WEBHOOK_PERMANENT_STATUSES", "", nil, nil},
		{"endpoint disable after", map[string]string{"WEBHOOK_ENDPOINT_DISABLE_AFTER": "5 days"}, "WEBHOOK_ENDPOINT_DISABLE_AFTER", "", nil, nil},
		{"ftp url", map[string]string{"WEBHOOK_URL": "ftp://x"}, "WEBHOOK_URL", "", nil, nil},
		{"http url", map[string]string{"WEBHOOK_URL": "http://example.com"}, "WEBHOOK_URL", "", nil, nil},
		{"url with credentials", map[string]string{"WEBHOOK_URL": "https://u:p4ssw0rd-in-url@example.com"}, "WEBHOOK_URL", "p4ssw0rd-in-url", nil, nil},
		{"no secret", map[string]string{"WEBHOOK_SECRET": ""}, "WEBHOOK_SECRET", "", nil, nil},
		{"scheme", map[string]string{"WEBHOOK_SIGNATURE_SCHEME": "bogus"}, "WEBHOOK_SIGNATURE_SCHEME", "", nil, nil},
		{"poll not a number", map[string]string{"WEBHOOK_POLL_INTERVAL_MS": "abc"}, "WEBHOOK_POLL_INTERVAL_MS", "", nil, nil},
		{"poll too short", map[string]string{"WEBHOOK_POLL_INTERVAL_MS": "1"}, "WEBHOOK_POLL_INTERVAL_MS", "", nil, nil},
		{"batch size", map[string]string{"WEBHOOK_BATCH_SIZE": "0"}, "WEBHOOK_BATCH_SIZE", "", nil, nil},
		{"max in flight", map[string]string{"WEBHOOK_MAX_IN_FLIGHT": "-1"}, "WEBHOOK_MAX_IN_FLIGHT", "", nil, nil},
		{"endpoint concurrency", map[string]string{"WEBHOOK_ENDPOINT_CONCURRENCY": "0"}, "WEBHOOK_ENDPOINT_CONCURRENCY", "", nil, nil},
		{"timeout", map[string]string{"WEBHOOK_TIMEOUT_MS": "x"}, "WEBHOOK_TIMEOUT_MS", "", nil, nil},
		{"lease under timeout", map[string]string{"WEBHOOK_LEASE_MS": "500", "WEBHOOK_TIMEOUT_MS": "30000"}, "WEBHOOK_LEASE_MS", "", nil, nil},
		{"schedule word", map[string]string{"WEBHOOK_RETRY_SCHEDULE": "5s,banana"}, "WEBHOOK_RETRY_SCHEDULE", "", nil, nil},
		{"schedule zero", map[string]string{"WEBHOOK_RETRY_SCHEDULE": "0s"}, "WEBHOOK_RETRY_SCHEDULE", "", nil, nil},
		{"max payload", map[string]string{"WEBHOOK_MAX_PAYLOAD_BYTES": "1"}, "WEBHOOK_MAX_PAYLOAD_BYTES", "", nil, nil},
		{"response excerpt negative", map[string]string{"WEBHOOK_RESPONSE_EXCERPT_BYTES": "-1"}, "WEBHOOK_RESPONSE_EXCERPT_BYTES", "", nil, nil},
		{"response excerpt too large", map[string]string{"WEBHOOK_RESPONSE_EXCERPT_BYTES": "65537"}, "WEBHOOK_RESPONSE_EXCERPT_BYTES", "", nil, nil},
		{"response excerpt not a number", map[string]string{"WEBHOOK_RESPONSE_EXCERPT_BYTES": "1k"}, "WEBHOOK_RESPONSE_EXCERPT_BYTES", "", nil, nil},
		{"retry rps", map[string]string{"WEBHOOK_RETRY_RPS": "0"}, "WEBHOOK_RETRY_RPS", "", nil, nil},
		{"breaker threshold", map[string]string{"WEBHOOK_CIRCUIT_BREAKER_THRESHOLD": "-1"}, "WEBHOOK_CIRCUIT_BREAKER_THRESHOLD", "", nil, nil},
		{"breaker reset", map[string]string{"WEBHOOK_CIRCUIT_BREAKER_RESET_MS": "0"}, "WEBHOOK_CIRCUIT_BREAKER_RESET_MS", "", nil, nil},
		{"retention", map[string]string{"WEBHOOK_RETENTION": "forever"}, "WEBHOOK_RETENTION", "", nil, nil},
		{"allowed networks", map[string]string{"WEBHOOK_ALLOWED_NETWORKS": "10.0.0.0/33"}, "WEBHOOK_ALLOWED_NETWORKS", "", nil, nil},
		{"row url networks", map[string]string{"WEBHOOK_ROW_URL_NETWORKS": "localhost"}, "WEBHOOK_ROW_URL_NETWORKS", "", nil, nil},
		{"log level", map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL", "", nil, nil},
		{"log format", map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT", "", nil, nil},
		{name: "drain timeout not a number", set: map[string]string{"WEBHOOK_DRAIN_TIMEOUT_MS": "soon"}, want: "WEBHOOK_DRAIN_TIMEOUT_MS"},
		{name: "drain timeout negative", set: map[string]string{"WEBHOOK_DRAIN_TIMEOUT_MS": "-1"}, want: "WEBHOOK_DRAIN_TIMEOUT_MS"},
		{name: "metrics addr without port", set: map[string]string{"METRICS_ADDR": "localhost"}, want: "METRICS_ADDR"},
		{name: "metrics endpoint label", set: map[string]string{"METRICS_ENDPOINT_LABEL": "sometimes"}, want: "METRICS_ENDPOINT_LABEL"},
		{name: "redis url scheme", set: map[string]string{"REDIS_URL": "http://127.0.0.1:6379"}, want: "REDIS_URL"},
		{name: "redis url with password does not parse", set: map[string]string{"REDIS_URL": "redis://u:redis-pw-7d1e@127.0.0.1:notaport"}, want: "REDIS_URL", leak: "redis-pw-7d1e"},
		{name: "previous secret not a standard secret", set: map[string]string{
			"WEBHOOK_SIGNATURE_SCHEME": "standard", "WEBHOOK_SECRET": "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM=",
			"WEBHOOK_SECRET_PREVIOUS": "previous-secret-0b3f"}, want: "WEBHOOK_SECRET_PREVIOUS", leak: "previous-secret-0b3f"},
		// Flags are read, and a flag wins over the environment in both directions.
		{name: "bad flag over a good variable", flags: []string{"--webhook-batch-size=0"}, want: "WEBHOOK_BATCH_SIZE"},
		{name: "good flag over a bad variable", set: map[string]string{"WEBHOOK_BATCH_SIZE": "0", "LOG_FORMAT": "xml"},
			flags: []string{"--webhook-batch-size", "5"}, want: "LOG_FORMAT", notWant: []string{"WEBHOOK_BATCH_SIZE"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := serveEnv(withPassword(t, db.URL, dbPassword), c.URL())
			for k, v := range tc.set {
				env[k] = v
			}
			code, stderr := serveInProcess(env, tc.flags...)
			if code != 2 {
				t.Fatalf("serve exited %d, want 2; output:\n%s", code, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, but the message does not name %s:\n%s", code, tc.want, stderr)
			}
			for _, v := range tc.notWant {
				if strings.Contains(stderr, v) {
					t.Errorf("the message names %s, which a flag set right:\n%s", v, stderr)
				}
			}
			for _, secret := range []string{serveSecret, dbPassword, tc.leak} {
				if secret != "" && strings.Contains(stderr, secret) {
					t.Errorf("the output shows the secret %q:\n%s", secret, stderr)
				}
			}
		})
	}

	var leased bool
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT lease_until IS NOT NULL OR leased_by IS NOT NULL OR processed FROM webhook_deliveries WHERE delivery_id = $1`, id,
	).Scan(&leased); err != nil {
		t.Fatal(err)
	}
	if leased {
		t.Errorf("a serve with an invalid configuration claimed the pending row")
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dispatcher`); n != 0 {
		t.Errorf("%d dispatchers registered by serves with an invalid configuration", n)
	}
	if arrived, _, _ := c.counts(); arrived != 0 {
		t.Errorf("the consumer got %d requests", arrived)
	}
}

// TestServeInvalidConfigNamesEveryVariable sets one bad value of each kind of check at once
// (a number that does not parse, a range, the consumer URL, a secret, REDIS_URL, a flag):
// one run must name them all, so an operator fixes them in one go.
func TestServeInvalidConfigNamesEveryVariable(t *testing.T) {
	t.Parallel()
	env := serveEnv("postgres://root@127.0.0.1:5432/none?sslmode=disable", "ftp://consumer.example")
	env["WEBHOOK_POLL_INTERVAL_MS"] = "often"
	env["WEBHOOK_LEASE_MS"] = "500"
	env["WEBHOOK_SIGNATURE_SCHEME"] = "standard"
	env["WEBHOOK_SECRET"] = "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM="
	env["WEBHOOK_SECRET_PREVIOUS"] = "not-a-whsec-secret"
	env["REDIS_URL"] = "http://127.0.0.1:6379"
	code, stderr := serveInProcess(env, "--metrics-endpoint-label=sometimes")
	if code != 2 {
		t.Fatalf("serve exited %d, want 2:\n%s", code, stderr)
	}
	for _, v := range []string{"WEBHOOK_POLL_INTERVAL_MS", "WEBHOOK_LEASE_MS", "WEBHOOK_URL", "WEBHOOK_SECRET_PREVIOUS", "REDIS_URL", "METRICS_ENDPOINT_LABEL"} {
		if !strings.Contains(stderr, v+":") && !strings.Contains(stderr, v+" ") {
			t.Errorf("the message does not name %s:\n%s", v, stderr)
		}
	}
	if n := strings.Count(stderr, "WEBHOOK_POLL_INTERVAL_MS"); n != 1 {
		t.Errorf("WEBHOOK_POLL_INTERVAL_MS reported %d times, want once:\n%s", n, stderr)
	}
}

// TestServeFlagsBeatEnvironment runs a real dispatcher configured partly by flags that
// contradict its environment: the event must go to the flag's consumer, signed with the flag's
// secret, and the environment's consumer must get nothing.
func TestServeFlagsBeatEnvironment(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	fromEnv := newHookConsumer(t, nil)
	fromFlag := newHookConsumer(t, nil)
	env := serveEnv(db.URL, fromEnv.URL())
	env["WEBHOOK_SECRET"] = "the-environment-secret-loses"
	env["WEBHOOK_POLL_INTERVAL_MS"] = "not-a-number" // invalid unless the flag wins
	p := startServe(t, "serve", env, "--webhook-url="+fromFlag.URL(), "--webhook-secret", serveSecret,
		"--webhook-poll-interval-ms=1000")
	id := enqueueOne(t, db, outbox.Event{EventType: "test.flags"})
	p.waitFor(15*time.Second, "the event delivered", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed AND status_code = 200`, id) == 1
	})
	reqs := fromFlag.requests()
	if len(reqs) != 1 || reqs[0].DeliveryID != id {
		t.Fatalf("the flag's consumer got %d requests, want the one event", len(reqs))
	}
	if reqs[0].VerifyErr != nil {
		t.Errorf("not signed with the flag's secret: %v", reqs[0].VerifyErr)
	}
	if n := len(fromEnv.requests()); n != 0 {
		t.Errorf("the environment's consumer got %d requests", n)
	}
	p.stopCleanly()
}

// TestServeUnbindableMetricsAddrClaimsNothing occupies the metrics address before serve
// starts: serve must fail naming METRICS_ADDR without having registered or claimed anything,
// because it binds the address before the dispatcher starts.
func TestServeUnbindableMetricsAddrClaimsNothing(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	id := enqueueOne(t, db, outbox.Event{})
	c := newHookConsumer(t, nil)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	env := serveEnv(db.URL, c.URL())
	env["METRICS_ADDR"] = busy.Addr().String()
	code, stderr := serveInProcess(env)
	if code == 0 || !strings.Contains(stderr, "METRICS_ADDR") {
		t.Fatalf("serve exited %d; want a failure naming METRICS_ADDR:\n%s", code, stderr)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND leased_by IS NULL AND NOT processed`, id); n != 1 {
		t.Errorf("the pending row was claimed by a serve that could not bind METRICS_ADDR")
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dispatcher`); n != 0 {
		t.Errorf("%d dispatchers registered by a serve that could not bind METRICS_ADDR", n)
	}
	if arrived, _, _ := c.counts(); arrived != 0 {
		t.Errorf("the consumer got %d requests", arrived)
	}
}

// TestServeInvalidConfigExitStatus checks the same through the real binary: the process exit
// status, which is what an orchestrator sees.
func TestServeInvalidConfigExitStatus(t *testing.T) {
	t.Parallel()
	env := serveEnv("postgres://root@127.0.0.1:5432/none?sslmode=disable", "http://127.0.0.1:1/hook")
	env["WEBHOOK_BATCH_SIZE"] = "0"
	p := startServe(t, "serve", env)
	code := p.waitExit(15 * time.Second)
	if code <= 0 {
		t.Fatalf("exit status %d, want a non-zero status", code)
	}
	if logs := p.stderr.String(); !strings.Contains(logs, "WEBHOOK_BATCH_SIZE") || strings.Contains(logs, serveSecret) {
		t.Errorf("exit %d; stderr does not name WEBHOOK_BATCH_SIZE or shows the secret:\n%s", code, logs)
	}
}

// TestServeRefusesOutdatedSchema checks that serve on a database without fluxhook's schema
// stops with the instruction to migrate.
func TestServeRefusesOutdatedSchema(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	c := newHookConsumer(t, nil)
	code, stderr := serveInProcess(serveEnv(withPassword(t, db.URL, dbPassword), c.URL()))
	if code == 0 {
		t.Fatalf("serve exited 0 on a database without the schema:\n%s", stderr)
	}
	if !strings.Contains(stderr, "fluxhook migrate") {
		t.Errorf("exit %d, but the message does not say to run `fluxhook migrate`:\n%s", code, stderr)
	}
	for _, secret := range []string{serveSecret, dbPassword} {
		if strings.Contains(stderr, secret) {
			t.Errorf("the output shows the secret %q:\n%s", secret, stderr)
		}
	}
}

// redisUserURL creates a Redis ACL user with password on the shared test server, for t only,
// and returns a REDIS_URL that authenticates as it. The user is deleted at cleanup.
func redisUserURL(t *testing.T, password string) (redisURL, user string) {
	t.Helper()
	client, err := redisstore.NewClient(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	var b [4]byte
	_, _ = rand.Read(b[:])
	user = "fluxhook_test_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	if err := client.Do(ctx, "ACL", "SETUSER", user, "on", ">"+password, "~*", "+@all").Err(); err != nil {
		t.Fatalf("creating a Redis user (Redis 6 or later is needed for ACLs): %v", err)
	}
	t.Cleanup(func() { _ = client.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	u, err := url.Parse(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	return u.String(), user
}

// redisClientsOf returns how many connections user has open on the shared test server.
func redisClientsOf(t *testing.T, user string) int {
	t.Helper()
	client, err := redisstore.NewClient(redistest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	list, err := client.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	return strings.Count(list, " user="+user+" ")
}

// TestServeLogsNoSecrets runs serve with every secret set (both signing secrets, a database
// and a Redis password, tokens in endpoint URLs) through deliveries, retries, dead letters and
// a shutdown, and checks that every log line is JSON with stable fields, that the startup line
// shows the effective configuration, and that no secret appears anywhere in the output.
func TestServeLogsNoSecrets(t *testing.T) {
	t.Parallel()
	const (
		previousSecret = "whsec-previous-7d3e1b-never-logged"
		redisPassword  = "redis-pass-0c8f5a-never-logged"
		endpointPass   = "endpoint-pass-2b6d9e-never-logged"
	)
	db := sqltest.NewMigrated(t)
	ok := newHookConsumer(t, nil)
	failing := newHookConsumer(t, func(context.Context, *hookRequest) int { return http.StatusInternalServerError })
	const hookToken, failToken = "hook-query-token-5e1d", "fail-query-token-9b7c"
	hookURL := ok.URL() + "?token=" + hookToken
	failURL := failing.URL() + "?token=" + failToken
	// Credentials in an endpoint URL make the row invalid: dead-lettered with a reason that
	// must not repeat them.
	credURL := "https://shop:" + endpointPass + "@example.com/hook"
	redisURL, redisUser := redisUserURL(t, redisPassword)

	env := serveEnv(withPassword(t, db.URL, dbPassword), hookURL)
	env["WEBHOOK_RETRY_SCHEDULE"] = "100ms" // two attempts, then a dead letter
	env["WEBHOOK_SECRET_PREVIOUS"] = previousSecret
	env["REDIS_URL"] = redisURL
	p := startServe(t, "serve", env)
	enqueueOne(t, db, outbox.Event{EventType: "test.ok"})
	enqueueOne(t, db, outbox.Event{EventType: "test.ok"})
	failID := enqueueOne(t, db, outbox.Event{EventType: "test.fail", EndpointURL: failURL})
	// Plain SQL, as any producer may write: outbox.Enqueue refuses such a URL itself.
	var credID string
	if err := db.Pool.QueryRow(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, endpoint_url)
		VALUES ('test.cred', '{}', $1) RETURNING delivery_id::text`, credURL).Scan(&credID); err != nil {
		t.Fatal(err)
	}
	p.waitFor(15*time.Second, "every row settled and two dead-lettered", func() bool {
		return unprocessed(t, db) == 0 && queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter`) == 2
	})
	p.waitLog(5*time.Second, `"msg":"delivery dead-lettered"`)
	// The gate really used Redis, authenticated as the user: a wrong or mangled password
	// would have it fail open instead.
	if n := redisClientsOf(t, redisUser); n == 0 {
		t.Errorf("serve has no Redis connection as %s", redisUser)
	}
	p.stopCleanly()

	logs := p.stderr.String()
	output := p.stdout.String() + logs
	for _, secret := range []string{
		serveSecret, previousSecret, dbPassword, redisPassword, endpointPass, hookToken, failToken,
	} {
		if strings.Contains(output, secret) {
			t.Errorf("the output shows %q", secret)
		}
	}
	// A consumer is named by its URL's origin (which consumer failed), never by its path or
	// query, where the tokens are.
	if origin := `"origin":"http://` + failing.srv.Listener.Addr().String() + `"`; !strings.Contains(logs, origin) {
		t.Errorf("the failing consumer's lines lack %s", origin)
	}
	if strings.Contains(logs, "gate store unavailable") {
		t.Errorf("the gate failed open: serve could not use Redis with the password in REDIS_URL")
	}
	sum := sha256.Sum256([]byte(failURL))
	failHash := hex.EncodeToString(sum[:]) // the breaker's key: at debug, as endpoint_hash
	failOrigin := "http://" + failing.srv.Listener.Addr().String()
	failures := map[string]int{}
	var startup map[string]any
	for i, line := range logLinesOf(logs) {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line %d is not JSON (%v): %s", i+1, err, line)
			continue
		}
		for _, field := range []string{"msg", "level", "ts"} {
			if _, ok := entry[field].(string); !ok {
				t.Errorf("log line %d has no string %q: %s", i+1, field, line)
			}
		}
		msg, _ := entry["msg"].(string)
		if msg == "starting fluxhook" {
			startup = entry
		}
		if msg != "delivery attempt failed" && msg != "delivery dead-lettered" {
			continue
		}
		failures[msg]++
		if entry["delivery_id"] == credID {
			if msg != "delivery dead-lettered" || entry["event_type"] != "test.cred" {
				t.Errorf("the row with credentials in its URL: %s", line)
			}
			continue
		}
		want := map[string]any{
			"delivery_id":   failID,
			"event_type":    "test.fail",
			"status":        float64(http.StatusInternalServerError),
			"origin":        failOrigin,
			"endpoint_hash": failHash,
		}
		for k, v := range want {
			if entry[k] != v {
				t.Errorf("%q line: %s = %#v, want %#v: %s", msg, k, entry[k], v, line)
			}
		}
		for _, k := range []string{"attempt", "duration_ms"} {
			if _, ok := entry[k].(float64); !ok {
				t.Errorf("%q line: no numeric %s: %s", msg, k, line)
			}
		}
	}
	// One line per failed attempt and per dead letter: the failing row's first attempt is
	// retried, its second dead-lettered, and the invalid row dead-lettered without an attempt.
	if failures["delivery attempt failed"] != 1 || failures["delivery dead-lettered"] != 2 {
		t.Errorf("failure lines %v, want 1 failed attempt and 2 dead letters", failures)
	}

	// The startup line: the effective configuration, computed defaults included, every
	// secret redacted and the consumer URL by its origin.
	if startup == nil {
		t.Fatalf("no \"starting fluxhook\" line")
	}
	redisRedacted := strings.Replace(redisURL, redisPassword, "xxxxx", 1)
	for k, v := range map[string]string{
		"webhook_secret":           "[redacted]",
		"webhook_secret_previous":  "[redacted]",
		"redis_url":                redisRedacted,
		"webhook_url_origin":       "http://" + ok.srv.Listener.Addr().String(),
		"webhook_timeout_ms":       "15000",
		"webhook_lease_ms":         "60000", // 2×timeout + 30 s
		"webhook_drain_timeout_ms": "20000", // timeout + 5 s
		"webhook_retry_schedule":   "100ms",
		"log_level":                "debug",
	} {
		if startup[k] != v {
			t.Errorf("startup line: %s = %#v, want %q", k, startup[k], v)
		}
	}
	if dbURL, _ := startup["database_url"].(string); !strings.Contains(dbURL, "root:xxxxx@127.0.0.1") {
		t.Errorf("startup line: database_url = %q, want the URL with its password masked", dbURL)
	}
	for _, r := range append(ok.requests(), failing.requests()...) {
		if r.VerifyErr != nil {
			t.Errorf("request %s: signature does not verify: %v", r.DeliveryID, r.VerifyErr)
		}
	}
	if n := len(failing.requests()); n != 2 {
		t.Errorf("failing consumer got %d requests, want 2 (the schedule allows one retry)", n)
	}
}

// TestServeLogsOnlyJSONWithRedisDown: with REDIS_URL pointing at a Redis that is down, the
// dispatcher fails open and delivers; every line it writes to stderr is JSON, the Redis
// client library's own complaints (failed dials) included: they go through the logger.
func TestServeLogsOnlyJSONWithRedisDown(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	c := newHookConsumer(t, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "redis://" + l.Addr().String() // nothing listens once closed
	l.Close()
	env := serveEnv(db.URL, c.URL())
	env["REDIS_URL"] = down
	env["WEBHOOK_CIRCUIT_BREAKER_THRESHOLD"] = "3"
	p := startServe(t, "serve", env)
	for range 5 {
		enqueueOne(t, db, outbox.Event{})
	}
	p.waitFor(15*time.Second, "the events delivered, failing open", func() bool {
		_, _, ok := c.counts()
		return ok == 5
	})
	p.waitLog(10*time.Second, `"msg":"gate store unavailable`)
	p.stopCleanly()
	for _, line := range logLinesOf(p.stderr.String()) {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Errorf("a stderr line is not JSON: %q", line)
		}
	}
}

// TestServeRowURLToLoopbackNeedsAllowance: serve without WEBHOOK_ROW_URL_NETWORKS dead-letters
// a row whose endpoint_url names a loopback listener (by IP and as localhost), and the listener
// receives nothing; WEBHOOK_URL on loopback still delivers. The dead letter, which the row's
// tenant reads, names no setting; serve's log names the setting that would allow it.
func TestServeRowURLToLoopbackNeedsAllowance(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	hook, local := newHookConsumer(t, nil), newHookConsumer(t, nil)
	env := serveEnv(db.URL, hook.URL())
	delete(env, "WEBHOOK_ROW_URL_NETWORKS")
	p := startServe(t, "serve", env)

	port := local.srv.Listener.Addr().(*net.TCPAddr).Port
	rows := []string{
		enqueueOne(t, db, outbox.Event{EventType: "test.row", EndpointURL: fmt.Sprintf("http://127.0.0.1:%d/containers/create?name=x", port)}),
		enqueueOne(t, db, outbox.Event{EventType: "test.row", EndpointURL: fmt.Sprintf("http://localhost:%d/containers/create?name=x", port)}),
	}
	enqueueOne(t, db, outbox.Event{EventType: "test.ok"})
	p.waitFor(15*time.Second, "every row settled and the row URLs dead-lettered", func() bool {
		return unprocessed(t, db) == 0 && queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter`) == len(rows)
	})
	p.stopCleanly()

	if arrived, _, _ := local.counts(); arrived != 0 {
		t.Errorf("the loopback listener named by rows received %d requests, want none", arrived)
	}
	if _, _, ok := hook.counts(); ok != 1 {
		t.Errorf("WEBHOOK_URL on loopback answered %d requests, want 1", ok)
	}
	for _, id := range rows {
		reason := queryStrings(t, db, `SELECT reason FROM webhook_dead_letter WHERE delivery_id = $1`, id)
		if len(reason) != 1 || !strings.Contains(reason[0], "endpoint refused") || strings.Contains(reason[0], "WEBHOOK_") {
			t.Errorf("row %s: dead-letter reason %q, want one refusal naming no setting", id, reason)
		}
	}
	if logs := p.stderr.String(); strings.Count(logs, "WEBHOOK_ROW_URL_NETWORKS allows it") < len(rows) {
		t.Errorf("serve's log names WEBHOOK_ROW_URL_NETWORKS in fewer than %d dead-lettered lines:\n%s", len(rows), logs)
	}
	if logs := p.stderr.String(); strings.Contains(logs, "containers") || strings.Contains(logs, "name=x") {
		t.Errorf("serve's log repeats a row URL's path or query:\n%s", logs)
	}
}
