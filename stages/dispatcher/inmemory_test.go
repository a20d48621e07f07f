package dispatcher_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/dispatcher"
)

// Events routed in memory (no WEBHOOK_URL, no ordered endpoint) reach exactly the endpoints
// route.sql's rule names: enabled, the same tenant (both none, or equal: never across
// tenants), existing when the event was enqueued, and a matching filter. Random endpoints and
// events; each endpoint its own consumer, each request verified with its endpoint's secret.
// Every such event is routed in memory, and the log holds one row per delivery under ids of
// its own.
func TestInMemoryRoutingProperty(t *testing.T) {
	t.Parallel()
	for seed := range uint64(2) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			b := setup(t)
			tenants := []string{"", "acme", "globex"}
			types := []string{"stream.created", "stream.updated", "payment.settled", "payment.failed", "streamx.created"}
			filters := [][]string{{}, {"stream.*"}, {"payment.settled"}, {"stream.created", "payment.*"}, {"nothing.*"}}
			type ep struct {
				id, secret string
				tenant     string
				filter     []string
				enabled    bool
				c          *consumer
			}
			var eps []*ep
			for range 8 {
				e := &ep{tenant: tenants[rng.IntN(len(tenants))], filter: filters[rng.IntN(len(filters))], enabled: rng.IntN(4) > 0, c: newConsumer(t, nil)}
				added := b.addEndpoint(endpoints.New{URL: e.c.URL(), Tenant: e.tenant, EventTypes: e.filter})
				e.id, e.secret = added.ID, added.Secret
				if !e.enabled {
					if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET enabled = false, disabled_at = now(),
						disabled_reason = 'test' WHERE id = $1`, e.id); err != nil {
						t.Fatal(err)
					}
				}
				eps = append(eps, e)
			}
			b.traceDeliveryRows()
			// An endpoint created after the events were enqueued receives none of them.
			late := newConsumer(t, nil)
			lateEP := b.addEndpoint(endpoints.New{URL: late.URL()})
			if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET created_at = now() + interval '1 hour'
				WHERE id = $1`, lateEP.ID); err != nil {
				t.Fatal(err)
			}
			d := b.startInMemory()
			inMemory := d.Stats().RoutedInMemory.Load()
			type ev struct{ tenant, typ string }
			events := map[string]ev{}
			for range 40 {
				e := ev{tenant: tenants[rng.IntN(len(tenants))], typ: types[rng.IntN(len(types))]}
				events[b.enqueue(outbox.Event{EventType: e.typ, Tenant: e.tenant})] = e
			}
			b.waitSettled(20 * time.Second)

			deliveries := 0
			matching := map[string]bool{}
			for _, e := range eps {
				got := map[string]int{}
				for _, a := range e.c.arrivals() {
					got[a.DeliveryID]++
					if err := verifyFluxora(a, e.secret); err != nil {
						t.Errorf("endpoint %s: a request does not verify with its own secret: %v", e.id, err)
					}
				}
				for id, event := range events {
					want := 0
					if e.enabled && e.tenant == event.tenant && endpoints.Matches(e.filter, event.typ) {
						want = 1
					}
					if want == 1 {
						matching[id] = true
					}
					if got[id] != want {
						t.Errorf("endpoint %s (tenant %q, filter %v, enabled %v) got event %s (tenant %q, type %s) %d times, want %d",
							e.id, e.tenant, e.filter, e.enabled, id, event.tenant, event.typ, got[id], want)
					}
					deliveries += want
				}
				if len(got) > len(events) {
					t.Errorf("endpoint %s got events that were never enqueued: %v", e.id, got)
				}
			}
			if n := late.received(); n != 0 {
				t.Errorf("an endpoint added after the events received %d of them", n)
			}
			if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id IS NOT NULL AND processed AND status_code = 200
				AND tenant IS DISTINCT FROM 'warm-up'`); n != deliveries {
				t.Errorf("%d deliveries in the log, want %d", n, deliveries)
			}
			if n := b.count(`SELECT count(*) - count(DISTINCT id) FROM webhook_deliveries`); n != 0 {
				t.Errorf("%d ids of webhook_deliveries are used twice", n)
			}
			// Every event that matched an endpoint was routed in memory (the others by the
			// statement, which records them as unrouted). A settle that takes some of an
			// event's deliveries gives the others rows (TestInMemorySlowDeliveryGetsARow): how
			// many depends on how the answers fall into settles.
			if n := d.Stats().RoutedInMemory.Load() - inMemory; n != int64(len(matching)) {
				t.Errorf("%d events routed in memory, want the %d that match an endpoint", n, len(matching))
			}
			t.Logf("%d events, %d deliveries: %d delivery rows made", len(events), deliveries, b.count(`SELECT count(*) FROM test_delivery_rows`))
		})
	}
}

// One endpoint of an event is slow: the event's other deliveries are settled without it, so
// the settle replaces the event's row and the slow delivery gets a leased row of its own,
// which it settles when it comes back. Every endpoint gets the event once, and the log holds
// the event once and each delivery once.
func TestInMemorySlowDeliveryGetsARow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	slow := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		select {
		case <-release:
		case <-a.Ctx.Done():
		}
	})
	fast1, fast2 := newConsumer(t, nil), newConsumer(t, nil)
	slowEP := b.addEndpoint(endpoints.New{URL: slow.URL()})
	b.addEndpoint(endpoints.New{URL: fast1.URL()})
	b.addEndpoint(endpoints.New{URL: fast2.URL()})
	b.startInMemory()
	id := b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the slow delivery to get a leased row of its own, the event's row gone", func() bool {
		return b.count(`SELECT count(*) FROM webhook_outbox WHERE delivery_id = $1 AND endpoint_id = $2 AND leased_by IS NOT NULL`, id, slowEP.ID) == 1 &&
			b.count(`SELECT count(*) FROM webhook_outbox WHERE delivery_id = $1`, id) == 1
	})
	if fast1.received() != 1 || fast2.received() != 1 || slow.received() != 1 {
		t.Fatalf("arrivals before the slow answer: %d, %d, slow %d; want one each", fast1.received(), fast2.received(), slow.received())
	}
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND endpoint_id IS NULL AND error = 'routed to 3 endpoint(s)'`, id); n != 1 {
		t.Errorf("the event's log row: %d, want 1 saying it went to 3 endpoints", n)
	}
	close(release)
	b.waitSettled(10 * time.Second)
	if fast1.received() != 1 || fast2.received() != 1 || slow.received() != 1 {
		t.Errorf("arrivals: %d, %d, slow %d; want one each", fast1.received(), fast2.received(), slow.received())
	}
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND endpoint_id IS NOT NULL AND status_code = 200`, id); n != 3 {
		t.Errorf("%d delivered rows in the log, want 3", n)
	}
}

// A delivery routed in memory that fails is retried like any other: its outcome gets a row,
// settled as a retry, and the next attempt succeeds; the event's other deliveries go once.
func TestInMemoryFailedDeliveryIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flaky := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		if a.Attempt == "1" {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	ok := newConsumer(t, nil)
	b.addEndpoint(endpoints.New{URL: flaky.URL()})
	b.addEndpoint(endpoints.New{URL: ok.URL()})
	b.startInMemory()
	id := b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the retry's success", func() bool { return flaky.received() == 2 })
	b.waitSettled(10 * time.Second)
	if a := flaky.arrivals(); a[0].Attempt != "1" || a[1].Attempt != "2" || a[1].DeliveryID != id {
		t.Errorf("flaky endpoint's attempts: %q then %q; want 1 then 2 of the event", a[0].Attempt, a[1].Attempt)
	}
	if ok.received() != 1 {
		t.Errorf("the healthy endpoint got %d requests, want 1", ok.received())
	}
	var statuses string
	if err := b.pool.QueryRow(context.Background(), `SELECT string_agg(attempt || ':' || status_code, ',' ORDER BY attempt, status_code)
		FROM webhook_delivery_log WHERE delivery_id = $1 AND endpoint_id IS NOT NULL`, id).Scan(&statuses); err != nil {
		t.Fatal(err)
	}
	if statuses != "1:200,1:500,2:200" {
		t.Errorf("log of the deliveries (attempt:status) = %s, want 1:200,1:500,2:200", statuses)
	}
}

// The settle of an event routed in memory is fenced by the event's lease: when the lease was
// lost while its deliveries were in flight (another claim took the event), their outcomes are
// refused as stale and nothing of the event is written; its holder delivers it again.
func TestInMemorySettleIsFencedByTheEventsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	hold := func(a arrival, w http.ResponseWriter) {
		select {
		case <-release:
		case <-a.Ctx.Done():
		}
	}
	c1, c2 := newConsumer(t, hold), newConsumer(t, hold)
	b.addEndpoint(endpoints.New{URL: c1.URL()})
	b.addEndpoint(endpoints.New{URL: c2.URL()})
	b.addWarmUp()
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	cfg.PollInterval = 200 * time.Millisecond // the stolen event comes back through the poll
	d := b.start(cfg)
	b.warmUp(d)
	id := b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "both deliveries in flight", func() bool { return c1.received() == 1 && c2.received() == 1 })
	// Another claim takes the event: its lease is no longer the one the deliveries carry.
	if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_outbox SET leased_by = 'another', lease_token = 1,
		lease_until = now() + interval '1 hour' WHERE delivery_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	close(release)
	eventually(t, 10*time.Second, "both outcomes refused as stale", func() bool { return d.Stats().Stale.Load() == 2 })
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1`, id); n != 0 {
		t.Fatalf("%d log rows written for an event whose lease was lost", n)
	}
	if n := b.count(`SELECT count(*) FROM webhook_outbox WHERE delivery_id = $1 AND leased_by = 'another'`, id); n != 1 {
		t.Fatalf("the event's row: %d held by its new holder, want 1 untouched", n)
	}
	// The other holder goes away: its lease ends and this dispatcher delivers the event again.
	if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_outbox SET lease_until = now() - interval '1 second'
		WHERE delivery_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	b.waitSettled(10 * time.Second)
	if c1.received() != 2 || c2.received() != 2 {
		t.Errorf("arrivals %d, %d; want each endpoint twice (the stale attempt, then its holder's)", c1.received(), c2.received())
	}
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND endpoint_id IS NOT NULL`, id); n != 2 {
		t.Errorf("%d delivery rows in the log, want 2: one per endpoint, from the attempts that held the lease", n)
	}
}

// A dispatcher whose role may not take ids from webhook_outbox's sequence routes through
// route.sql, a row per delivery, as before, and says which grant would let it route in memory.
func TestWithoutTheSequenceGrantEventsAreRoutedByRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := sqltest.NewRole(t, b.db)
	for _, stmt := range []string{ // docs/install.md's list, less the outbox's id sequence
		`GRANT SELECT, INSERT, UPDATE, DELETE ON webhook_outbox, webhook_dead_letter, webhook_dispatcher TO ` + role,
		`GRANT SELECT, UPDATE ON webhook_endpoints TO ` + role,
		`GRANT SELECT ON webhook_schema_version TO ` + role,
		`GRANT SELECT, INSERT ON webhook_delivery_log TO ` + role,
		`GRANT SELECT ON webhook_deliveries TO ` + role,
		`GRANT EXECUTE ON FUNCTION webhook_delivery_log_maintain(interval, interval, interval), webhook_delivery_log_drop_one(interval, interval) TO ` + role,
		`GRANT USAGE ON SEQUENCE webhook_endpoints_version TO ` + role,
		`GRANT UPDATE ON SEQUENCE webhook_outbox_notify_until TO ` + role,
	} {
		if _, err := b.pool.Exec(context.Background(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	b.traceDeliveryRows()
	c1, c2 := newConsumer(t, nil), newConsumer(t, nil)
	b.addEndpoint(endpoints.New{URL: c1.URL()})
	b.addEndpoint(endpoints.New{URL: c2.URL()})
	cfg, logs := b.observedConfig("", zapcore.InfoLevel)
	cfg.EncryptionKey = testKey
	u, err := url.Parse(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	cfg.DatabaseURL = u.String()
	b.start(cfg)
	id := b.enqueue(outbox.Event{})
	b.waitSettled(10 * time.Second)
	if c1.received() != 1 || c2.received() != 1 {
		t.Errorf("arrivals %d, %d; want one each", c1.received(), c2.received())
	}
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND endpoint_id IS NOT NULL AND status_code = 200`, id); n != 2 {
		t.Errorf("%d delivered rows in the log, want 2", n)
	}
	if n := b.count(`SELECT count(*) FROM test_delivery_rows`); n != 2 {
		t.Errorf("%d delivery rows made, want 2: a row per delivery", n)
	}
	found := false
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "grant USAGE on webhook_outbox's id sequence") {
			found = true
		}
	}
	if !found {
		t.Error("the dispatcher did not say which grant routes in memory")
	}
}

