package api_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/dispatcher"
)

// exec runs one statement on the test's database.
func (h *harness) exec(sql string, args ...any) {
	h.t.Helper()
	if _, err := h.db.Pool.Exec(context.Background(), sql, args...); err != nil {
		h.t.Fatalf("%s: %v", sql, err)
	}
}

// endpoint adds a managed endpoint through the store (the CLI's way): its URL is not checked
// against the API's resolver, so a test consumer on loopback can be one.
func (h *harness) endpoint(rawURL string, tenant string) string {
	h.t.Helper()
	c, _ := endpoints.NewCipher("", "")
	e, err := endpoints.Add(context.Background(), h.db.Pool, c, endpoints.New{URL: rawURL, Tenant: tenant})
	if err != nil {
		h.t.Fatal(err)
	}
	return e.ID
}

// The statements below write an event's rows as the dispatcher's would (route.sql, settle.sql,
// dlq_replay.sql): the log keeps a settled row's id, a routing row has routed_at equal to
// processed_at, a dead letter's failed_at is its log row's processed_at.
const (
	seedLog = `INSERT INTO webhook_delivery_log (id, stream_id, event_type, payload, created_at, delivery_id, attempt,
		enqueued_at, processed_at, status_code, error, duration_ms, tenant, endpoint_id, routed_at)
		VALUES (nextval(pg_get_serial_sequence('webhook_outbox', 'id')), $1, $2, $3, $4, $5, $6, $4, $7, $8, $9, $10, $11,
		        $12, $13)`
	seedQueue = `INSERT INTO webhook_outbox (stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at,
		endpoint_url, tenant, endpoint_id, routed_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`
	seedDead = `INSERT INTO webhook_dead_letter (delivery_id, stream_id, event_type, payload, endpoint_url, attempts,
		last_status, last_error, reason, enqueued_at, failed_at, tenant, endpoint_id, replayed_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`
)

// seeded is one event written by seed.
type seeded struct {
	id, kind, eventType string
	stream              string
	tenant              *string
	enqueued            time.Time
}

// seed writes an event of kind, enqueued at enq:
//   - fanout: routed to the endpoints eps (the first answered 500, then 200; the others 200);
//   - default: sent to WEBHOOK_URL, answered 503, its retry due in an hour;
//   - pending: its first attempt to the URL the producer set (with credentials and a token)
//     waiting;
//   - dead: sent to WEBHOOK_URL, answered 410, dead-lettered; replayed when replay is set.
func (h *harness) seed(kind, eventType, streamID string, tenant *string, enq time.Time, replay bool, eps ...string) seeded {
	h.t.Helper()
	var id string
	if err := h.db.Pool.QueryRow(context.Background(), `SELECT gen_random_uuid()::text`).Scan(&id); err != nil {
		h.t.Fatal(err)
	}
	payload := fmt.Sprintf(`{"kind": %q}`, kind)
	var stream any = streamID
	if streamID == "" {
		stream = nil
	}
	s := func(d time.Duration) time.Time { return enq.Add(d) }
	switch kind {
	case "fanout":
		h.exec(seedLog, stream, eventType, payload, enq, id, 1, s(time.Second), nil,
			fmt.Sprintf("routed to %d endpoint(s)", len(eps)), nil, tenant, nil, s(time.Second))
		for i, ep := range eps {
			if i == 0 {
				h.exec(seedLog, stream, eventType, payload, enq, id, 1, s(2*time.Second), 500, "HTTP 500 Internal Server Error", 31, tenant, ep, s(time.Second))
				h.exec(seedLog, stream, eventType, payload, enq, id, 2, s(4*time.Second), 200, nil, 12, tenant, ep, s(time.Second))
				continue
			}
			h.exec(seedLog, stream, eventType, payload, enq, id, 1, s(2*time.Second), 200, nil, 9, tenant, ep, s(time.Second))
		}
	case "default":
		h.exec(seedLog, stream, eventType, payload, enq, id, 1, s(time.Second), 503, "HTTP 503 Service Unavailable", 20, tenant, nil, nil)
		h.exec(seedQueue, stream, eventType, payload, s(time.Hour), id, 2, enq, nil, tenant, nil, nil)
	case "pending":
		h.exec(seedQueue, stream, eventType, payload, enq, id, 1, enq, "https://u:p@hooks.example.com:8443/in?token=row-secret", tenant, nil, nil)
	case "dead":
		h.exec(seedLog, stream, eventType, payload, enq, id, 1, s(time.Second), 410, "HTTP 410 Gone", 15, tenant, nil, nil)
		var replayed any
		if replay {
			replayed = s(5 * time.Second)
			h.exec(seedQueue, stream, eventType, payload, s(5*time.Second), id, 1, enq, nil, tenant, nil, s(5*time.Second))
		}
		h.exec(seedDead, id, stream, eventType, payload, nil, 1, 410, "HTTP 410 Gone", "HTTP 410 Gone: the consumer says the endpoint is gone",
			enq, s(time.Second), tenant, nil, replayed)
	default:
		h.t.Fatalf("no kind %s", kind)
	}
	return seeded{id: id, kind: kind, eventType: eventType, stream: streamID, tenant: tenant, enqueued: enq}
}

