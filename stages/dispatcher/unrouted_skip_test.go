package dispatcher_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// TestUnroutedEventsPassAHeldDefault: claims skip WEBHOOK_URL's rows while it is saturated (a
// consumer that hangs) or gated (its circuit open), and an event not routed yet carries the
// same key; it must not be skipped with them, or every tenant's events wait for WEBHOOK_URL
// before they reach their own, healthy, endpoints (as they did: until the hung requests timed
// out, or for the breaker's whole reset). A tenant's ordered stream reaches its endpoint while
// WEBHOOK_URL is still held.
func TestUnroutedEventsPassAHeldDefault(t *testing.T) {
	t.Parallel()
	for _, held := range []string{"saturated", "circuit open"} {
		t.Run(held, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			def := newConsumer(t, func(a arrival, w http.ResponseWriter) {
				if held == "circuit open" {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				select { // hangs while the test runs
				case <-release:
				case <-a.Ctx.Done():
				}
			})
			good := newConsumer(t, nil)
			b.addEndpoint(endpoints.New{URL: good.URL(), Tenant: "t1", Ordering: endpoints.OrderingStream})
			cfg := b.config(def.URL())
			cfg.EncryptionKey = testKey
			cfg.Timeout = 30 * time.Second
			cfg.EndpointConcurrency = 2
			trans := &transitions{}
			if held == "circuit open" {
				cfg.RetrySchedule = []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, time.Minute}
				g, err := gate.NewBreakerGate(redistest.Open(t, redistest.Prefix(t)), gate.Params{
					Threshold: 3, Reset: time.Minute, RetryRPS: 100, ProbeTimeout: cfg.Timeout + 5*time.Second,
				}, gate.Hooks{OnTransition: trans.add, Logger: cfg.Logger})
				if err != nil {
					t.Fatal(err)
				}
				cfg.Gate = g
			}
			d := b.start(cfg)
			for i := range 6 {
				b.enqueue(outbox.Event{Payload: map[string]int{"default": i}})
			}
			// Held, as the dispatcher sees it: the rows waiting for a slot put back, or a
			// retry deferred by the open circuit. Claims skip WEBHOOK_URL's rows from then on.
			eventually(t, 15*time.Second, "WEBHOOK_URL held ("+held+")", func() bool {
				if held == "circuit open" {
					_, open := trans.first("closed>open")
					return open && d.Stats().Deferred.Load() > 0
				}
				return d.Stats().Released.Load() > 0
			})
			if _, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_outbox (stream_id, event_type, payload, tenant)
				SELECT 'g', 'stream.updated', jsonb_build_object('stream', 'g', 'seq', i), 't1' FROM generate_series(0, 2) i ORDER BY i`); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "tenant t1's 3 events at their endpoint while WEBHOOK_URL is held", func() bool {
				return len(good.arrivals()) == 3
			})
		})
	}
}

// TestUnroutedEventsPassWithAnUnconfirmedCache: the claim tells unrouted events from WEBHOOK_URL's
// by the table as well as by the cache: a cache loaded while the first endpoint's creation was
// committing is empty, and stays unconfirmed while a long transaction holds the server's xmin,
// and a tenant's events were skipped with a saturated WEBHOOK_URL meanwhile, though routing
// (which asks the table then) would have sent them. (Found by an outside review.)
func TestUnroutedEventsPassWithAnUnconfirmedCache(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	def := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		select { // hangs while the test runs
		case <-release:
		case <-a.Ctx.Done():
		}
	})
	good := newConsumer(t, nil)
	b.holdXmin()
	// The endpoint's commit takes a second: the version moves first, and a claim's load in
	// between sees no row.
	if _, err := b.pool.Exec(ctx, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER zz_slow_commit AFTER INSERT ON webhook_endpoints
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`); err != nil {
		t.Fatal(err)
	}
	cfg := b.config(def.URL())
	cfg.EncryptionKey = testKey
	cfg.Timeout = 30 * time.Second
	cfg.EndpointConcurrency = 2
	cfg.PollInterval = 50 * time.Millisecond
	d := b.start(cfg)
	b.addEndpoint(endpoints.New{URL: good.URL(), Tenant: "t1"})
	from := d.Stats().Claims.Load()
	eventually(t, 10*time.Second, "claims after the endpoint's commit", func() bool { return d.Stats().Claims.Load() >= from+2 })
	for i := range 6 {
		b.enqueue(outbox.Event{Payload: map[string]int{"default": i}})
	}
	eventually(t, 15*time.Second, "WEBHOOK_URL saturated", func() bool { return d.Stats().Released.Load() > 0 })
	for i := range 3 {
		b.enqueue(outbox.Event{Payload: map[string]int{"t1": i}, Tenant: "t1"})
	}
	eventually(t, 10*time.Second, "tenant t1's 3 events at their endpoint while WEBHOOK_URL is saturated", func() bool {
		return len(good.arrivals()) == 3
	})
}
