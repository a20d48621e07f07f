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

// waitRecovery polls the recovery id until it is no longer running, and returns it.
func (h *harness) waitRecovery(key, id string) response {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := h.must(http.StatusOK, key, "GET", "/v1/recoveries/"+id, nil)
		if r.Body["state"] != "running" {
			return r
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("recovery %s still running after 30s: %s", id, r.Raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	if start.Body["total"] != float64(7) || start.Header.Get("Location") != "/v1/recoveries/"+start.Body["id"].(string) {
		t.Fatalf("recover = %s (Location %q); want a job over 7 dead letters", start.Raw, start.Header.Get("Location"))
	}
	if r := h.waitRecovery(acme, start.Body["id"].(string)); r.Body["state"] != "done" {
		t.Fatalf("recovery: %s", r.Raw)
	}
	twice := h.must(http.StatusAccepted, acme, "POST", "/v1/endpoints/"+ep+"/recover", map[string]any{"since": since})
	if r := h.waitRecovery(acme, twice.Body["id"].(string)); r.Body["state"] != "done" || r.Body["total"] != float64(0) {
		t.Fatalf("the second recovery: %s; want done, with nothing left to replay", r.Raw)
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

// TestOneRecoveryRunsPerEndpoint: each recovery is a goroutine holding API connections (8 in
// the pool, shared with every tenant's requests) for its batches, so one key must not start
// any number of them. Twenty starts at once make one job; the others are answered 409 naming
// it (Location). A running job is cancelled, recorded in the audit trail, and a cancel of an
// ended job answers it as it is.
func TestOneRecoveryRunsPerEndpoint(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme := h.key(ptr("acme"))
	ep := h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/a"}).Body["id"].(string)
	dl := h.deadLetter(ep, ptr("acme"), "order.paid")
	// The dead letter locked: the job's first batch waits for it, so the job keeps running
	// while the starts race.
	ctx := context.Background()
	lock, err := h.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `SELECT 1 FROM webhook_dead_letter WHERE id = $1 FOR UPDATE`, dl); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		status   int
		location string
		err      error
	}
	answers := make(chan answer, 20)
	for range 20 {
		go func() {
			req, _ := http.NewRequest("POST", h.srv.URL+"/v1/endpoints/"+ep+"/recover", strings.NewReader(`{"since": "2020-01-01T00:00:00Z"}`))
			req.Header.Set("Authorization", "Bearer "+acme)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			resp.Body.Close()
			answers <- answer{status: resp.StatusCode, location: resp.Header.Get("Location")}
		}()
	}
	accepted, conflicts := "", map[string]int{}
	for range 20 {
		a := <-answers
		switch {
		case a.err != nil:
			t.Fatal(a.err)
		case a.status == http.StatusAccepted && accepted == "":
			accepted = a.location
		case a.status == http.StatusConflict:
			conflicts[a.location]++
		default:
			t.Errorf("a start answered %d (Location %q)", a.status, a.location)
		}
	}
	if accepted == "" || conflicts[accepted] != 19 {
		t.Fatalf("20 starts at once: accepted %q, conflicts by Location %v; want one job, 19 answers naming it", accepted, conflicts)
	}
	r := h.must(http.StatusConflict, acme, "POST", "/v1/endpoints/"+ep+"/recover", map[string]any{"since": "2020-01-01T00:00:00Z"})
	if !strings.Contains(string(r.Raw), strings.TrimPrefix(accepted, "/v1/recoveries/")) {
		t.Errorf("the conflict does not name the running job: %s", r.Raw)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := h.waitRecovery(acme, strings.TrimPrefix(accepted, "/v1/recoveries/")); r.Body["state"] != "done" || r.Body["replayed"] != float64(1) {
		t.Fatalf("the job: %s", r.Raw)
	}

	// A job running (as one left by a process still at its first batch), cancelled.
	var running string
	if err := h.db.Pool.QueryRow(ctx, `INSERT INTO webhook_recoveries (endpoint_id, tenant, since, created_by, total)
		VALUES ($1::uuid, 'acme', now() - interval '1 day', 'key:test', 3) RETURNING id::text`, ep).Scan(&running); err != nil {
		t.Fatal(err)
	}
	h.must(http.StatusNotFound, h.key(ptr("globex")), "POST", "/v1/recoveries/"+running+"/cancel", nil)
	c := h.must(http.StatusOK, acme, "POST", "/v1/recoveries/"+running+"/cancel", nil)
	if c.Body["state"] != "cancelled" || c.Body["finished_at"] == nil {
		t.Fatalf("cancel = %s", c.Raw)
	}
	if again := h.must(http.StatusOK, acme, "POST", "/v1/recoveries/"+running+"/cancel", nil); again.Body["state"] != "cancelled" {
		t.Fatalf("a second cancel = %s", again.Raw)
	}
	if done := h.must(http.StatusOK, acme, "POST", "/v1"+strings.TrimPrefix(accepted, "/v1")+"/cancel", nil); done.Body["state"] != "done" {
		t.Fatalf("cancel of a job done = %s; want it as it ended", done.Raw)
	}
	trail := h.must(http.StatusOK, acme, "GET", "/v1/audit?object_type=recovery&object_id="+running, nil)
	if d := trail.Body["data"].([]any); len(d) != 1 || d[0].(map[string]any)["action"] != "recovery.cancel" {
		t.Fatalf("the cancel's audit trail: %s; want one recovery.cancel", trail.Raw)
	}
	h.must(http.StatusAccepted, acme, "POST", "/v1/endpoints/"+ep+"/recover", map[string]any{"since": "2020-01-01T00:00:00Z"})
}