// pages walks a listing to its end, failing on an item seen twice, and returns the items.
func (h *harness) pages(key, path string) []map[string]any {
	h.t.Helper()
	var all []map[string]any
	seen := map[string]bool{}
	next := ""
	for n := 0; ; n++ {
		p := path
		if next != "" {
			p += "&cursor=" + next
		}
		r := h.must(http.StatusOK, key, "GET", p, nil)
		for _, it := range r.Body["data"].([]any) {
			m := it.(map[string]any)
			k := fmt.Sprint(m["delivery_id"], m["attempt"], m["processed_at"], m["next_attempt_at"])
			if seen[k] {
				h.t.Fatalf("%s: %s listed twice", path, k)
			}
			seen[k] = true
			all = append(all, m)
		}
		next, _ = r.Body["next_cursor"].(string)
		if next == "" {
			return all
		}
		if n > 100 {
			h.t.Fatalf("%s: no last page after %d pages", path, n)
		}
	}
}

func ids(items []map[string]any) []string {
	var out []string
	for _, it := range items {
		out = append(out, it["delivery_id"].(string))
	}
	return out
}

// TestEventsListing: every event appears once, newest first, across pages, whatever rows it
// has (a routing row and a fan-out with retries, WEBHOOK_URL attempts with a retry waiting, a
// pending row, a dead letter and its replay); filters narrow it; a tenant key sees its own
// tenant's events only; without since the listing covers the last 24 hours.
func TestEventsListing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme, globex := h.key(ptr("acme")), h.key(ptr("globex"))
	ep1 := h.endpoint("https://hooks.example.com/one", "acme")
	ep2 := h.endpoint("https://hooks.example.com/two", "acme")

	base := time.Now().Add(-40 * time.Minute).Truncate(time.Second)
	var all []seeded // oldest first
	for i := range 12 {
		enq := base.Add(time.Duration(i) * 3 * time.Minute)
		typ := "order.paid"
		if i%3 == 0 {
			typ = "order.created"
		}
		stream := fmt.Sprintf("s-%d", i%2)
		switch i % 4 {
		case 0:
			all = append(all, h.seed("fanout", typ, stream, ptr("acme"), enq, false, ep1, ep2))
		case 1:
			all = append(all, h.seed("default", typ, stream, nil, enq, false))
		case 2:
			all = append(all, h.seed("pending", typ, stream, ptr("acme"), enq, false))
		case 3:
			all = append(all, h.seed("dead", typ, stream, nil, enq, i == 3))
		}
	}
	old := h.seed("default", "order.paid", "s-0", nil, time.Now().Add(-50*time.Hour), false)

	want := func(keep func(seeded) bool) string {
		var out []string
		for i := len(all) - 1; i >= 0; i-- {
			if keep(all[i]) {
				out = append(out, all[i].id)
			}
		}
		return strings.Join(out, " ")
	}
	everything := func(seeded) bool { return true }
	ofAcme := func(s seeded) bool { return s.tenant != nil && *s.tenant == "acme" }
	for _, c := range []struct {
		key, query string
		keep       func(seeded) bool
	}{
		{h.admin, "limit=5", everything},
		{h.admin, "limit=1", everything},
		{acme, "limit=2", ofAcme},
		{h.admin, "limit=4&tenant=acme", ofAcme},
		{acme, "tenant=globex", func(seeded) bool { return false }},
		{globex, "limit=3", func(seeded) bool { return false }},
		{h.admin, "limit=2&event_type=order.created", func(s seeded) bool { return s.eventType == "order.created" }},
		{h.admin, "limit=2&stream_id=s-1", func(s seeded) bool { return s.stream == "s-1" }},
		{acme, "event_type=order.paid", func(s seeded) bool { return ofAcme(s) && s.eventType == "order.paid" }},
		{h.admin, "limit=2&since=" + url.QueryEscape(all[3].enqueued.Format(time.RFC3339)) + "&until=" + url.QueryEscape(all[7].enqueued.Format(time.RFC3339)),
			func(s seeded) bool { return !s.enqueued.Before(all[3].enqueued) && s.enqueued.Before(all[7].enqueued) }},
	} {
		got := h.pages(c.key, "/v1/events?"+c.query)
		if g, w := strings.Join(ids(got), " "), want(c.keep); g != w {
			t.Errorf("GET /v1/events?%s =\n %s\nwant\n %s", c.query, g, w)
		}
		for _, e := range got {
			if c.key == acme && e["tenant"] != "acme" {
				t.Errorf("an acme key listed %v", e)
			}
		}
	}
	h.must(http.StatusOK, h.admin, "GET", "/v1/events?since=2026-01-01T00:00:00Z&until=2026-02-01T00:00:00Z", nil)
	// Older than the default window: listed only when since reaches it.
	since := url.QueryEscape(time.Now().Add(-72 * time.Hour).Format(time.RFC3339))
	if got := ids(h.pages(h.admin, "/v1/events?limit=50&since="+since)); len(got) != 13 || got[12] != old.id {
		t.Errorf("since 72 hours ago = %d events ending %v; want 13, the oldest %s", len(got), got[len(got)-1:], old.id)
	}

	for _, c := range []struct{ query, field string }{
		{"since=yesterday", "since"},
		{"until=2026-13-01T00:00:00Z", "until"},
		{"since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", "since"},
		// A listing reads the log at most 31 days back from its end (until, or now).
		{"since=0001-01-01T00:00:00Z", "since"},
		{"since=2026-01-01T00:00:00Z&until=2026-02-01T00:00:01Z", "since"},
		{"limit=501", "limit"},
		{"cursor=bm90LWEtY3Vyc29y", "cursor"},
		{"cursor=" + encodeTestCursor(map[string]any{"e": time.Now(), "d": "not-a-uuid"}), "cursor"},
	} {
		r := h.must(http.StatusUnprocessableEntity, h.admin, "GET", "/v1/events?"+c.query, nil)
		if code, field := r.errorCode(); code != "invalid" || field != c.field {
			t.Errorf("GET /v1/events?%s = %s; want invalid %s", c.query, r.Raw, c.field)
		}
	}
}

