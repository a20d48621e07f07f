package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestDeadLettersShowRowURLsByOrigin: a dead letter of a row's own endpoint_url shows that URL
// by its origin alone, as the events and deliveries routes do: never its user, password, path
// or query, where producers put tokens.
func TestDeadLettersShowRowURLsByOrigin(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	var id int64
	if err := h.db.Pool.QueryRow(context.Background(), `INSERT INTO webhook_dead_letter
		(delivery_id, event_type, payload, endpoint_url, attempts, reason, enqueued_at, tenant)
		VALUES (gen_random_uuid(), 'order.paid', '{}', 'https://u:p@hooks.example.com/in?token=row-secret', 1, 'HTTP 410', now(), 'acme')
		RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	one := h.must(http.StatusOK, acme, "GET", fmt.Sprintf("/v1/dead-letters/%d", id), nil)
	if one.Body["endpoint_url"] != "https://hooks.example.com:443" {
		t.Errorf("GET /v1/dead-letters/%d shows endpoint_url %v; want its origin https://hooks.example.com:443", id, one.Body["endpoint_url"])
	}
	list := h.must(http.StatusOK, acme, "GET", "/v1/dead-letters", nil)
	for _, r := range []response{one, list} {
		for _, secret := range []string{"row-secret", "/in", "u:"} {
			if strings.Contains(string(r.Raw), secret) {
				t.Errorf("a dead letter shows %q of its row URL: %s", secret, r.Raw)
			}
		}
	}
}
