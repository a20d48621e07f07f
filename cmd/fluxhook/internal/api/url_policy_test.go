package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/api"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/dispatcher"
)

// startDispatcher runs a real dispatcher on h's database with the default network policies
// (WEBHOOK_ALLOWED_NETWORKS and WEBHOOK_ROW_URL_NETWORKS empty), as production does.
func startDispatcher(t *testing.T, h *harness) {
	t.Helper()
	d, err := dispatcher.New(dispatcher.Config{DatabaseURL: h.db.URL, PollInterval: 100 * time.Millisecond,
		Timeout: 5 * time.Second, RetrySchedule: []time.Duration{100 * time.Millisecond},
		RetryJitter: -1, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
}

// testEventState sends the endpoint a test event as key and waits for its one destination to
// be delivered or dead-lettered, returning the delivery as the API shows it and that state.
func testEventState(h *harness, key, ep string) (response, string) {
	h.t.Helper()
	test := h.must(http.StatusAccepted, key, "POST", "/v1/endpoints/"+ep+"/test", nil)
	var state string
	r := h.poll(key, test.Header.Get("Location"), func(r response) bool {
		ds, _ := r.Body["destinations"].([]any)
		if len(ds) != 1 {
			return false
		}
		state, _ = ds[0].(map[string]any)["state"].(string)
		return state == "delivered" || state == "dead_lettered"
	})
	return r, state
}

// TestTenantURLsReachOnlyPublicAddresses: a tenant key (or a tenant's portal session: the
// application's customer) cannot give an endpoint a URL on the dispatcher's own host (an admin
// port, metrics, a sidecar), by creating it or moving it there, and is told to use a public
// address, not a setting it cannot change. An endpoint whose URL a tenant wrote is restricted,
// and the dispatcher dials it as a producer's endpoint_url: were its URL to lead to loopback
// anyway, the test event is dead-lettered without a request, and the tenant reads nothing of
// the service. An admin key that writes the same URL vouches for it as the operator.
func TestTenantURLsReachOnlyPublicAddresses(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	var hits atomic.Int32
	internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write([]byte("internal-only admin page"))
	}))
	t.Cleanup(internal.Close)
	startDispatcher(t, h)

	for _, u := range []string{internal.URL + "/admin", strings.Replace(internal.URL, "127.0.0.1", "localhost", 1) + "/x",
		"http://[::1]:9/", "https://localhost:5432/", "https://metadata.localhost/"} {
		r := h.must(http.StatusUnprocessableEntity, acme, "POST", "/v1/endpoints", map[string]any{"url": u})
		if code, field := r.errorCode(); code != "invalid" || field != "url" || !strings.Contains(string(r.Raw), "must lead to a public address") ||
			strings.Contains(string(r.Raw), "WEBHOOK_") {
			t.Errorf("a tenant's endpoint at %s = %s; want invalid url, telling it to use a public address and naming no setting", u, r.Raw)
		}
	}
	// A name that resolves to a private address and one that does not resolve get the same
	// answer, with neither the address nor the resolver's error (which names the DNS server):
	// told apart, a tenant could list the internal names that exist.
	var answers []string
	for _, host := range []string{"internal.example", "nowhere.example"} {
		r := h.must(http.StatusUnprocessableEntity, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://" + host + "/in"})
		answers = append(answers, strings.ReplaceAll(string(r.Raw), host, "HOST"))
		for _, leak := range []string{"10.0.0.5", "resolve", "lookup", "WEBHOOK_"} {
			if strings.Contains(string(r.Raw), leak) {
				t.Errorf("a tenant's endpoint at %s = %s; it says %q", host, r.Raw, leak)
			}
		}
	}
	if answers[0] != answers[1] {
		t.Errorf("a tenant tells a private name from a missing one:\n%s\n%s", answers[0], answers[1])
	}

	created := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a"})
	ep := created.Body["id"].(string)
	if created.Body["restricted"] != true {
		t.Fatalf("a tenant's endpoint = %s; want restricted", created.Raw)
	}
	if r := h.must(http.StatusUnprocessableEntity, acme, "PATCH", "/v1/endpoints/"+ep, map[string]any{"url": internal.URL + "/admin"}); !strings.Contains(string(r.Raw), "public address") {
		t.Errorf("a tenant's move of its endpoint to loopback = %s; want refused, telling it to use a public address", r.Raw)
	}

	// Say the URL leads to loopback all the same (written before the API checked it so, or
	// by hand): the dispatcher refuses it, as it refuses a producer's.
	h.exec(`UPDATE webhook_endpoints SET url = $1 WHERE id = $2`, internal.URL+"/admin", ep)
	r, state := testEventState(h, acme, ep)
	if state != "dead_lettered" || hits.Load() != 0 || strings.Contains(string(r.Raw), "internal-only") {
		t.Errorf("a restricted endpoint on loopback: %d requests reached the service, the delivery is %s: %s", hits.Load(), state, r.Raw)
	}

	// An admin key writes the URL: the operator vouches for it, and loopback URLs are theirs.
	moved := h.must(http.StatusOK, h.admin, "PATCH", "/v1/endpoints/"+ep, map[string]any{"url": internal.URL + "/admin"})
	if moved.Body["restricted"] != false {
		t.Fatalf("an admin key's URL = %s; want the endpoint unrestricted", moved.Raw)
	}
	if r, _ := testEventState(h, acme, ep); hits.Load() == 0 || !strings.Contains(string(r.Raw), "418") {
		t.Errorf("the operator's loopback endpoint: %d requests; want the test event sent and its 418 shown: %s", hits.Load(), r.Raw)
	}
}