// encodeTestCursor makes a cursor of the API's form (base64 of JSON) holding v.
func encodeTestCursor(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}

// destinations returns an answer's destinations by endpoint id or, for URLs, by destination kind.
func destinations(r response) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, d := range r.Body["destinations"].([]any) {
		m := d.(map[string]any)
		k, _ := m["endpoint_id"].(string)
		if k == "" {
			k = m["destination"].(string)
		}
		out[k] = m
	}
	return out
}

// TestEventAndDeliveryStates: an event shows each destination's state, attempts, last status
// and next attempt, URLs by origin only; a delivery shows every attempt with its outcome and
// the dead letter; another tenant's ids, and a tenant key asking for an event without a
// tenant, are 404 as a missing id.
func TestEventAndDeliveryStates(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme, globex := h.key(ptr("acme")), h.key(ptr("globex"))
	ep1 := h.endpoint("https://hooks.example.com/one", "acme")
	ep2 := h.endpoint("https://hooks.example.com/two", "acme")
	now := time.Now().Add(-time.Minute).Truncate(time.Second)
	fan := h.seed("fanout", "order.created", "s-1", ptr("acme"), now, false, ep1, ep2)
	def := h.seed("default", "order.paid", "", nil, now, false)
	pend := h.seed("pending", "order.paid", "", ptr("acme"), now, false)
	dead := h.seed("dead", "order.paid", "", nil, now, false)
	again := h.seed("dead", "order.paid", "", nil, now, true)

	ev := h.must(http.StatusOK, acme, "GET", "/v1/events/"+fan.id, nil)
	if ev.Body["payload"].(map[string]any)["kind"] != "fanout" || ev.Body["routed_at"] == nil || ev.Body["stream_id"] != "s-1" {
		t.Errorf("event = %s; want its payload, stream and routing time", ev.Raw)
	}
	ds := destinations(ev)
	if len(ds) != 2 || ds[ep1]["state"] != "delivered" || ds[ep1]["attempt_count"] != float64(2) ||
		ds[ep1]["last_status"] != float64(200) || ds[ep2]["attempt_count"] != float64(1) || ds[ep2]["destination"] != "endpoint" {
		t.Errorf("destinations of a fan-out = %s; want both endpoints delivered, the first after 2 attempts (the routing row is no destination)", ev.Raw)
	}

	d := destinations(h.must(http.StatusOK, h.admin, "GET", "/v1/events/"+def.id, nil))["webhook_url"]
	if d["state"] != "retrying" || d["next_attempt_at"] == nil || d["last_status"] != float64(503) ||
		d["origin"] != "https://default.example.com:443" || d["attempt_count"] != float64(1) {
		t.Errorf("a WEBHOOK_URL delivery waiting for its retry = %v", d)
	}
	pr := h.must(http.StatusOK, acme, "GET", "/v1/events/"+pend.id, nil)
	d = destinations(pr)["endpoint_url"]
	if d["state"] != "pending" || d["origin"] != "https://hooks.example.com:8443" || d["attempt_count"] != float64(0) || d["last_status"] != nil {
		t.Errorf("a first attempt waiting = %v", d)
	}
	for _, r := range []response{pr, h.must(http.StatusOK, h.admin, "GET", "/v1/deliveries/"+def.id, nil)} {
		for _, secret := range []string{"row-secret", "operator-secret", "u:p@"} {
			if strings.Contains(string(r.Raw), secret) {
				t.Errorf("an answer shows %q of a URL: %s", secret, r.Raw)
			}
		}
	}

	dv := h.must(http.StatusOK, h.admin, "GET", "/v1/deliveries/"+dead.id, nil)
	d = destinations(dv)["webhook_url"]
	dl, _ := d["dead_letter"].(map[string]any)
	atts := d["attempts"].([]any)
	if d["state"] != "dead_lettered" || dl == nil || dl["id"] == nil || !strings.Contains(dl["reason"].(string), "410") ||
		len(atts) != 1 || atts[0].(map[string]any)["outcome"] != "dead_lettered" {
		t.Errorf("a dead-lettered delivery = %s", dv.Raw)
	}
	d = destinations(h.must(http.StatusOK, h.admin, "GET", "/v1/deliveries/"+again.id, nil))["webhook_url"]
	if d["state"] != "pending" || d["dead_letter"] != nil || len(d["attempts"].([]any)) != 1 {
		t.Errorf("a replayed dead letter = %v; want pending again, its first run's attempt kept", d)
	}
	fv := h.must(http.StatusOK, acme, "GET", "/v1/deliveries/"+fan.id, nil)
	var outcomes []string
	for _, a := range destinations(fv)[ep1]["attempts"].([]any) {
		a := a.(map[string]any)
		outcomes = append(outcomes, fmt.Sprint(a["attempt"], ":", a["status_code"], ":", a["outcome"]))
		if a["duration_ms"] == nil || a["processed_at"] == nil {
			t.Errorf("attempt %v", a)
		}
	}
	if strings.Join(outcomes, " ") != "1:500:failed 2:200:delivered" {
		t.Errorf("attempts = %v", outcomes)
	}
	if _, ok := fv.Body["payload"]; ok {
		t.Errorf("a delivery carries the payload: %s", fv.Raw)
	}

	// Tenant isolation: another tenant's id, an id without a tenant, a malformed or missing id
	// are all the same 404.
	for _, c := range []struct{ key, id string }{
		{globex, fan.id}, {acme, def.id}, {acme, "not-a-uuid"}, {h.admin, "00000000-0000-0000-0000-000000000000"},
	} {
		for _, route := range []string{"/v1/events/", "/v1/deliveries/"} {
			r := h.must(http.StatusNotFound, c.key, "GET", route+c.id, nil)
			if code, _ := r.errorCode(); code != "not_found" {
				t.Errorf("GET %s%s = %s", route, c.id, r.Raw)
			}
		}
	}
	h.must(http.StatusOK, h.admin, "GET", "/v1/events/"+fan.id, nil)
	h.must(http.StatusOK, h.admin, "GET", "/v1/deliveries/"+strings.ToUpper(fan.id), nil)
}

