package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
)

func TestEndpointLifecycleOverTheAPI(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))

	created := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{
		"url": "https://hooks.example.com/in", "event_types": []string{"order.*"}, "description": "orders",
		"headers": map[string]string{"X-Api-Key": "k-123", "X-Team": "billing"}})
	id := created.Body["id"].(string)
	secret, _ := created.Body["secret"].(string)
	if secret == "" || created.Body["tenant"] != "acme" {
		t.Fatalf("create = %s; want the secret once and tenant acme (the key's)", created.Raw)
	}
	if strings.Contains(string(created.Raw), "k-123") {
		t.Fatalf("a credential-like header value was shown: %s", created.Raw)
	}

	got := h.must(http.StatusOK, acme, "GET", "/v1/endpoints/"+id, nil)
	if strings.Contains(string(got.Raw), secret) || got.Body["url"] != "https://hooks.example.com/in" {
		t.Fatalf("get = %s; want the endpoint without its secret", got.Raw)
	}

	upd := h.must(http.StatusOK, acme, "PATCH", "/v1/endpoints/"+id, map[string]any{"description": "orders v2"})
	if upd.Body["description"] != "orders v2" || upd.Body["event_types"].([]any)[0] != "order.*" {
		t.Fatalf("patch = %s; want the description changed and the rest kept", upd.Raw)
	}
	rot := h.must(http.StatusOK, acme, "POST", "/v1/endpoints/"+id+"/rotate-secret", map[string]any{"grace_seconds": 60})
	if s, _ := rot.Body["secret"].(string); s == "" || s == secret {
		t.Fatalf("rotate = %s; want a new secret", rot.Raw)
	}
	dis := h.must(http.StatusOK, acme, "POST", "/v1/endpoints/"+id+"/disable", map[string]any{"reason": "maintenance"})
	if dis.Body["enabled"] != false || dis.Body["disabled_reason"] != "maintenance" {
		t.Fatalf("disable = %s", dis.Raw)
	}
	h.must(http.StatusConflict, acme, "POST", "/v1/endpoints/"+id+"/test", nil)
	en := h.must(http.StatusOK, acme, "POST", "/v1/endpoints/"+id+"/enable", nil)
	if en.Body["enabled"] != true {
		t.Fatalf("enable = %s", en.Raw)
	}
	hl := h.must(http.StatusOK, acme, "GET", "/v1/endpoints/"+id+"/health", nil)
	if hours := hl.Body["hours"].([]any); len(hours) != 25 {
		t.Fatalf("health has %d hourly buckets; want 25 (the current hour and the 24 before)", len(hours))
	}

	test := h.must(http.StatusAccepted, acme, "POST", "/v1/endpoints/"+id+"/test", nil)
	if test.Header.Get("Location") != "/v1/deliveries/"+test.Body["delivery_id"].(string) {
		t.Fatalf("test event = %s, Location %q", test.Raw, test.Header.Get("Location"))
	}
	// The test event waits in the queue: removing the endpoint must say what becomes of it.
	del := h.must(http.StatusConflict, acme, "DELETE", "/v1/endpoints/"+id, nil)
	if code, _ := del.errorCode(); code != "conflict" {
		t.Fatalf("delete with a pending delivery = %s", del.Raw)
	}
	gone := h.must(http.StatusOK, acme, "DELETE", "/v1/endpoints/"+id+"?pending=drop", nil)
	if gone.Body["dropped"] != float64(1) {
		t.Fatalf("delete ?pending=drop = %s; want the test delivery dropped", gone.Raw)
	}
	h.must(http.StatusNotFound, acme, "GET", "/v1/endpoints/"+id, nil)

	trail := h.must(http.StatusOK, acme, "GET", "/v1/audit?object_id="+id, nil)
	var actions []string
	for _, e := range trail.Body["data"].([]any) {
		actions = append(actions, e.(map[string]any)["action"].(string))
	}
	want := "endpoint.delete endpoint.test endpoint.enable endpoint.disable endpoint.rotate_secret endpoint.update endpoint.create"
	if strings.Join(actions, " ") != want {
		t.Fatalf("audit trail = %v; want %s", actions, want)
	}
	if strings.Contains(string(trail.Raw), secret) || strings.Contains(string(trail.Raw), "k-123") {
		t.Fatalf("the audit trail holds a secret: %s", trail.Raw)
	}
}

