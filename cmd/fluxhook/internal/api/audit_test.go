package api_test

import (
	"fmt"
	"net/http"
	"testing"
)

// TestAuditObjectIDsAreCanonical: /v1/dead-letters/{id} parses "007" as 7, and the replay's
// audit entry is found by the id as the API shows it (object_id=7), not as it was typed. The
// test event (a signed request sent on the caller's demand) is recorded too, with the
// delivery to poll.
func TestAuditObjectIDsAreCanonical(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	ep := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a"}).Body["id"].(string)
	dl := h.deadLetter(ep, ptr("acme"), "order.paid")
	h.must(http.StatusOK, acme, "POST", fmt.Sprintf("/v1/dead-letters/00%d/replay", dl), nil)
	if a := h.must(http.StatusOK, acme, "GET", fmt.Sprintf("/v1/audit?object_type=dead_letter&object_id=%d", dl), nil); len(a.Body["data"].([]any)) != 1 {
		t.Errorf("the replay of dead letter %d is not found by its id in the audit trail: %s", dl, h.must(http.StatusOK, acme, "GET", "/v1/audit?object_type=dead_letter", nil).Raw)
	}
	test := h.must(http.StatusAccepted, acme, "POST", "/v1/endpoints/"+ep+"/test", nil)
	trail := h.must(http.StatusOK, acme, "GET", "/v1/audit?object_type=endpoint&object_id="+ep, nil).Body["data"].([]any)
	last := trail[0].(map[string]any)
	if last["action"] != "endpoint.test" || last["tenant"] != "acme" || last["after"].(map[string]any)["delivery_id"] != test.Body["delivery_id"] {
		t.Errorf("the test event's audit entry = %v; want endpoint.test with its delivery id", last)
	}
}