// traceDeliveryRows records every delivery row inserted into webhook_outbox (a row with an
// endpoint_id) in test_delivery_rows, through a trigger that runs as its owner, whatever the
// dispatcher's role.
func (b *bundle) traceDeliveryRows() {
	b.t.Helper()
	if _, err := b.pool.Exec(context.Background(), `
		CREATE TABLE test_delivery_rows (endpoint_id uuid);
		CREATE FUNCTION test_trace_delivery_row() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
		BEGIN
			INSERT INTO test_delivery_rows VALUES (NEW.endpoint_id);
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_trace_delivery_row AFTER INSERT ON webhook_outbox
			FOR EACH ROW WHEN (NEW.endpoint_id IS NOT NULL) EXECUTE FUNCTION test_trace_delivery_row();`); err != nil {
		b.t.Fatal(err)
	}
}

// An event whose deliveries the database refuses to log (a trigger an operator added) does
// not drag the other events of its batch back after their lease: they are delivered and
// logged once, while its own deliveries become rows of the queue, settled (or, refused again,
// left to their lease) one by one like any row.
func TestInMemoryRefusedEventStaysAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sqltest.RefuseSettles(t, b.db, "NEW.event_type = 'poison' AND NEW.endpoint_id IS NOT NULL")
	c1, c2 := newConsumer(t, nil), newConsumer(t, nil)
	b.addEndpoint(endpoints.New{URL: c1.URL()})
	b.addEndpoint(endpoints.New{URL: c2.URL()})
	evs := []outbox.Event{{EventType: "poison", Payload: map[string]any{}}}
	for i := range 5 {
		evs = append(evs, outbox.Event{EventType: "good", Payload: map[string]any{"n": i}})
	}
	d := b.startInMemory()
	if n, err := outbox.EnqueueMany(context.Background(), b.pool, evs); err != nil || n != int64(len(evs)) {
		t.Fatalf("EnqueueMany = %d, %v", n, err)
	}
	eventually(t, 15*time.Second, "the good events logged and the poison event's deliveries made rows", func() bool {
		return b.count(`SELECT count(*) FROM webhook_delivery_log WHERE event_type = 'good' AND endpoint_id IS NOT NULL`) == 10 &&
			b.count(`SELECT count(*) FROM webhook_outbox WHERE event_type = 'poison' AND endpoint_id IS NOT NULL`) == 2 &&
			b.count(`SELECT count(*) FROM webhook_outbox WHERE endpoint_id IS NULL`) == 0
	})
	for i, c := range []*consumer{c1, c2} {
		for id, as := range c.byDelivery() {
			if len(as) != 1 {
				t.Errorf("endpoint %d got event %s (%s) %d times, want once", i, id, as[0].Event, len(as))
			}
		}
		if c.received() != len(evs) {
			t.Errorf("endpoint %d got %d requests, want %d", i, c.received(), len(evs))
		}
	}
	if s := d.Stats().Stale.Load(); s != 0 {
		t.Errorf("%d stale outcomes, want none", s)
	}
}

