package dispatcher_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/dispatcher"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metricValue returns the value of the series name{labels} (labels exactly, no more) gathered
// from reg, and whether it exists.
func metricValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

// ourMetrics are every series family the dispatcher defines, as the README lists them.
var ourMetrics = []string{
	"deliveries_total", "attempt_duration_seconds", "end_to_end_latency_seconds", "backlog",
	"oldest_due_age_seconds", "in_flight", "capacity", "retries_scheduled_total",
	"dead_letters_total", "deferrals_total", "released_total", "gate_fail_open_total",
	"circuit_breaker_transitions_total", "listener_reconnects_total", "wakeups_total",
	"claim_batch_rows", "settle_batch_rows", "claim_errors_total", "settle_errors_total",
	"scheduled", "deferred", "oldest_undelivered_age_seconds", "stale_settles_total", "unrouted_total", "endpoint_lifecycle_total", "already_delivered_total",
}

// TestMetricsScrapedFromARunningDispatcher runs deliveries, a dead letter, a retry and a
// circuit that opens, defers the retry and closes on its probe, then checks the series they
// moved, that every family is exported (labelled ones from zero) so that the lint sees all of
// them, and that every name carries the fluxora_webhook_ prefix.
func TestMetricsScrapedFromARunningDispatcher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		switch {
		case strings.Contains(string(a.Body), "gone"):
			w.WriteHeader(http.StatusGone)
		case strings.Contains(string(a.Body), "flaky") && a.Attempt == "1":
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	cfg := b.config(c.URL())
	cfg.PollInterval = 200 * time.Millisecond // the backstop poll is one of the wake-up sources checked
	// One failure opens the circuit for far longer than the retry's 200 ms wait, so the
	// retry is deferred as circuit_open before the probe closes the circuit again.
	cfg.BreakerThreshold = 1
	cfg.BreakerReset = 3 * time.Second
	d := b.start(cfg)
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	reg := d.Registry()

	// Every known series exists before anything happened.
	for _, s := range []struct {
		name   string
		labels map[string]string
	}{
		{"fluxora_webhook_deferrals_total", map[string]string{"reason": "rate_limited"}},
		{"fluxora_webhook_dead_letters_total", map[string]string{"reason": "exhausted"}},
		{"fluxora_webhook_circuit_breaker_transitions_total", map[string]string{"from_state": "closed", "to_state": "open"}},
		{"fluxora_webhook_deliveries_total", map[string]string{"outcome": "released"}},
		{"fluxora_webhook_attempt_duration_seconds", map[string]string{"outcome": "retry"}},
	} {
		if v, ok := metricValue(t, reg, s.name, s.labels); !ok || v != 0 {
			t.Errorf("before any delivery: %s%v = %v (exported %v), want 0", s.name, s.labels, v, ok)
		}
	}

	b.enqueue(outbox.Event{Payload: map[string]string{"k": "ok"}})
	b.enqueue(outbox.Event{Payload: map[string]string{"k": "ok2"}})
	b.enqueue(outbox.Event{Payload: map[string]string{"k": "gone"}})
	b.waitSettled(10 * time.Second)
	b.enqueue(outbox.Event{Payload: map[string]string{"k": "flaky"}})
	eventually(t, 20*time.Second, "the flaky event delivered on its probe", func() bool {
		v, _ := metricValue(t, reg, "fluxora_webhook_circuit_breaker_transitions_total",
			map[string]string{"from_state": "half_open", "to_state": "closed"})
		return v == 1 && b.count(`SELECT count(*) FROM webhook_deliveries WHERE NOT processed`) == 0
	})
	eventually(t, 10*time.Second, "a wake-up by the backstop poll", func() bool {
		v, _ := metricValue(t, reg, "fluxora_webhook_wakeups_total", map[string]string{"source": "poll"})
		return v > 0
	})
	// A row due in the future is not backlog.
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, created_at)
		VALUES ('later', '{}', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}

	status, body := get(t, srv.URL+"/metrics")
	if status != 200 {
		t.Fatalf("/metrics: %d", status)
	}
	for _, want := range []string{
		`fluxora_webhook_deliveries_total{outcome="delivered"} 3`,
		`fluxora_webhook_deliveries_total{outcome="dead_letter"} 1`,
		`fluxora_webhook_deliveries_total{outcome="retry"} 1`,
		`fluxora_webhook_dead_letters_total{reason="permanent"} 1`,
		`fluxora_webhook_retries_scheduled_total 1`,
		`fluxora_webhook_attempt_duration_seconds_count{outcome="delivered"} 3`,
		`fluxora_webhook_end_to_end_latency_seconds_count 3`,
		`fluxora_webhook_circuit_breaker_transitions_total{from_state="closed",to_state="open"} 1`,
		`fluxora_webhook_circuit_breaker_transitions_total{from_state="open",to_state="half_open"} 1`,
		`fluxora_webhook_deferrals_total{reason="rate_limited"} 0`,
		`fluxora_webhook_backlog 0`,
		`fluxora_webhook_oldest_due_age_seconds 0`,
		`fluxora_webhook_in_flight 0`,
		`fluxora_webhook_capacity 1000`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The retry was held back by the open circuit (at least once: the gate may see it again
	// before the reset) and woke the loop by its due timer.
	for _, s := range []struct {
		name   string
		labels map[string]string
	}{
		{"fluxora_webhook_deferrals_total", map[string]string{"reason": "circuit_open"}},
		{"fluxora_webhook_deliveries_total", map[string]string{"outcome": "deferred"}},
		{"fluxora_webhook_wakeups_total", map[string]string{"source": "timer"}},
		{"fluxora_webhook_wakeups_total", map[string]string{"source": "notify"}},
	} {
		if v, _ := metricValue(t, reg, s.name, s.labels); v < 1 {
			t.Errorf("%s%v = %v, want at least 1", s.name, s.labels, v)
		}
	}
	if strings.Contains(body, c.srv.URL) || strings.Contains(body, "127.0.0.1") {
		t.Error("/metrics exposes the consumer's URL")
	}

	// Every family is exported, so the lint below sees every one; every name is ours but
	// for the standard Go and process collectors and the handler's own error counter.
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		name := f.GetName()
		exported[name] = true
		standard := strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") || strings.HasPrefix(name, "promhttp_")
		if !standard && !strings.HasPrefix(name, "fluxora_webhook_") {
			t.Errorf("metric %s lacks the fluxora_webhook_ prefix", name)
		}
	}
	for _, name := range ourMetrics {
		if !exported["fluxora_webhook_"+name] {
			t.Errorf("fluxora_webhook_%s is not exported", name)
		}
	}
	// The metric names follow Prometheus conventions (base units, _total counters, ...).
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "fluxora_webhook_") {
			t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
		}
	}
}

