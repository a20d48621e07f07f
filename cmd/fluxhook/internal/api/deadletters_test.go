package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// deadLetter writes a dead letter of endpoint (tenant's) as the dispatcher would have, and
// returns its id.
func (h *harness) deadLetter(endpoint string, tenant *string, eventType string) int64 {
	h.t.Helper()
	var id int64
	err := h.db.Pool.QueryRow(context.Background(), `INSERT INTO webhook_dead_letter
		(delivery_id, event_type, payload, attempts, last_status, reason, enqueued_at, tenant, endpoint_id)
		VALUES (gen_random_uuid(), $1, '{"n": 1}', 3, 503, 'retries exhausted: HTTP 503', now() - interval '1 minute', $2, $3::uuid)
		RETURNING id`, eventType, tenant, endpoint).Scan(&id)
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}

func TestDeadLettersListShowReplay(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	ep := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a"}).Body["id"].(string)
	ids := []int64{h.deadLetter(ep, ptr("acme"), "order.paid"), h.deadLetter(ep, ptr("acme"), "order.refunded"), h.deadLetter(ep, ptr("acme"), "order.paid")}

	first := h.must(http.StatusOK, acme, "GET", "/v1/dead-letters?limit=2", nil)
	data := first.Body["data"].([]any)
	next, _ := first.Body["next_cursor"].(string)
	if len(data) != 2 || next == "" || data[0].(map[string]any)["id"] != float64(ids[2]) {
		t.Fatalf("first page = %s; want the two newest and a cursor", first.Raw)
	}
	second := h.must(http.StatusOK, acme, "GET", "/v1/dead-letters?limit=2&cursor="+next, nil)
	if d := second.Body["data"].([]any); len(d) != 1 || d[0].(map[string]any)["id"] != float64(ids[0]) || second.Body["next_cursor"] != nil {
		t.Fatalf("second page = %s; want the oldest and no cursor", second.Raw)
	}
	if byType := h.must(http.StatusOK, acme, "GET", "/v1/dead-letters?event_type=order.refunded", nil); len(byType.Body["data"].([]any)) != 1 {
		t.Fatalf("filtered by type: %s", byType.Raw)
	}
	one := h.must(http.StatusOK, acme, "GET", fmt.Sprintf("/v1/dead-letters/%d", ids[0]), nil)
	if one.Body["reason"] != "retries exhausted: HTTP 503" || one.Body["payload"] == nil {
		t.Fatalf("show = %s", one.Raw)
	}
	rep := h.must(http.StatusOK, acme, "POST", fmt.Sprintf("/v1/dead-letters/%d/replay", ids[0]), nil)
	if rep.Body["replayed"] != true || rep.Body["delivery_id"] != one.Body["delivery_id"] {
		t.Fatalf("replay = %s", rep.Raw)
	}
	again := h.must(http.StatusConflict, acme, "POST", fmt.Sprintf("/v1/dead-letters/%d/replay", ids[0]), nil)
	if !strings.Contains(string(again.Raw), "already_replayed") || !strings.Contains(string(again.Raw), "force") {
		t.Fatalf("a second replay = %s; want a conflict saying how to force it", again.Raw)
	}
	h.must(http.StatusOK, acme, "POST", fmt.Sprintf("/v1/dead-letters/%d/replay", ids[0]), map[string]any{"force": true})
	var queued int
	if err := h.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_outbox WHERE delivery_id = $1::uuid AND endpoint_id = $2::uuid`,
		one.Body["delivery_id"], ep).Scan(&queued); err != nil || queued != 2 {
		t.Fatalf("%d rows queued for the replayed event (%v); want 2 (the replay and the forced one)", queued, err)
	}
	h.must(http.StatusNotFound, acme, "GET", "/v1/dead-letters/abc", nil)
	h.must(http.StatusUnprocessableEntity, acme, "GET", "/v1/dead-letters?replayed=maybe", nil)
	h.must(http.StatusUnprocessableEntity, acme, "GET", "/v1/dead-letters?since=yesterday", nil)
}

func TestRecoveryReplaysAnEndpointsDeadLettersOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	ep := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a"}).Body["id"].(string)
	for i := 0; i < 7; i++ {
		h.deadLetter(ep, ptr("acme"), "order.paid")
	}
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	h.must(http.StatusUnprocessableEntity, acme, "POST", "/v1/endpoints/"+ep+"/recover", map[string]any{})
	start := h.must(http.StatusAccepted, acme, "POST", "/v1/endpoints/"+ep+"/recover", map[string]any{"since": since})
	twice := h.must(http.StatusAccepted, acme, "POST", "/v1/endpoints/"+ep+"/recover", map[string]any{"since": since})
	if start.Body["total"] != float64(7) || start.Header.Get("Location") != "/v1/recoveries/"+start.Body["id"].(string) {
		t.Fatalf("recover = %s (Location %q); want a job over 7 dead letters", start.Raw, start.Header.Get("Location"))
	}
	for _, job := range []response{start, twice} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			r := h.must(http.StatusOK, acme, "GET", "/v1/recoveries/"+job.Body["id"].(string), nil)
			if r.Body["state"] == "done" {
				break
			}
			if r.Body["state"] == "failed" || time.Now().After(deadline) {
				t.Fatalf("recovery: %s", r.Raw)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var queued, events int
	if err := h.db.Pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT delivery_id) FROM webhook_outbox WHERE endpoint_id = $1::uuid`, ep).
		Scan(&queued, &events); err != nil || queued != 7 || events != 7 {
		t.Fatalf("%d rows queued for %d events (%v); want each of the 7 events once, though the job ran twice", queued, events, err)
	}
	h.must(http.StatusOK, acme, "POST", "/v1/endpoints/"+ep+"/disable", nil)
	if r := h.must(http.StatusConflict, acme, "POST", "/v1/endpoints/"+ep+"/recover", map[string]any{"since": since}); !strings.Contains(string(r.Raw), "enable it") {
		t.Fatalf("recovering a disabled endpoint = %s; want a conflict saying to enable it", r.Raw)
	}
}
