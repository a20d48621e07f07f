package dispatcher_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

func TestMetricsScrapedFromARunningDispatcher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		if strings.Contains(string(a.Body), "gone") {
			w.WriteHeader(http.StatusGone)
		}
	})
	d := b.start(b.config(c.URL()))
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)

	b.enqueue(outbox.Event{Payload: map[string]string{"k": "ok"}})
	b.enqueue(outbox.Event{Payload: map[string]string{"k": "ok2"}})
	b.enqueue(outbox.Event{Payload: map[string]string{"k": "gone"}})
	b.waitSettled(10 * time.Second)
	// A row due in the future is not backlog; a due row no dispatcher can take is.
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, created_at)
		VALUES ('later', '{}', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}

	status, body := get(t, srv.URL+"/metrics")
	if status != 200 {
		t.Fatalf("/metrics: %d", status)
	}
	for _, want := range []string{
		`fluxora_webhook_deliveries_total{outcome="delivered"} 2`,
		`fluxora_webhook_deliveries_total{outcome="dead_letter"} 1`,
		`fluxora_webhook_dead_letters_total{reason="permanent"} 1`,
		`fluxora_webhook_attempt_duration_seconds_count{outcome="delivered"} 2`,
		`fluxora_webhook_end_to_end_latency_seconds_count 2`,
		`fluxora_webhook_backlog 0`,
		`fluxora_webhook_in_flight 0`,
		`fluxora_webhook_capacity 256`,
		`fluxora_webhook_wakeups_total{source="notify"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, c.srv.URL) || strings.Contains(body, "127.0.0.1") {
		t.Error("/metrics exposes the consumer's URL")
	}
	// The metric names follow Prometheus conventions (base units, _total counters, ...).
	problems, err := testutil.GatherAndLint(d.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "fluxora_webhook_") {
			t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
		}
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
	eventually(t, 10*time.Second, "/readyz 503 without the database", func() bool { s, _ := get(t, srv.URL+"/readyz"); return s == 503 })
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