// The endpoints' version is a sequence, bumped by a changing transaction before it commits: a
// dispatcher that reloads its endpoints meanwhile sees the new version with the old rows. It
// must not route by them once the change has committed: here an endpoint moves from tenant
// acme to globex in a transaction that stays open while the dispatcher routes an event (and
// reloads); after the commit, acme's events no longer reach it, and globex's do.
func TestInMemoryRoutingWaitsForTheEndpointChangeToCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Tenant: "acme"})
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	b.start(cfg)
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET tenant = 'globex' WHERE id = $1`, ep.ID); err != nil {
		t.Fatal(err)
	}
	before := b.enqueue(outbox.Event{Tenant: "acme"}) // the change is not committed: still acme's
	eventually(t, 10*time.Second, "acme's event before the change commits", func() bool { return c.received() == 1 })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after := b.enqueue(outbox.Event{Tenant: "acme"})
	globex := b.enqueue(outbox.Event{Tenant: "globex"})
	b.waitSettled(10 * time.Second)
	got := c.byDelivery()
	if len(got[before]) != 1 || len(got[after]) != 0 || len(got[globex]) != 1 {
		t.Errorf("the endpoint got acme's event before the commit %d times (want 1), acme's after it %d (want 0), globex's %d (want 1)",
			len(got[before]), len(got[after]), len(got[globex]))
	}
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND error = 'no endpoint matched'`, after); n != 1 {
		t.Errorf("acme's event after the change is not recorded as matching no endpoint")
	}
}