// TestMetricsServedWhenTheBacklogQueryFails: the backlog gauges come from a query with a 2 s
// limit, which a locked or overloaded table makes fail. The scrape must still serve every
// other metric with 200 (it answered 500 with nothing, which also lost the bench its claim
// counters), say what is missing and count the failure.
func TestMetricsServedWhenTheBacklogQueryFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(arrival, http.ResponseWriter) {})
	d := b.start(b.config(c.URL()))
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	b.enqueue(outbox.Event{})
	b.waitSettled(10 * time.Second)

	ctx := context.Background()
	lock, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE webhook_outbox IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	status, body := get(t, srv.URL+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("/metrics answered %d while the backlog query could not run, want 200; body:\n%s", status, body)
	}
	if !strings.Contains(body, `fluxora_webhook_deliveries_total{outcome="delivered"} 1`) {
		t.Errorf("/metrics lacks the delivery counter while the backlog query failed:\n%s", body)
	}
	if strings.Contains(body, "fluxora_webhook_backlog ") {
		t.Errorf("/metrics reports a backlog it could not count:\n%s", body)
	}
	_ = lock.Rollback(ctx)
	_, body = get(t, srv.URL+"/metrics")
	if !strings.Contains(body, `promhttp_metric_handler_errors_total{cause="gathering"} 1`) || !strings.Contains(body, "fluxora_webhook_backlog 0") {
		t.Errorf("after the lock: want one gathering error counted and the backlog back at 0:\n%s", body)
	}
}

// TestMetricsOldestDueRowOfASaturatedEndpoint leaves a due row unclaimed the way production
// does: its endpoint is saturated (one request allowed, and it hangs). The row counts as
// backlog and its age, set a minute in the past, is what oldest_due_age_seconds reports.
// With METRICS_ENDPOINT_LABEL, the deliveries counter names the endpoint by its URL's SHA-256.
func TestMetricsOldestDueRowOfASaturatedEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		if strings.Contains(string(a.Body), "hang") {
			hang(a, release)
		}
	})
	cfg := b.config(c.URL())
	cfg.EndpointConcurrency = 1
	cfg.MetricsEndpointLabel = true
	d := b.start(cfg)
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	reg := d.Registry()
	sum := sha256.Sum256([]byte(c.URL()))
	hash := hex.EncodeToString(sum[:])

	b.enqueue(outbox.Event{Payload: map[string]string{"k": "ok"}})
	eventually(t, 10*time.Second, "the first event delivered", func() bool {
		v, _ := metricValue(t, reg, "fluxora_webhook_deliveries_total", map[string]string{"outcome": "delivered", "endpoint": hash})
		return v == 1
	})
	b.enqueue(outbox.Event{Payload: map[string]string{"k": "hang"}})
	eventually(t, 10*time.Second, "the hanging request in flight", func() bool { return c.received() == 2 })
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, created_at)
		VALUES ('test.waiting', '{}', now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the waiting row reported as a minute-old backlog", func() bool {
		n, _ := metricValue(t, reg, "fluxora_webhook_backlog", nil)
		age, _ := metricValue(t, reg, "fluxora_webhook_oldest_due_age_seconds", nil)
		return n == 1 && age >= 60 && age < 600
	})
	if got := c.received(); got != 2 {
		t.Errorf("the consumer got %d requests while saturated, want 2", got)
	}
	close(release)
	b.waitSettled(10 * time.Second)
	eventually(t, 10*time.Second, "the backlog drained", func() bool {
		age, _ := metricValue(t, reg, "fluxora_webhook_oldest_due_age_seconds", nil)
		return age == 0
	})

	_, body := get(t, srv.URL+"/metrics")
	if want := `fluxora_webhook_deliveries_total{endpoint="` + hash + `",outcome="delivered"} 3`; !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %q", want)
	}
	if strings.Contains(body, c.srv.URL) || strings.Contains(body, "127.0.0.1") {
		t.Error("/metrics exposes the consumer's URL")
	}
}