// TestEndpointDeliveries: an endpoint's attempts newest first across pages, filtered by
// status, type and time; another tenant's endpoint is 404.
func TestEndpointDeliveries(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme, globex := h.key(ptr("acme")), h.key(ptr("globex"))
	ep1 := h.endpoint("https://hooks.example.com/one", "acme")
	ep2 := h.endpoint("https://hooks.example.com/two", "acme")
	base := time.Now().Add(-30 * time.Minute).Truncate(time.Second)
	var fans []seeded
	for i := range 5 {
		typ := "order.paid"
		if i == 2 {
			typ = "order.created"
		}
		fans = append(fans, h.seed("fanout", typ, "", ptr("acme"), base.Add(time.Duration(i)*5*time.Minute), false, ep1, ep2))
	}
	// A retry waiting for ep1, due in ten minutes: the newest row.
	h.exec(seedQueue, nil, "order.paid", `{}`, time.Now().Add(10*time.Minute), fans[4].id, 3, fans[4].enqueued, nil, "acme", ep1, fans[4].enqueued)

	got := h.pages(acme, "/v1/endpoints/"+ep1+"/deliveries?limit=3")
	if len(got) != 11 {
		t.Fatalf("ep1 has %d rows; want 11 (2 attempts of 5 events and a pending retry)", len(got))
	}
	if got[0]["status"] != "pending" || got[0]["next_attempt_at"] == nil || got[0]["processed_at"] != nil {
		t.Errorf("newest row = %v; want the pending retry", got[0])
	}
	for i, r := range got[1:] {
		wantStatus, wantCode := "delivered", float64(200)
		if i%2 == 1 {
			wantStatus, wantCode = "failed", float64(500)
		}
		if r["status"] != wantStatus || r["status_code"] != wantCode || r["delivery_id"] != fans[4-i/2].id {
			t.Errorf("row %d = %v; want %s %v of %s", i+1, r, wantStatus, wantCode, fans[4-i/2].id)
		}
	}
	for _, c := range []struct {
		query string
		n     int
	}{
		{"status=failed&limit=2", 5}, {"status=delivered", 5}, {"status=pending", 1}, {"status=dead_lettered", 0},
		{"event_type=order.created", 2},
		{"since=" + url.QueryEscape(fans[3].enqueued.Format(time.RFC3339)) + "&until=" + url.QueryEscape(fans[4].enqueued.Format(time.RFC3339)), 2},
	} {
		if got := h.pages(acme, "/v1/endpoints/"+ep1+"/deliveries?"+c.query); len(got) != c.n {
			t.Errorf("?%s: %d rows; want %d", c.query, len(got), c.n)
		}
	}
	if got := h.pages(h.admin, "/v1/endpoints/"+ep2+"/deliveries?limit=2"); len(got) != 5 {
		t.Errorf("admin: ep2 has %d rows; want 5", len(got))
	}
	h.must(http.StatusNotFound, globex, "GET", "/v1/endpoints/"+ep1+"/deliveries", nil)
	h.must(http.StatusNotFound, acme, "GET", "/v1/endpoints/nope/deliveries", nil)
	h.must(http.StatusNotFound, acme, "GET", "/v1/endpoints/00000000-0000-0000-0000-000000000000/deliveries", nil)
	for _, c := range []struct{ query, field string }{
		{"status=bounced", "status"}, {"since=soon", "since"}, {"limit=0", "limit"}, {"cursor=xyz", "cursor"},
		{"since=0001-01-01T00:00:00Z", "since"},
	} {
		r := h.must(http.StatusUnprocessableEntity, acme, "GET", "/v1/endpoints/"+ep1+"/deliveries?"+c.query, nil)
		if _, field := r.errorCode(); field != c.field {
			t.Errorf("?%s = %s; want the field %s named", c.query, r.Raw, c.field)
		}
	}
}

