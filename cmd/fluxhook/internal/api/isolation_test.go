package api_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/api"
)

// TestRoutesAreTheContract: the routes the server registers and the operations openapi.json
// describes are the same set, so neither can gain a route the other lacks.
func TestRoutesAreTheContract(t *testing.T) {
	t.Parallel()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			if method == "parameters" || path == "/v1/openapi.json" {
				continue
			}
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	var served []string
	for _, r := range api.New(api.Config{}).Routes() {
		served = append(served, r.Method+" "+r.Pattern)
	}
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Fatalf("openapi.json describes\n  %s\nthe server routes\n  %s", strings.Join(documented, "\n  "), strings.Join(served, "\n  "))
	}
}

// tenantWorld is one tenant's objects, made through the API with its own key: what the other
// tenant's key must never reach.
type tenantWorld struct {
	key      string
	endpoint string
	// deadLetter is a dead letter of endpoint; recovery a recovery job of it.
	deadLetter string
	recovery   string
	// event is the delivery id of a test event sent to endpoint, pending.
	event string
	// spare is a second endpoint, for the routes that delete it.
	spare string
}

func newTenantWorld(h *harness, tenant string) *tenantWorld {
	h.t.Helper()
	w := &tenantWorld{key: h.key(ptr(tenant))}
	w.endpoint = h.must(http.StatusCreated, w.key, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/" + tenant}).Body["id"].(string)
	w.spare = h.must(http.StatusCreated, w.key, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/" + tenant + "-spare"}).Body["id"].(string)
	w.event = h.must(http.StatusAccepted, w.key, "POST", "/v1/endpoints/"+w.endpoint+"/test", nil).Body["delivery_id"].(string)
	w.deadLetter = fmt.Sprint(h.deadLetter(w.endpoint, ptr(tenant), "order.paid"))
	w.recovery = h.must(http.StatusAccepted, w.key, "POST", "/v1/endpoints/"+w.spare+"/recover",
		map[string]any{"since": "2026-01-01T00:00:00Z"}).Body["id"].(string)
	return w
}

// isolationCase is how the isolation test calls one route: the path for a world's objects,
// the body, and the status the owner gets. A route with no path parameter is scoped by the
// key alone; lists must not show the other tenant's objects.
type isolationCase struct {
	path   func(w *tenantWorld) string
	body   any
	status int
	// list: a route without ids, whose answer must not mention the other world's ids.
	list bool
}

// isolationCases covers every route of the API; a route missing here fails the test, so a new
// route cannot ship without its isolation being checked.
var isolationCases = map[string]isolationCase{
	"GET /v1/endpoints":                     {path: func(*tenantWorld) string { return "/v1/endpoints" }, status: 200, list: true},
	"POST /v1/endpoints":                    {path: func(*tenantWorld) string { return "/v1/endpoints" }, body: map[string]any{"url": "https://hooks.example.com/new"}, status: 201, list: true},
	"GET /v1/endpoints/{id}":                {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.endpoint }, status: 200},
	"PATCH /v1/endpoints/{id}":              {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.endpoint }, body: map[string]any{"description": "x"}, status: 200},
	"DELETE /v1/endpoints/{id}":             {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.spare + "?pending=drop" }, status: 200},
	"POST /v1/endpoints/{id}/rotate-secret": {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.endpoint + "/rotate-secret" }, status: 200},
	"POST /v1/endpoints/{id}/disable":       {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.endpoint + "/disable" }, status: 200},
	"POST /v1/endpoints/{id}/enable":        {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.endpoint + "/enable" }, status: 200},
	"POST /v1/endpoints/{id}/test":          {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.endpoint + "/test" }, status: 202},
	"GET /v1/endpoints/{id}/health":         {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.endpoint + "/health" }, status: 200},
	"POST /v1/endpoints/{id}/recover": {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.endpoint + "/recover" },
		body: map[string]any{"since": "2026-01-01T00:00:00Z"}, status: 202},
	"GET /v1/recoveries/{id}":           {path: func(w *tenantWorld) string { return "/v1/recoveries/" + w.recovery }, status: 200},
	"POST /v1/recoveries/{id}/cancel":   {path: func(w *tenantWorld) string { return "/v1/recoveries/" + w.recovery + "/cancel" }, status: 200},
	"GET /v1/events":                    {path: func(*tenantWorld) string { return "/v1/events?limit=500" }, status: 200, list: true},
	"GET /v1/events/{delivery_id}":      {path: func(w *tenantWorld) string { return "/v1/events/" + w.event }, status: 200},
	"GET /v1/deliveries/{delivery_id}":  {path: func(w *tenantWorld) string { return "/v1/deliveries/" + w.event }, status: 200},
	"GET /v1/endpoints/{id}/deliveries": {path: func(w *tenantWorld) string { return "/v1/endpoints/" + w.endpoint + "/deliveries" }, status: 200},
	"GET /v1/dead-letters":              {path: func(*tenantWorld) string { return "/v1/dead-letters?limit=500" }, status: 200, list: true},
	"GET /v1/dead-letters/{id}":         {path: func(w *tenantWorld) string { return "/v1/dead-letters/" + w.deadLetter }, status: 200},
	"POST /v1/dead-letters/{id}/replay": {path: func(w *tenantWorld) string { return "/v1/dead-letters/" + w.deadLetter + "/replay" }, status: 200},
	"GET /v1/audit":                     {path: func(*tenantWorld) string { return "/v1/audit?limit=500" }, status: 200, list: true},
	"GET /v1/me":                        {path: func(*tenantWorld) string { return "/v1/me" }, status: 200, list: true},
}

