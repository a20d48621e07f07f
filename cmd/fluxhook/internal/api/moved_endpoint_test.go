package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestMovedEndpointsDeadLetterNamesNoOtherTenant: an endpoint of acme is moved to globex while a
// request of an acme event is in flight. The retry is never sent across tenants (it is
// dead-lettered), and the dead letter, which acme's key reads, does not name the tenant the
// endpoint now belongs to: another customer, as the replay path's endpoint_removed keeps it.
func TestMovedEndpointsDeadLetterNamesNoOtherTenant(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	arrived, release := make(chan struct{}, 10), make(chan struct{})
	consumer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(consumer.Close)
	ep := h.endpoint(consumer.URL+"/acme", "acme")
	startDispatcher(t, h)
	enqueueFor(t, h, "acme")
	select {
	case <-arrived:
	case <-time.After(20 * time.Second):
		t.Fatal("the first attempt never arrived")
	}
	h.must(http.StatusOK, h.admin, "PATCH", "/v1/endpoints/"+ep, map[string]any{"tenant": "globex", "headers": map[string]string{}})
	close(release)
	r := h.poll(acme, "/v1/dead-letters", func(r response) bool { return len(r.Body["data"].([]any)) > 0 })
	if strings.Contains(string(r.Raw), "globex") {
		t.Errorf("acme's dead letters name the tenant its old endpoint now belongs to: %s", r.Raw)
	}
	// The move dead-letters the row ("endpoint tenant changed") unless the request is still in
	// flight; then the dispatcher refuses its retry ("never sent across tenants").
	if !strings.Contains(string(r.Raw), "endpoint tenant changed") && !strings.Contains(string(r.Raw), "never sent across tenants") {
		t.Errorf("acme's dead letter does not say why: %s", r.Raw)
	}
}

// TestMovedEndpointStartsWithoutHealth: an endpoint given to another tenant no longer shows
// when the old tenant's last delivery succeeded, nor dates a failure streak from the old
// tenant's failures (which would count towards disabling it for the new one).
func TestMovedEndpointStartsWithoutHealth(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme, globex := h.key(ptr("acme")), h.key(ptr("globex"))
	consumer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(consumer.Close)
	ep := h.endpoint(consumer.URL+"/acme", "acme")
	startDispatcher(t, h)
	enqueueFor(t, h, "acme")
	h.poll(acme, "/v1/endpoints/"+ep, func(r response) bool { s, _ := r.Body["last_success_at"].(string); return s != "" })
	h.exec(`UPDATE webhook_endpoints SET failing_since = now() - interval '1 hour' WHERE id = $1`, ep)
	h.must(http.StatusOK, h.admin, "PATCH", "/v1/endpoints/"+ep, map[string]any{"tenant": "globex", "headers": map[string]string{}})
	got := h.must(http.StatusOK, globex, "GET", "/v1/endpoints/"+ep, nil)
	if got.Body["last_success_at"] != nil || got.Body["failing_since"] != nil {
		t.Errorf("globex reads acme's delivery health on the endpoint it was given: %s", got.Raw)
	}
	// A change that keeps the tenant keeps the health.
	h.exec(`UPDATE webhook_endpoints SET last_success_at = now() WHERE id = $1`, ep)
	h.must(http.StatusOK, globex, "PATCH", "/v1/endpoints/"+ep, map[string]any{"description": "renamed"})
	if got := h.must(http.StatusOK, globex, "GET", "/v1/endpoints/"+ep, nil); got.Body["last_success_at"] == nil {
		t.Errorf("a change within the tenant cleared the endpoint's health: %s", got.Raw)
	}
}

// TestTenantTrailNamesNoOperator: a tenant reading its audit trail sees its own keys as the
// actors of their changes, and "operator" for any other: an operator's login name (a CLI
// change) or an admin key's id is not a customer's to read. An admin key reads them all.
func TestTenantTrailNamesNoOperator(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	c, err := endpoints.NewCipher("", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := endpoints.AddAudited(context.Background(), h.db.Pool, c,
		endpoints.New{URL: "https://hooks.example.com/a", Tenant: "acme"}, "cli:alice.ops"); err != nil {
		t.Fatal(err)
	}
	h.must(http.StatusCreated, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/b", "tenant": "acme"})
	h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/c"})
	actors := map[string]int{}
	for _, e := range h.must(http.StatusOK, acme, "GET", "/v1/audit", nil).Body["data"].([]any) {
		actors[e.(map[string]any)["actor"].(string)]++
	}
	if actors["operator"] != 2 || len(actors) != 2 {
		t.Errorf("acme's trail shows actors %v, want 'operator' twice and its own key once", actors)
	}
	for a := range actors {
		if a != "operator" && !strings.HasPrefix(a, "key:") {
			t.Errorf("acme's trail shows actor %q", a)
		}
	}
	if r := h.must(http.StatusOK, h.admin, "GET", "/v1/audit", nil); !strings.Contains(string(r.Raw), "cli:alice.ops") {
		t.Errorf("the admin's trail lost the CLI user: %s", r.Raw)
	}
}

// TestTenantReadsNoOperatorIdentity: the operator's identity reaches a tenant through no other
// field either: the created_by of a key or a recovery shown in the trail's before and after, and
// a recovery read or cancelled by the tenant, all read "operator" when an admin key made them.
func TestTenantReadsNoOperatorIdentity(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	adminActor := "key:" + h.must(http.StatusOK, h.admin, "GET", "/v1/me", nil).Body["key_id"].(string)
	h.must(http.StatusCreated, h.admin, "POST", "/v1/api-keys", map[string]any{"tenant": "acme", "description": "ci"})
	ep := h.endpoint("https://hooks.example.com/a", "acme")
	rec := h.must(http.StatusAccepted, h.admin, "POST", "/v1/endpoints/"+ep+"/recover",
		map[string]any{"since": time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)})
	id := rec.Body["id"].(string)
	for _, path := range []string{"/v1/audit", "/v1/recoveries/" + id} {
		r := h.must(http.StatusOK, acme, "GET", path, nil)
		if strings.Contains(string(r.Raw), adminActor) {
			t.Errorf("GET %s as acme names the admin key: %s", path, r.Raw)
		}
		if !strings.Contains(string(r.Raw), `"created_by":"operator"`) {
			t.Errorf("GET %s as acme: no created_by read as operator: %s", path, r.Raw)
		}
	}
	if r := h.must(http.StatusOK, h.admin, "GET", "/v1/recoveries/"+id, nil); !strings.Contains(string(r.Raw), adminActor) {
		t.Errorf("the admin no longer reads who started the recovery: %s", r.Raw)
	}
}

// enqueueFor enqueues one order.created event of tenant.
func enqueueFor(t *testing.T, h *harness, tenant string) {
	t.Helper()
	if _, err := outbox.Enqueue(context.Background(), h.db.Pool, outbox.Event{EventType: "order.created",
		Payload: map[string]any{"n": 1}, Tenant: tenant}); err != nil {
		t.Fatal(err)
	}
}