// TestWhoWritesTheURLDecidesRestricted: an endpoint is restricted when a tenant key or a portal
// session (even an operator's: a link in a browser) wrote its URL, and not when an admin key
// or the CLI did. A change of another field keeps it as it is; only a write of the URL moves
// it, and an admin key's write of the same URL is how the operator vouches for a tenant's.
// The audit trail shows it with the endpoint.
func TestWhoWritesTheURLDecidesRestricted(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	restricted := func(ep string) any {
		t.Helper()
		return h.must(http.StatusOK, h.admin, "GET", "/v1/endpoints/"+ep, nil).Body["restricted"]
	}

	ep := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a"}).Body["id"].(string)
	h.must(http.StatusOK, h.admin, "PATCH", "/v1/endpoints/"+ep, map[string]any{"description": "reviewed"})
	if got := restricted(ep); got != true {
		t.Errorf("after an admin's change of the description, restricted = %v; want true (the URL is still the tenant's)", got)
	}
	h.must(http.StatusOK, h.admin, "PATCH", "/v1/endpoints/"+ep, map[string]any{"url": "https://hooks.example.com/a"})
	if got := restricted(ep); got != false {
		t.Errorf("after an admin wrote the same URL, restricted = %v; want false (the operator vouches)", got)
	}
	h.must(http.StatusOK, acme, "PATCH", "/v1/endpoints/"+ep, map[string]any{"description": "mine"})
	if got := restricted(ep); got != false {
		t.Errorf("after a tenant's change of the description, restricted = %v; want false still", got)
	}
	h.must(http.StatusOK, acme, "PATCH", "/v1/endpoints/"+ep, map[string]any{"url": "https://hooks.example.com/b"})
	if got := restricted(ep); got != true {
		t.Errorf("after a tenant wrote the URL, restricted = %v; want true", got)
	}

	if r := h.must(http.StatusCreated, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "http://127.0.0.1:9/hooks"}); r.Body["restricted"] != false {
		t.Errorf("an admin key's endpoint on loopback = %s; want it created unrestricted", r.Raw)
	}
	op := h.must(http.StatusCreated, h.admin, "POST", "/v1/portal-sessions", nil)
	u, _ := url.Parse(op.Body["url"].(string))
	session := strings.TrimPrefix(u.Fragment, "session=")
	h.must(http.StatusUnprocessableEntity, session, "POST", "/v1/endpoints", map[string]any{"url": "http://127.0.0.1:9/hooks"})
	if r := h.must(http.StatusCreated, session, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/op"}); r.Body["restricted"] != true {
		t.Errorf("an operator's portal session's endpoint = %s; want restricted", r.Raw)
	}

	trail := h.must(http.StatusOK, h.admin, "GET", "/v1/audit?object_id="+ep+"&limit=1", nil)
	if !strings.Contains(string(trail.Raw), `"restricted":true`) {
		t.Errorf("the audit trail does not show the endpoint restricted after the tenant's URL: %s", trail.Raw)
	}
}

// TestRowURLNetworksWidenTenantURLs: WEBHOOK_ROW_URL_NETWORKS, which lets producers' URLs
// reach networks beyond public addresses, lets tenants' endpoints reach them too, and nothing
// more (not loopback); WEBHOOK_ALLOWED_NETWORKS stays the operator's alone.
func TestRowURLNetworksWidenTenantURLs(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, func(c *api.Config) {
		c.RowURLNetworks = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	})
	acme := h.key(ptr("acme"))
	for _, u := range []string{"https://internal.example/in", "https://10.0.0.5/in"} {
		if r := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": u}); r.Body["restricted"] != true {
			t.Errorf("a tenant's endpoint at %s = %s; want it created, restricted", u, r.Raw)
		}
	}
	h.must(http.StatusUnprocessableEntity, acme, "POST", "/v1/endpoints", map[string]any{"url": "http://127.0.0.1:9/"})
	if r := h.must(http.StatusUnprocessableEntity, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "https://10.0.0.5/in"}); !strings.Contains(string(r.Raw), "WEBHOOK_ALLOWED_NETWORKS") {
		t.Errorf("an admin key's private URL = %s; want it refused naming WEBHOOK_ALLOWED_NETWORKS, the operator's setting", r.Raw)
	}
}

// TestDotLocalhostIsLoopback: a name under localhost is loopback (RFC 6761), checked as
// localhost is rather than let through unchecked: refused for a tenant, and an operator's
// loopback URL for an admin key, which may use http as on localhost.
func TestDotLocalhostIsLoopback(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	for _, u := range []string{"https://metadata.localhost/", "https://a.b.LOCALHOST./"} {
		h.must(http.StatusUnprocessableEntity, acme, "POST", "/v1/endpoints", map[string]any{"url": u})
	}
	if r := h.must(http.StatusCreated, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "http://app.localhost:8080/hooks"}); r.Body["restricted"] != false {
		t.Errorf("an admin key's endpoint under localhost = %s", r.Raw)
	}
}

// newHarnessWith is newHarness with the API's configuration changed by tweak.
func newHarnessWith(t testing.TB, tweak func(*api.Config)) *harness {
	t.Helper()
	db := sqltest.NewMigrated(t)
	c, err := endpoints.NewCipher("", "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := api.Config{Pool: sqltest.ConnectAs(t, db, documentedAPIRole(t, db)), Cipher: c, DefaultURL: defaultURL, Resolver: fakeResolver{
		"hooks.example.com": {netip.MustParseAddr("93.184.215.14")},
		"internal.example":  {netip.MustParseAddr("10.0.0.5")},
	}}
	tweak(&cfg)
	a := api.New(cfg)
	srv := httptest.NewServer(a)
	t.Cleanup(a.Close)
	t.Cleanup(srv.Close)
	h := &harness{t: t, db: db, srv: srv, api: a}
	h.admin = h.key(nil)
	return h
}
