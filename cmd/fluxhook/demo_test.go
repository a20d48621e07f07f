package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// receivedLine is the demo's line for one verified arrival, with its insert → arrival latency.
var receivedLine = regexp.MustCompile(`(?m)^✓ received \S+ +delivery [0-9a-f-]{36}  attempt (\d+)  signature ok  \d+\.\d ms after insert  body \{.*"demo":true.*\}$`)

// demoLeftovers checks what a finished demo must not leave: its database on the server, or
// anything in the user's database (DATABASE_URL's), which it must never have touched.
func demoLeftovers(t *testing.T, db *sqltest.DB, out string) {
	t.Helper()
	name := demoDatabase.FindStringSubmatch(out)
	if name == nil {
		t.Fatalf("the demo did not say which database it ran in; stdout:\n%s", out)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM pg_database WHERE datname = $1`, name[1]); n != 0 {
		t.Errorf("the demo left its database %s on the server", name[1])
	}
	if n := queryInt(t, db, `SELECT count(*) FROM pg_class WHERE relname LIKE 'webhook%'`); n != 0 {
		t.Errorf("the demo created %d webhook tables in the user's database", n)
	}
}

// demoDatabase finds the name of the database the demo says it runs in.
var demoDatabase = regexp.MustCompile(`running in a database of the demo's own, (fluxhook_demo_[0-9a-f]{12}),`)

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
	demoLeftovers(t, db, out)
}

// demoPortalLink finds the portal link the demo prints.
var demoPortalLink = regexp.MustCompile(`(?m)^  (http://127\.0\.0\.1:\d+)/portal/#session=(fhp_\S+)$`)

// checkDemoPortal opens the portal link the demo printed, as the page does: the page is served
// with its policy, and the link's token is tenant demo's, which sees the demo's three
// endpoints and the events delivered so far.
func checkDemoPortal(t *testing.T, out string) {
	t.Helper()
	m := demoPortalLink.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the demo printed no portal link; stdout:\n%s", out)
	}
	base, token := m[1], m[2]
	resp, err := http.Get(base + "/portal/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("the portal page: %d, CSP %q", resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
	}
	addr := strings.TrimPrefix(base, "http://")
	if code, me := apiCall(t, addr, token, "GET", "/v1/me", ""); code != http.StatusOK || me["tenant"] != demoTenant || me["portal"] != true {
		t.Fatalf("GET /v1/me with the portal link's token: %d %v", code, me)
	}
	code, eps := apiCall(t, addr, token, "GET", "/v1/endpoints", "")
	if list, _ := eps["data"].([]any); code != http.StatusOK || len(list) != 3 {
		t.Fatalf("the demo's portal lists %d endpoints (%d), want 3: %v", len(list), code, eps)
	}
	code, evs := apiCall(t, addr, token, "GET", "/v1/events", "")
	if list, _ := evs["data"].([]any); code != http.StatusOK || len(list) < 2 {
		t.Fatalf("the demo's portal lists %d events (%d), want the ones delivered: %v", len(list), code, evs)
	}
}

// demoCurl is the curl line the demo prints for its first delivery: the header and the URL.
var demoCurl = regexp.MustCompile(`curl -s -H 'Authorization: ([^']+)' (http://\S+/v1/deliveries/\S+)`)

// TestDemoStopsOnSIGINT runs the demo without an event count, as a person does, and stops it
// with Ctrl-C once events arrive: it must drain, exit 0 and leave nothing behind. While it
// runs, the portal link it printed works.
func TestDemoStopsOnSIGINT(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	p := startCommand(t, fluxhookBinary(t), "demo", map[string]string{"DATABASE_URL": db.URL},
		"demo", "--interval", "50ms")
	p.waitFor(60*time.Second, "two sample events to arrive", func() bool {
		return len(receivedLine.FindAllString(p.stdout.String(), -1)) >= 2
	})
	// The curl line the demo prints for its first delivery works, as printed, while it runs.
	m := demoCurl.FindStringSubmatch(p.stdout.String())
	if m == nil {
		t.Fatalf("the demo printed no curl line for its first delivery; stdout:\n%s", p.stdout.String())
	}
	// The line is printed as the consumer receives the delivery, which the dispatcher settles
	// a moment later: until then the delivery shows no attempt.
	var status int
	var body []byte
	pollUntil(t, 10*time.Second, "the demo's curl line to show the delivery's attempts", func() bool {
		req, _ := http.NewRequest("GET", m[2], nil)
		req.Header.Set("Authorization", m[1])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		status = resp.StatusCode
		if status != http.StatusOK {
			t.Fatalf("the demo's curl line answered %d: %s", status, body)
		}
		return strings.Contains(string(body), `"attempts"`)
	})
	checkDemoPortal(t, p.stdout.String())
	p.signal(syscall.SIGINT)
	if code := p.waitExit(20 * time.Second); code != 0 {
		t.Fatalf("demo exited %d after SIGINT, want 0; stdout:\n%s", code, p.stdout.String())
	}
	if out := p.stdout.String(); !strings.Contains(out, "stopping: draining in-flight deliveries") {
		t.Errorf("no shutdown message; stdout:\n%s", out)
	}
	demoLeftovers(t, db, p.stdout.String())
}

// TestDemoNeverTouchesTheUsersDatabase: the quick start has the user export DATABASE_URL, run
// serve and add an order.* endpoint; the demo run in that shell must not deliver its sample
// order.paid to the user's endpoint, must finish although the user's serve is running, and
// must leave the user's tables as they were.
func TestDemoNeverTouchesTheUsersDatabase(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	users := newHookConsumer(t, func(context.Context, *hookRequest) int { return http.StatusOK })
	if r := runCLI(t, db.URL, "endpoints", "add", "--url", users.URL(), "--event-types", "order.*", "--secret", serveSecret); r.code != 0 {
		t.Fatalf("endpoints add exited %d: %s", r.code, r.stderr)
	}
	env := faultEnv(db.URL, "")
	delete(env, "WEBHOOK_URL")
	serve := startServe(t, "serve", env)
	serve.instanceID()
	p := startCommand(t, fluxhookBinary(t), "demo", map[string]string{"DATABASE_URL": db.URL},
		"demo", "--events", "5", "--interval", "50ms")
	if code := p.waitExit(60 * time.Second); code != 0 {
		t.Fatalf("demo exited %d beside the user's serve, want 0; stdout:\n%s", code, p.stdout.String())
	}
	if n := len(users.requests()); n != 0 {
		t.Errorf("the user's order.* endpoint received %d of the demo's events", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_deliveries`); n != 0 {
		t.Errorf("the demo wrote %d rows to the user's queue and log", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_endpoints`); n != 1 {
		t.Errorf("the user's database holds %d endpoints after the demo, want the user's one", n)
	}
	name := demoDatabase.FindStringSubmatch(p.stdout.String())
	if name == nil || queryInt(t, db, `SELECT count(*) FROM pg_database WHERE datname = $1`, name[1]) != 0 {
		t.Errorf("the demo's database is left on the server (or unnamed); stdout:\n%s", p.stdout.String())
	}
	serve.stopCleanly()
}
