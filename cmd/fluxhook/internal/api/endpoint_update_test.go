package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// TestPatchKeepsMaskedHeaderValues: GET shows a credential-like header's value as "********";
// a client that PATCHes the headers it read back (to add one) keeps the credential, not the
// mask, whatever the case it spells the name in; the mask for a header the endpoint does not
// have is refused rather than stored.
func TestPatchKeepsMaskedHeaderValues(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	ep := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a",
		"headers": map[string]string{"Authorization": "Bearer consumer-token", "X-Api-Key": "k-123"}}).Body["id"].(string)
	stored := func(name string) (string, bool) {
		t.Helper()
		var v *string
		if err := h.db.Pool.QueryRow(context.Background(), `SELECT headers->>$2 FROM webhook_endpoints WHERE id = $1`, ep, name).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v == nil {
			return "", false
		}
		return *v, true
	}

	got := h.must(http.StatusOK, acme, "GET", "/v1/endpoints/"+ep, nil).Body["headers"].(map[string]any)
	if got["Authorization"] != "********" {
		t.Fatalf("GET shows the headers %v; want Authorization masked", got)
	}
	got["X-Extra"] = "1"
	h.must(http.StatusOK, acme, "PATCH", "/v1/endpoints/"+ep, map[string]any{"headers": got})
	if v, _ := stored("Authorization"); v != "Bearer consumer-token" {
		t.Errorf("PATCH with the headers as GET shows them stored Authorization %q; want the value kept", v)
	}
	if v, _ := stored("X-Extra"); v != "1" {
		t.Errorf("the added header is %q; want 1", v)
	}

	// The name in another case: the value follows it (sealed values are bound to their name).
	h.must(http.StatusOK, acme, "PATCH", "/v1/endpoints/"+ep, map[string]any{"headers": map[string]string{"authorization": "********"}})
	if v, _ := stored("authorization"); v != "Bearer consumer-token" {
		t.Errorf("the mask under the name in lower case stored %q; want the value kept", v)
	}
	if _, ok := stored("X-Api-Key"); ok {
		t.Errorf("a header left out of the PATCH's headers is kept; want it removed (headers replaces them all)")
	}

	r := h.must(http.StatusUnprocessableEntity, acme, "PATCH", "/v1/endpoints/"+ep, map[string]any{"headers": map[string]string{"X-Token": "********"}})
	if _, field := r.errorCode(); field != "headers" || !strings.Contains(string(r.Raw), "X-Token") {
		t.Errorf("the mask for a header the endpoint lacks = %s; want invalid headers naming it", r.Raw)
	}
}

// TestTenantNullMeansNoneInCreateAndUpdate: {"tenant": null} is "no tenant" in a create and
// in an admin key's update alike (the update removes the tenant); the empty string is not a
// tenant in either, and an absent tenant changes nothing in an update.
func TestTenantNullMeansNoneInCreateAndUpdate(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	none := h.must(http.StatusCreated, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/n", "tenant": nil})
	if none.Body["tenant"] != nil {
		t.Errorf(`create {"tenant": null} = %s; want no tenant`, none.Raw)
	}
	ep := h.must(http.StatusCreated, h.admin, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a", "tenant": "acme"}).Body["id"].(string)
	if r := h.must(http.StatusOK, h.admin, "PATCH", "/v1/endpoints/"+ep, map[string]any{"description": "x"}); r.Body["tenant"] != "acme" {
		t.Errorf("a PATCH without tenant = %s; want the tenant kept", r.Raw)
	}
	for _, path := range []string{"/v1/endpoints", "/v1/endpoints/" + ep} {
		method := map[bool]string{true: "POST", false: "PATCH"}[path == "/v1/endpoints"]
		r := h.must(http.StatusUnprocessableEntity, h.admin, method, path, map[string]any{"url": "https://hooks.example.com/a", "tenant": ""})
		if _, field := r.errorCode(); field != "tenant" || !strings.Contains(string(r.Raw), "null") {
			t.Errorf(`%s {"tenant": ""} = %s; want invalid tenant, pointing to null`, method, r.Raw)
		}
	}
	if r := h.must(http.StatusOK, h.admin, "PATCH", "/v1/endpoints/"+ep, map[string]any{"tenant": nil}); r.Body["tenant"] != nil {
		t.Errorf(`PATCH {"tenant": null} by an admin = %s; want the tenant removed`, r.Raw)
	}
	acme := h.key(ptr("acme"))
	mine := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/m"}).Body["id"].(string)
	h.must(http.StatusUnprocessableEntity, acme, "PATCH", "/v1/endpoints/"+mine, map[string]any{"tenant": nil})
}