// normalizeIDs replaces the ids in an answer (UUIDs, and the dead-letter id given) with one
// placeholder, so that two answers can be compared for all but the id they name.
func normalizeIDs(raw []byte, deadLetter string) string {
	s := uuidPattern.ReplaceAllString(string(raw), "<id>")
	return strings.ReplaceAll(s, "dead letter "+deadLetter+" ", "dead letter <id> ")
}

var uuidPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// TestTenantKeysNeverReachAnotherTenant calls every route of the API, in a random order, with
// two tenants' keys: with the other tenant's ids it must answer 404, exactly as for ids that do
// not exist, and change nothing; with its own it must work; lists must not mention the other
// tenant's objects. Admin-only routes must refuse both. A route of the server that this test
// does not cover fails it.
func TestTenantKeysNeverReachAnotherTenant(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	routes := h.api.Routes()
	rng.Shuffle(len(routes), func(i, j int) { routes[i], routes[j] = routes[j], routes[i] })
	for _, r := range routes {
		name := r.Method + " " + r.Pattern
		if r.Admin || r.AdminOrPortal {
			for _, tenant := range []string{"acme", "globex"} {
				h.must(http.StatusForbidden, h.key(ptr(tenant)), r.Method, strings.ReplaceAll(r.Pattern, "{id}", "00000000-0000-0000-0000-000000000000"), map[string]any{})
			}
			continue
		}
		c, ok := isolationCases[name]
		if !ok {
			t.Errorf("%s has no isolation case: add one to isolationCases", name)
			continue
		}
		// Fresh worlds for each route: a route that changes or deletes its object leaves the
		// next route a world as the test made it.
		acme, globex := newTenantWorld(h, "acme"), newTenantWorld(h, "globex")
		for _, pair := range [][2]*tenantWorld{{acme, globex}, {globex, acme}} {
			me, other := pair[0], pair[1]
			if c.list {
				got := h.must(c.status, me.key, r.Method, c.path(me), c.body)
				for _, id := range uuidPattern.FindAllString(string(got.Raw), -1) {
					if id == other.endpoint || id == other.spare || id == other.event || id == other.recovery {
						t.Errorf("%s with %s's key shows the other tenant's object %s", name, me.key[:20], id)
					}
				}
				continue
			}
			before := h.must(http.StatusOK, h.admin, "GET", "/v1/audit?limit=500", nil).Raw
			got := h.call(me.key, r.Method, c.path(other), c.body)
			if got.Status != http.StatusNotFound {
				t.Errorf("%s with the other tenant's id answered %d; want 404: %s", name, got.Status, got.Raw)
			}
			missingPath := uuidPattern.ReplaceAllString(c.path(other), "00000000-0000-4000-8000-000000000000")
			missingPath = strings.Replace(missingPath, "/dead-letters/"+other.deadLetter, "/dead-letters/999999999", 1)
			missing := h.call(me.key, r.Method, missingPath, c.body)
			if missing.Status != http.StatusNotFound || normalizeIDs(missing.Raw, "999999999") != normalizeIDs(got.Raw, other.deadLetter) {
				t.Errorf("%s: another tenant's id and a missing one answer differently:\n  %s\n  %s", name, got.Raw, missing.Raw)
			}
			if after := h.must(http.StatusOK, h.admin, "GET", "/v1/audit?limit=500", nil).Raw; string(after) != string(before) {
				t.Errorf("%s with the other tenant's id changed something (the audit trail grew)", name)
			}
			if own := h.call(me.key, r.Method, c.path(me), c.body); own.Status != c.status {
				t.Errorf("%s with its own id answered %d; want %d: %s", name, own.Status, c.status, own.Raw)
			}
		}
	}
}