// startInMemory starts a dispatcher without WEBHOOK_URL, the endpoints' secrets sealed with
// testKey, and returns once it routes events in memory (addWarmUp, then warmUp).
func (b *bundle) startInMemory() *dispatcher.Dispatcher {
	b.t.Helper()
	b.addWarmUp()
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	d := b.start(cfg)
	b.warmUp(d)
	return d
}

// addWarmUp adds an endpoint of the tenant "warm-up" for warmUp; before the dispatcher starts,
// since every endpoint change routes the next events by statement until it is confirmed.
func (b *bundle) addWarmUp() {
	b.t.Helper()
	b.addEndpoint(endpoints.New{URL: newConsumer(b.t, nil).URL(), Tenant: "warm-up"})
}

// warmUp returns once d routes events in memory: after a start or an endpoint change the
// endpoint cache is confirmed only once every transaction older than its load has ended, and
// on a loaded database server (the test suite's) that can take a few batches. It sends
// events of the tenant "warm-up" (see addWarmUp), one at a time, until one is routed in memory.
func (b *bundle) warmUp(d *dispatcher.Dispatcher) {
	b.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for d.Stats().RoutedInMemory.Load() == 0 {
		if time.Now().After(deadline) {
			b.t.Fatal("no event was routed in memory within 30 s")
		}
		b.enqueue(outbox.Event{Tenant: "warm-up"})
		b.waitSettled(10 * time.Second)
	}
}