// TestDeliveryAttemptsFromADispatcher runs a real dispatcher against loopback consumers: an
// endpoint answering 500 then 200 shows two attempts, one answering 410 its dead letter, the
// fan-out event is listed once, and the API's test event shows its result when polled.
func TestDeliveryAttemptsFromADispatcher(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme, globex := h.key(ptr("acme")), h.key(ptr("globex"))
	var flaky atomic.Int32
	consumer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/flaky":
			if flaky.Add(1) == 1 {
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write([]byte(`{"error": "database is down"}`))
				return
			}
		case "/gone":
			w.WriteHeader(http.StatusGone)
			return
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(consumer.Close)
	flakyEP := h.endpoint(consumer.URL+"/flaky?token=tok-flaky", "acme")
	okEP := h.endpoint(consumer.URL+"/ok", "acme")
	goneEP := h.endpoint(consumer.URL+"/gone", "acme")

	d, err := dispatcher.New(dispatcher.Config{DatabaseURL: h.db.URL, PollInterval: 100 * time.Millisecond,
		Timeout: 5 * time.Second, RetrySchedule: []time.Duration{100 * time.Millisecond, 100 * time.Millisecond},
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

	ev, err := outbox.Enqueue(context.Background(), h.db.Pool, outbox.Event{EventType: "order.created",
		Payload: map[string]any{"order": 7}, Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	settled := func(r response) bool {
		ds := r.Body["destinations"].([]any)
		for _, d := range ds {
			if s := d.(map[string]any)["state"]; s == "pending" || s == "retrying" {
				return false
			}
		}
		return len(ds) > 0
	}
	r := h.poll(acme, "/v1/deliveries/"+ev.DeliveryID, settled)
	ds := destinations(r)
	if len(ds) != 3 {
		t.Fatalf("destinations = %s; want the three endpoints", r.Raw)
	}
	var got []string
	for _, a := range ds[flakyEP]["attempts"].([]any) {
		a := a.(map[string]any)
		got = append(got, fmt.Sprint(a["attempt"], ":", a["status_code"], ":", a["outcome"], ":", a["response_excerpt"]))
		if a["duration_ms"] == nil {
			t.Errorf("attempt %v", a)
		}
	}
	// Every attempt shows the start of the consumer's answer (WEBHOOK_RESPONSE_EXCERPT_BYTES).
	if strings.Join(got, " ") != `1:500:failed:{"error": "database is down"} 2:200:delivered:ok` || ds[flakyEP]["state"] != "delivered" {
		t.Errorf("the flaky endpoint's attempts = %v, state %v; want 500 then 200, delivered", got, ds[flakyEP]["state"])
	}
	if ds[okEP]["state"] != "delivered" || ds[okEP]["attempt_count"] != float64(1) {
		t.Errorf("the healthy endpoint = %v", ds[okEP])
	}
	if dl, _ := ds[goneEP]["dead_letter"].(map[string]any); ds[goneEP]["state"] != "dead_lettered" || dl == nil ||
		ds[goneEP]["last_status"] != float64(410) {
		t.Errorf("the gone endpoint = %v; want dead-lettered with its dead letter", ds[goneEP])
	}
	if strings.Contains(string(r.Raw), "tok-flaky") {
		t.Errorf("the answer shows an endpoint URL's query: %s", r.Raw)
	}

	e := h.must(http.StatusOK, acme, "GET", "/v1/events/"+ev.DeliveryID, nil)
	if e.Body["payload"].(map[string]any)["order"] != float64(7) || len(destinations(e)) != 3 {
		t.Errorf("event = %s", e.Raw)
	}
	if got := ids(h.pages(acme, "/v1/events?limit=10")); strings.Join(got, " ") != ev.DeliveryID {
		t.Errorf("events = %v; want the fan-out event once", got)
	}
	if got := h.pages(acme, "/v1/endpoints/"+flakyEP+"/deliveries?limit=1"); len(got) != 2 || got[0]["status"] != "delivered" || got[1]["status"] != "failed" {
		t.Errorf("the flaky endpoint's deliveries = %v", got)
	}

	// The test event the API sends is polled here, delivered with its status.
	test := h.must(http.StatusAccepted, acme, "POST", "/v1/endpoints/"+okEP+"/test", nil)
	tid := test.Body["delivery_id"].(string)
	r = h.poll(acme, test.Header.Get("Location"), settled)
	td := destinations(r)[okEP]
	if r.Body["event_type"] != "webhook.test" || td["state"] != "delivered" || td["last_status"] != float64(200) || len(destinations(r)) != 1 {
		t.Errorf("the test event = %s; want delivered to its endpoint alone with 200", r.Raw)
	}

	for _, id := range []string{ev.DeliveryID, tid} {
		h.must(http.StatusNotFound, globex, "GET", "/v1/deliveries/"+id, nil)
		h.must(http.StatusNotFound, globex, "GET", "/v1/events/"+id, nil)
	}
	h.must(http.StatusNotFound, globex, "GET", "/v1/endpoints/"+flakyEP+"/deliveries", nil)
}

// poll calls GET path until done holds, with a deadline (the dispatcher's work is async).
func (h *harness) poll(key, path string, done func(response) bool) response {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := h.must(http.StatusOK, key, "GET", path, nil)
		if done(r) {
			return r
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("GET %s: not done after 20s: %s", path, r.Raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
