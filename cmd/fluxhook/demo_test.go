package main

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// receivedLine is the demo's line for one verified arrival, with its insert → arrival latency.
var receivedLine = regexp.MustCompile(`(?m)^✓ received \S+ +delivery [0-9a-f-]{36}  attempt (\d+)  signature ok  \d+\.\d ms after insert  body \{.*"demo":true.*\}$`)

// demoLeftovers checks what a finished demo must not leave in the database: a registered
// dispatcher or an open session.
func demoLeftovers(t *testing.T, db *sqltest.DB) {
	t.Helper()
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dispatcher`); n != 0 {
		t.Errorf("the demo left %d dispatchers registered", n)
	}
	pollUntil(t, 10*time.Second, "the demo's sessions to end", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'fluxhook%'`) == 0
	})
}

// TestDemoDeliversSampleEvents runs the README's first command against a test database with a
// small event count: every sample event arrives verified with its latency, the fifth one
// through the flaky endpoint after a retry, the two managed endpoints get the events their
// filters match, and the demo exits 0 by itself.
func TestDemoDeliversSampleEvents(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	p := startCommand(t, fluxhookBinary(t), "demo", map[string]string{"DATABASE_URL": db.URL},
		"demo", "--events", "5", "--interval", "50ms")
	if code := p.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("demo exited %d, want 0; stdout:\n%s", code, p.stdout.String())
	}
	out := p.stdout.String()
	received := receivedLine.FindAllStringSubmatch(out, -1)
	if len(received) != 5 {
		t.Fatalf("%d verified arrivals with a latency, want 5; stdout:\n%s", len(received), out)
	}
	retried := 0
	for _, m := range received {
		if m[1] == "2" {
			retried++
		}
	}
	if retried != 1 || !strings.Contains(out, "flaky endpoint answered 503 to attempt 1") {
		t.Errorf("want the flaky endpoint's event retried once and then received; stdout:\n%s", out)
	}
	// The two managed endpoints got the events their filters match (events 1 and 4 are
	// stream.*, event 2 order.*; the flaky one names its own endpoint_url and is not routed),
	// each verified with that endpoint's own secret by its receiver.
	if n := strings.Count(out, "↳ endpoint streams  got stream."); n != 2 {
		t.Errorf("the streams endpoint got %d events, want 2; stdout:\n%s", n, out)
	}
	if n := strings.Count(out, "↳ endpoint orders   got order.paid"); n != 1 {
		t.Errorf("the orders endpoint got %d events, want 1; stdout:\n%s", n, out)
	}
	if !strings.Contains(out, "5 events delivered; done") || strings.Contains(out, "✗") {
		t.Errorf("the demo did not finish cleanly; stdout:\n%s", out)
	}
	demoLeftovers(t, db)
}

// TestDemoStopsOnSIGINT runs the demo without an event count, as a person does, and stops it
// with Ctrl-C once events arrive: it must drain, exit 0 and leave nothing behind.
func TestDemoStopsOnSIGINT(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	p := startCommand(t, fluxhookBinary(t), "demo", map[string]string{"DATABASE_URL": db.URL},
		"demo", "--interval", "50ms")
	p.waitFor(60*time.Second, "two sample events to arrive", func() bool {
		return len(receivedLine.FindAllString(p.stdout.String(), -1)) >= 2
	})
	p.signal(syscall.SIGINT)
	if code := p.waitExit(20 * time.Second); code != 0 {
		t.Fatalf("demo exited %d after SIGINT, want 0; stdout:\n%s", code, p.stdout.String())
	}
	if out := p.stdout.String(); !strings.Contains(out, "stopping: draining in-flight deliveries") {
		t.Errorf("no shutdown message; stdout:\n%s", out)
	}
	demoLeftovers(t, db)
}