// An endpoint removed while one of its deliveries, routed in memory, is in flight: the
// delivery has no row yet, so removal (refusing while deliveries are pending) sees nothing
// pending and goes ahead. Answered 2xx, the delivery is logged delivered; failed, it gets its
// row at the settle and is dead-lettered at its next attempt, "endpoint ... was removed",
// instead of retried for the schedule's days. The event's other endpoint gets it once.
func TestInMemoryDeliveryOfARemovedEndpoint(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusOK, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint("answered ", status), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// Both endpoints answer only after the removal: the first settle of any of the
			// event's deliveries gives the others still in flight rows of their own.
			answer := make(chan struct{})
			wait := func(a arrival) {
				select {
				case <-answer:
				case <-a.Ctx.Done():
				}
			}
			doomed := newConsumer(t, func(a arrival, w http.ResponseWriter) {
				wait(a)
				w.WriteHeader(status)
			})
			ok := newConsumer(t, func(a arrival, w http.ResponseWriter) { wait(a) })
			doomedEP := b.addEndpoint(endpoints.New{URL: doomed.URL()})
			b.addEndpoint(endpoints.New{URL: ok.URL()})
			d := b.startInMemory()
			routed := d.Stats().RoutedInMemory.Load()
			id := b.enqueue(outbox.Event{})
			eventually(t, 10*time.Second, "both requests", func() bool { return doomed.received() == 1 && ok.received() == 1 })
			if got := d.Stats().RoutedInMemory.Load(); got != routed+1 {
				t.Fatalf("%d events routed in memory since the warm-up, want the one", got-routed)
			}
			removed, err := endpoints.Remove(context.Background(), b.pool, doomedEP.ID, endpoints.PendingRefuse)
			if err != nil {
				t.Fatalf("removing the endpoint while its delivery is in memory: %v", err)
			}
			if removed != (endpoints.Removed{}) {
				t.Errorf("removal found %+v pending, want nothing: the delivery has no row yet", removed)
			}
			close(answer)
			b.waitSettled(10 * time.Second)
			deadLetters := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, id)
			if status == http.StatusOK {
				if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND endpoint_id = $2 AND status_code = 200`, id, doomedEP.ID); n != 1 || deadLetters != 0 {
					t.Errorf("the removed endpoint's delivery: %d delivered log rows, %d dead letters; want it logged delivered once", n, deadLetters)
				}
			} else {
				// Attempts is the attempt the row was due for (2), which was never made.
				_, attempts, reason := b.deadLetter(id)
				if want := "endpoint " + doomedEP.ID + " was removed"; reason != want || attempts != 2 || deadLetters != 1 {
					t.Errorf("%d dead letters, at attempt %d, reason %q; want one at attempt 2, %q", deadLetters, attempts, reason, want)
				}
			}
			if doomed.received() != 1 || ok.received() != 1 {
				t.Errorf("arrivals: removed endpoint %d, other %d; want one each", doomed.received(), ok.received())
			}
		})
	}
}

// Start warms the settle statements up (see warmSettle), with endpoints routed in memory
// (the anchored settle and the endpoints' outcomes too) and without endpoints, without a
// warning; the warm-up delivers nothing by itself.
func TestStartWarmsTheSettleStatementsUp(t *testing.T) {
	t.Parallel()
	for _, withEndpoints := range []bool{true, false} {
		t.Run(fmt.Sprint("endpoints ", withEndpoints), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c := newConsumer(t, nil)
			url := c.URL()
			if withEndpoints {
				b.addEndpoint(endpoints.New{URL: c.URL()})
				url = ""
			}
			cfg, logs := b.observedConfig(url, zapcore.DebugLevel)
			cfg.EncryptionKey = testKey
			b.start(cfg)
			warmed := logs.FilterMessage("settle statements warmed up").All()
			if len(warmed) != 1 {
				t.Fatalf("%d warm-up lines at start, want 1", len(warmed))
			}
			if f := warmed[0].ContextMap(); f["anchored"] != withEndpoints || f["endpoint_outcomes"] != withEndpoints {
				t.Errorf("warm-up %v; want the anchored settle and the endpoints' outcomes warmed: %v", f, withEndpoints)
			}
			id := b.enqueue(outbox.Event{})
			b.waitSettled(10 * time.Second)
			if got := c.arrivals(); len(got) != 1 || got[0].DeliveryID != id {
				t.Errorf("the consumer got %d requests, want the one event", len(got))
			}
			for _, e := range logs.All() {
				if e.Level >= zapcore.WarnLevel {
					t.Errorf("logged at %s: %s %v", e.Level, e.Message, e.ContextMap())
				}
			}
		})
	}
}