func TestEndpointURLsAreCheckedAtCreate(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, c := range []struct{ url, says string }{
		{"notaurl", "url:"},
		{"https://user:pw@hooks.example.com/in", "url:"},
		{"https://10.0.0.5/in", "WEBHOOK_ALLOWED_NETWORKS"},
		{"https://internal.example/in", "resolves to 10.0.0.5"},
		{"https://nowhere.example/in", "does not resolve"},
	} {
		r := h.must(http.StatusUnprocessableEntity, h.admin, "POST", "/v1/endpoints", map[string]any{"url": c.url})
		code, field := r.errorCode()
		if code != "invalid" || field != "url" || !strings.Contains(string(r.Raw), c.says) {
			t.Errorf("create %s = %s; want invalid url saying %q", c.url, r.Raw, c.says)
		}
	}
	r := h.must(http.StatusUnprocessableEntity, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/", "evnt_types": []string{"x"}})
	if _, field := r.errorCode(); field != "evnt_types" {
		t.Errorf("an unknown field = %s; want it named", r.Raw)
	}
	r = h.must(http.StatusUnprocessableEntity, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/", "scheme": "hmac"})
	if _, field := r.errorCode(); field != "scheme" {
		t.Errorf("a bad scheme = %s; want the field named", r.Raw)
	}
	h.must(http.StatusBadRequest, h.admin, "POST", "/v1/endpoints", "{not json")
}

func TestKeysAndErrors(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	if r := h.must(http.StatusUnauthorized, "", "GET", "/v1/endpoints", nil); !strings.Contains(string(r.Raw), "api-keys add") {
		t.Fatalf("401 = %s; want it to say how to get a key", r.Raw)
	}
	h.must(http.StatusUnauthorized, "fhk_0123456789abcdef_"+strings.Repeat("A", 43), "GET", "/v1/endpoints", nil)

	made := h.must(http.StatusCreated, h.admin, "POST", "/v1/api-keys", map[string]any{"tenant": "acme", "description": "portal"})
	tenantKey := made.Body["key"].(string)
	h.must(http.StatusOK, tenantKey, "GET", "/v1/endpoints", nil)
	h.must(http.StatusForbidden, tenantKey, "GET", "/v1/api-keys", nil)
	h.must(http.StatusForbidden, tenantKey, "POST", "/v1/api-keys", map[string]any{})
	list := h.must(http.StatusOK, h.admin, "GET", "/v1/api-keys", nil)
	if strings.Contains(string(list.Raw), tenantKey) {
		t.Fatal("the key list shows a key")
	}
	h.must(http.StatusOK, h.admin, "DELETE", "/v1/api-keys/"+made.Body["id"].(string), nil)
	h.must(http.StatusUnauthorized, tenantKey, "GET", "/v1/endpoints", nil)
	h.must(http.StatusNotFound, h.admin, "DELETE", "/v1/api-keys/00000000-0000-0000-0000-000000000000", nil)
	h.must(http.StatusUnprocessableEntity, h.admin, "GET", "/v1/endpoints?limit=0", nil)
	h.must(http.StatusUnprocessableEntity, h.admin, "GET", "/v1/endpoints?cursor=garbage", nil)
}

func TestEndpointPagesAreStable(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i := 0; i < 7; i++ {
		h.must(http.StatusCreated, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/" + string(rune('a'+i))})
	}
	seen := map[string]bool{}
	path := "/v1/endpoints?limit=3"
	pages := 0
	for {
		r := h.must(http.StatusOK, h.admin, "GET", path, nil)
		pages++
		for _, e := range r.Body["data"].([]any) {
			id := e.(map[string]any)["id"].(string)
			if seen[id] {
				t.Fatalf("endpoint %s on two pages", id)
			}
			seen[id] = true
		}
		next, _ := r.Body["next_cursor"].(string)
		if next == "" {
			break
		}
		path = "/v1/endpoints?limit=3&cursor=" + next
	}
	if len(seen) != 7 || pages != 3 {
		t.Fatalf("%d endpoints on %d pages; want 7 on 3", len(seen), pages)
	}
}

// TestMovedEndpointStaysWithItsTenant: once an admin gives acme's endpoint to globex (PATCH
// tenant), each tenant sees its own side alone. globex's key does not read acme's traffic
// through the endpoint's health, and the update is in each tenant's trail with that tenant's
// view only (acme: the endpoint before; globex: after); acme's key, replaying one of its own
// dead letters, is told the endpoint is removed, as it is from acme, not that another tenant
// has it.
func TestMovedEndpointStaysWithItsTenant(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme, globex := h.key(ptr("acme")), h.key(ptr("globex"))
	ep := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints",
		map[string]any{"url": "https://hooks.example.com/a", "description": "acme-private-notes"}).Body["id"].(string)
	now := time.Now()
	for i := range 3 {
		h.exec(seedLog, nil, "order.paid", `{}`, now.Add(-time.Minute), fmt.Sprintf("00000000-0000-4000-8000-00000000000%d", i+1), 1,
			now.Add(-30*time.Second), 200, nil, 5, "acme", ep, now.Add(-time.Minute))
	}
	dl := h.deadLetter(ep, ptr("acme"), "order.paid")
	count := func(key string) (n float64) {
		for _, hr := range h.must(http.StatusOK, key, "GET", "/v1/endpoints/"+ep+"/health", nil).Body["hours"].([]any) {
			n += hr.(map[string]any)["succeeded"].(float64) + hr.(map[string]any)["failed"].(float64)
		}
		return n
	}
	if n := count(acme); n != 3 {
		t.Fatalf("acme's health counts %v deliveries; want its 3", n)
	}
	h.must(http.StatusOK, h.admin, "PATCH", "/v1/endpoints/"+ep, map[string]any{"tenant": "globex", "description": "globex's now"})

	if n := count(globex); n != 0 {
		t.Errorf("globex's key sees %v of acme's deliveries in the endpoint's health", n)
	}
	if n := count(h.admin); n != 3 {
		t.Errorf("the admin's health counts %v deliveries; want all 3", n)
	}
	if a := h.must(http.StatusOK, globex, "GET", "/v1/audit?object_id="+ep, nil); strings.Contains(string(a.Raw), "acme") || len(a.Body["data"].([]any)) != 1 {
		t.Errorf("globex's trail of the endpoint: %s; want its update, without acme's view", a.Raw)
	}
	a := h.must(http.StatusOK, acme, "GET", "/v1/audit?object_id="+ep, nil)
	if strings.Contains(string(a.Raw), "globex") || len(a.Body["data"].([]any)) != 2 || a.Body["data"].([]any)[0].(map[string]any)["before"] == nil {
		t.Errorf("acme's trail of the endpoint: %s; want its creation and the update's before, without globex's view", a.Raw)
	}
	if all := h.must(http.StatusOK, h.admin, "GET", "/v1/audit?object_id="+ep, nil); len(all.Body["data"].([]any)) != 3 {
		t.Errorf("the admin's trail of the endpoint: %s; want the creation and one update entry per tenant", all.Raw)
	}
	st, b := h.raw(acme, "POST", fmt.Sprintf("/v1/dead-letters/%d/replay", dl), "")
	if st != http.StatusConflict || strings.Contains(b, "other_tenant") || !strings.Contains(b, "endpoint_removed") {
		t.Errorf("acme's replay of its dead letter %d = %d %s; want 409 endpoint_removed", dl, st, b)
	}
}

// TestEndpointFieldsAreBounded: nothing but the 1 MiB body used to bound an endpoint's
// description, URL, headers or filter, nor how many endpoints a tenant makes, so one tenant
// key could make each page of GET /v1/endpoints and GET /v1/audit (each create is recorded
// with the whole endpoint) hundreds of MiB, built in memory in the API process. Each field is
// bounded now, refused with 422 naming it, and a tenant's own keys stop at
// endpoints.MaxTenantEndpoints endpoints (409); an admin key may give a tenant more.
func TestEndpointFieldsAreBounded(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	headers := map[string]string{}
	for i := range 33 {
		headers[fmt.Sprintf("X-H%d", i)] = "v"
	}
	for field, body := range map[string]map[string]any{
		"description": {"url": "https://hooks.example.com/a", "description": strings.Repeat("x", 1025)},
		"url":         {"url": "https://hooks.example.com/a?pad=" + strings.Repeat("x", 2048)},
		"headers":     {"url": "https://hooks.example.com/a", "headers": headers},
		"event_types": {"url": "https://hooks.example.com/a", "event_types": []string{strings.Repeat("e", 201)}},
	} {
		r := h.call(acme, "POST", "/v1/endpoints", body)
		if code, f := r.errorCode(); r.Status != http.StatusUnprocessableEntity || code != "invalid" || f != field {
			t.Errorf("POST /v1/endpoints with %s past its bound = %d %s; want 422 naming %s", field, r.Status, r.Raw, field)
		}
	}
	ep := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a"}).Body["id"].(string)
	if r := h.call(acme, "PATCH", "/v1/endpoints/"+ep, map[string]any{"headers": map[string]string{"X-Big": strings.Repeat("v", 8193)}}); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("PATCH with 8 KiB of headers = %d %s; want 422", r.Status, r.Raw)
	}
	if r := h.call(acme, "POST", "/v1/endpoints/"+ep+"/disable", map[string]any{"reason": strings.Repeat("r", 1025)}); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("disable with a 1025-byte reason = %d %s; want 422", r.Status, r.Raw)
	}

	for i := 1; i < endpoints.MaxTenantEndpoints; i++ {
		h.endpoint(fmt.Sprintf("https://hooks.example.com/%d", i), "acme")
	}
	r := h.call(acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/one-too-many"})
	if r.Status != http.StatusConflict || !strings.Contains(string(r.Raw), "100 endpoints") {
		t.Errorf("acme's endpoint past its quota = %d %s; want 409 naming the limit", r.Status, r.Raw)
	}
	h.must(http.StatusCreated, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/by-the-operator", "tenant": "acme"})
	h.must(http.StatusCreated, h.key(ptr("globex")), "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/globex"})
}

// TestKeyWithoutTenantRefused: a key is made for a tenant, or as an admin key by "tenant": null;
// a body without tenant is refused. Taken for null, an integration that drops an unset field
// (omitempty, JavaScript's undefined) handed its customer a key to every tenant.
func TestKeyWithoutTenantRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, body := range []any{map[string]any{"description": "acme portal"}, map[string]any{}} {
		r := h.must(http.StatusUnprocessableEntity, h.admin, "POST", "/v1/api-keys", body)
		if code, field := r.errorCode(); code != "invalid" || field != "tenant" {
			t.Errorf("a key made of %v = %s; want invalid tenant", body, r.Raw)
		}
	}
	admin := h.must(http.StatusCreated, h.admin, "POST", "/v1/api-keys", map[string]any{"tenant": nil, "description": "ops"})
	if me := h.must(http.StatusOK, admin.Body["key"].(string), "GET", "/v1/me", nil); me.Body["admin"] != true {
		t.Errorf(`a key made with "tenant": null = %s; want an admin key`, me.Raw)
	}
}
