package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/api"
)

// TestUnstorableTextIsInvalidInput: a NUL byte, invalid UTF-8 or a control character in a
// query parameter or a path value, or a NUL character in a JSON string, used to reach
// PostgreSQL, which refuses it: the API answered 500 (and logged an error per request). Each
// is 422 naming the field now, before any statement runs.
func TestUnstorableTextIsInvalidInput(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	ep := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a"}).Body["id"].(string)
	check := func(key, method, path, body, field string) {
		t.Helper()
		st, out := h.raw(key, method, path, body)
		var e struct {
			Error struct{ Code, Field string }
		}
		_ = json.Unmarshal([]byte(out), &e)
		if st != http.StatusUnprocessableEntity || e.Error.Code != "invalid" || e.Error.Field != field {
			t.Errorf("%s %s %s = %d %s; want 422 naming %s", method, path, body, st, out, field)
		}
	}
	for path, field := range map[string]string{
		"/v1/events?event_type=%00":                             "event_type",
		"/v1/events?stream_id=%ff":                              "stream_id",
		"/v1/events?tenant=a%1bb":                               "tenant",
		"/v1/dead-letters?reason_contains=%00":                  "reason_contains",
		"/v1/dead-letters?event_type=%00":                       "event_type",
		"/v1/audit?object_id=%00":                               "object_id",
		"/v1/endpoints/" + ep + "/deliveries?event_type=%c3%28": "event_type",
		"/v1/endpoints/%00":                                     "id",
		"/v1/deliveries/%ff":                                    "delivery_id",
	} {
		check(acme, "GET", path, "", field)
	}
	for body, field := range map[string]string{
		`{"url": "https://hooks.example.com/a", "description": "a\u0000b"}`:     "description",
		`{"url": "https://hooks.example.com/a", "event_types": ["a\u0000"]}`:    "event_types",
		`{"url": "https://hooks.example.com/a", "headers": {"X-A": "a\u0000"}}`: "headers",
	} {
		check(acme, "POST", "/v1/endpoints", body, field)
	}
	check(acme, "PATCH", "/v1/endpoints/"+ep, `{"description": "\u0000"}`, "description")
	check(acme, "POST", "/v1/endpoints/"+ep+"/disable", `{"reason": "a\u0000"}`, "reason")
	check(h.admin, "POST", "/v1/tenants/a%00b/portal-sessions", "", "tenant")
	check(h.admin, "POST", "/v1/api-keys", `{"tenant": "a\u0000"}`, "tenant")
	check(h.admin, "POST", "/v1/api-keys", `{"tenant": null, "description": "a\u0000"}`, "description")
	// Text that is only unusual still works: a filter on a reason with a space and a quote.
	h.must(http.StatusOK, acme, "GET", "/v1/dead-letters?reason_contains=HTTP%20%22503", nil)
}

// TestEveryOperationDescribesItsErrors: every operation can answer 500 (a server fault) and
// 422 (its path values and query parameters are checked for every route), so openapi.json
// describes both for each: a new operation without them fails here.
func TestEveryOperationDescribesItsErrors(t *testing.T) {
	t.Parallel()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	for path, ops := range doc.Paths {
		for method, raw := range ops {
			if method == "parameters" || path == "/v1/openapi.json" {
				continue
			}
			var op struct {
				Responses map[string]json.RawMessage `json:"responses"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatal(err)
			}
			for _, status := range []string{"422", "500"} {
				if op.Responses[status] == nil {
					t.Errorf("%s %s describes no %s response", method, path, status)
				}
			}
		}
	}
}