func TestReadinessFlipsOnShutdownAndDatabaseLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) { hang(a, release) })
	d, err := dispatcher.New(b.config(c.URL()))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	if status, _ := get(t, srv.URL+"/readyz"); status != 503 {
		t.Fatalf("/readyz before Start: %d, want 503", status)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "/readyz 200", func() bool { s, _ := get(t, srv.URL+"/readyz"); return s == 200 })
	if status, _ := get(t, srv.URL+"/livez"); status != 200 {
		t.Fatalf("/livez: %d", status)
	}

	// Database loss: connections refused and existing ones terminated.
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, sqltest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	exec := func(q string) {
		t.Helper()
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`ALTER DATABASE ` + b.db.Name + ` WITH ALLOW_CONNECTIONS false`)
	exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '` + b.db.Name + `'`)
	var unready string
	eventually(t, 10*time.Second, "/readyz 503 without the database", func() bool {
		s, body := get(t, srv.URL+"/readyz")
		unready = body
		return s == 503
	})
	// Unauthenticated: the driver's error (the database's address, role and name) is the log's.
	if strings.Contains(unready, b.db.Name) || strings.Contains(unready, "127.0.0.1") || !strings.Contains(unready, "database unavailable") {
		t.Errorf("/readyz without the database answered %q, want a plain 'database unavailable'", unready)
	}
	exec(`ALTER DATABASE ` + b.db.Name + ` WITH ALLOW_CONNECTIONS true`)
	eventually(t, 15*time.Second, "/readyz 200 once the database is back", func() bool { s, _ := get(t, srv.URL+"/readyz"); return s == 200 })

	b.pool.Reset() // the test's own connections were terminated too

	// Shutdown: not ready from the moment Stop begins, while a request is still in flight.
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "a request in flight", func() bool { return c.received() == 1 })
	stopped := make(chan error, 1)
	go func() { stopped <- d.Stop(context.Background()) }()
	eventually(t, 10*time.Second, "/readyz 503 during the drain", func() bool { s, _ := get(t, srv.URL+"/readyz"); return s == 503 })
	if status, _ := get(t, srv.URL+"/livez"); status != 200 {
		t.Fatalf("/livez while draining: %d, want 200", status)
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// TestMetricsShowAConsumerOutage: during an outage the backlog is empty (every event's retry is
// scheduled for later) and rows held by the gate are not due either; the metrics must still
// show the waiting work, by reason, and how long the oldest event has waited.
func TestMetricsShowAConsumerOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	d := b.start(b.config(c.URL()))
	reg := d.Registry()
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, attempt, created_at, enqueued_at, deferred_reason) VALUES
		('retry.waiting', '{}', 3, now() + interval '10 minutes', now() - interval '20 minutes', NULL),
		('held.open',     '{}', 2, now() + interval '1 minute',   now() - interval '5 minutes', 'circuit breaker open'),
		('held.rate',     '{}', 2, now() + interval '1 minute',   now() - interval '1 minute', 'retry rate limit'),
		('held.stream',   '{}', 1, now() + interval '1 minute',   now() - interval '1 minute', 'behind its stream')`); err != nil {
		t.Fatal(err)
	}
	value := func(name string, labels map[string]string) float64 {
		v, _ := metricValue(t, reg, name, labels)
		return v
	}
	if n := value("fluxora_webhook_backlog", nil); n != 0 {
		t.Errorf("backlog %v, want 0: nothing is due", n)
	}
	if n := value("fluxora_webhook_scheduled", nil); n != 4 {
		t.Errorf("scheduled %v, want 4", n)
	}
	for label, want := range map[string]float64{"circuit_open": 1, "rate_limited": 1, "probe_in_flight": 0, "behind_stream": 1} {
		if n := value("fluxora_webhook_deferred", map[string]string{"reason": label}); n != want {
			t.Errorf("deferred{reason=%q} = %v, want %v", label, n, want)
		}
	}
	if age := value("fluxora_webhook_oldest_undelivered_age_seconds", nil); age < 1200 || age > 1500 {
		t.Errorf("oldest_undelivered_age_seconds = %v, want about 1200", age)
	}
}
