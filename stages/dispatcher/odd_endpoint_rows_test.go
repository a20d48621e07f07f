package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
)

// sqlEndpoint runs an INSERT ... RETURNING id::text of webhook_endpoints and returns the id.
func (b *bundle) sqlEndpoint(query string, args ...any) string {
	b.t.Helper()
	var id string
	if err := b.pool.QueryRow(context.Background(), query, args...).Scan(&id); err != nil {
		b.t.Fatalf("%s: %v", query, err)
	}
	return id
}

// TestOddEndpointRowsLoad: values SQL may store that Go's types do not hold as they are (a
// NULL in the filter, timestamps at ±infinity) load as route.sql reads them, and never fail
// the load of the other endpoints. A failed load used to leave the cache empty, taken for "no
// endpoints": a tenant's event went to the tenant-less WEBHOOK_URL and the endpoints got nothing.
func TestOddEndpointRowsLoad(t *testing.T) {
	t.Parallel()
	b := setup(t)
	def, good, acme := newConsumer(t, nil), newConsumer(t, nil), newConsumer(t, nil)
	nullFilter, early, grace := newConsumer(t, nil), newConsumer(t, nil), newConsumer(t, nil)
	insert := `INSERT INTO webhook_endpoints (url, secret, tenant) VALUES ($1, 'endpoint-secret', $2) RETURNING id::text`
	b.sqlEndpoint(insert, good.URL(), nil)
	b.sqlEndpoint(insert, acme.URL(), "acme")
	for c, set := range map[*consumer]string{
		nullFilter: `event_types = ARRAY['x.y', NULL, 'z.*']`,
		early:      `created_at = '-infinity', disabled_at = 'infinity'`,
		grace:      `previous_secret = 'old-secret', previous_secret_expires_at = 'infinity'`,
	} {
		id := b.sqlEndpoint(insert, c.URL(), nil)
		if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET `+set+` WHERE id = $1::uuid`, id); err != nil {
			t.Fatal(err)
		}
	}
	b.start(b.config(def.URL()))

	forAcme := b.enqueue(outbox.Event{EventType: "x.y", Tenant: "acme"})
	b.enqueue(outbox.Event{EventType: "x.y"})
	b.enqueue(outbox.Event{EventType: "other.type"})
	b.waitSettled(15 * time.Second)
	for _, a := range def.arrivals() {
		if a.DeliveryID == forAcme {
			t.Errorf("tenant acme's event reached the tenant-less WEBHOOK_URL consumer")
		}
	}
	if got := acme.byDelivery(); len(acme.arrivals()) != 1 || len(got[forAcme]) != 1 {
		t.Errorf("the acme endpoint got %d requests, want its tenant's event once", len(acme.arrivals()))
	}
	for name, c := range map[string]struct {
		c    *consumer
		want int
	}{
		"the sound endpoint": {good, 2},
		// Its NULL entry matches nothing, as in SQL; its other entries match as ever.
		"the endpoint with a NULL in its filter": {nullFilter, 1},
		"the endpoint created at -infinity":      {early, 2},
		"the endpoint whose grace never ends":    {grace, 2},
	} {
		if n := len(c.c.arrivals()); n != c.want {
			t.Errorf("%s got %d requests, want %d", name, n, c.want)
		}
		for _, a := range c.c.arrivals() {
			if err := verifyFluxora(a, "endpoint-secret"); err != nil {
				t.Errorf("%s: a request does not verify with its secret: %v", name, err)
			}
		}
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

// TestEndpointRowTurnsOddWhileRunning: an endpoint's filter given a NULL entry by SQL while
// the dispatcher runs, and an endpoint added after it: every endpoint keeps receiving its
// events. (The whole batch's deliveries were released and claimed again, every 250 ms,
// while the load of that one row failed.)
func TestEndpointRowTurnsOddWhileRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good, odd, later := newConsumer(t, nil), newConsumer(t, nil), newConsumer(t, nil)
	insert := `INSERT INTO webhook_endpoints (url, secret, event_types) VALUES ($1, 'endpoint-secret', $2) RETURNING id::text`
	b.sqlEndpoint(insert, good.URL(), []string{})
	oddID := b.sqlEndpoint(insert, odd.URL(), []string{"x.y"})
	b.start(b.config(""))
	b.enqueue(outbox.Event{EventType: "x.y"})
	b.waitSettled(15 * time.Second)
	if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET event_types = array_append(event_types, NULL) WHERE id = $1::uuid`, oddID); err != nil {
		t.Fatal(err)
	}
	b.sqlEndpoint(insert, later.URL(), []string{})
	for range 3 {
		b.enqueue(outbox.Event{EventType: "x.y"})
	}
	b.waitSettled(15 * time.Second)
	if g, o, l := len(good.arrivals()), len(odd.arrivals()), len(later.arrivals()); g != 4 || o != 4 || l != 3 {
		t.Errorf("requests: the sound endpoint %d (want 4), the one with a NULL in its filter %d (want 4), the one added later %d (want 3)", g, o, l)
	}
}

// TestEndpointsRestoredWithoutTriggers: endpoints written with the tables' triggers disabled
// (pg_restore --disable-triggers) into an install whose endpoints' version never moved are
// loaded by the periodic check: nothing announces them, and without a first look they were
// never loaded, a tenant's events going to WEBHOOK_URL instead.
func TestEndpointsRestoredWithoutTriggers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	def, acme := newConsumer(t, nil), newConsumer(t, nil)
	cfg := b.config(def.URL())
	cfg.EndpointRecheck = time.Nanosecond // every refresh looks: the test needs no wait for it
	b.start(cfg)
	b.execInTx(`ALTER TABLE webhook_endpoints DISABLE TRIGGER ALL`,
		`INSERT INTO webhook_endpoints (url, secret, tenant, created_at) VALUES ('`+acme.URL()+`', 'endpoint-secret', 'acme', now() - interval '1 day')`,
		`ALTER TABLE webhook_endpoints ENABLE TRIGGER ALL`,
		`ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_changed`,
		`ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_changed_update`,
		`ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_truncated`)
	if v := b.endpointsVersion(); v != 0 {
		t.Fatalf("the endpoints' version moved to %d: the test needs a change that bumps nothing", v)
	}
	id := b.enqueue(outbox.Event{EventType: "invoice.paid", Tenant: "acme"})
	b.waitSettled(15 * time.Second)
	if n := def.received(); n != 0 {
		t.Errorf("tenant acme's event reached the tenant-less WEBHOOK_URL consumer (%d requests)", n)
	}
	if got := acme.byDelivery(); len(got[id]) != 1 {
		t.Errorf("the acme endpoint got %d requests for its event, want 1", len(got[id]))
	}
}

// TestEmptyTableRoutesNothing: with no row in webhook_endpoints nothing is routed, every event
// going to WEBHOOK_URL, whatever the state of the cache: here not confirmed (an endpoint added
// and removed moved the version, and a long transaction holds the confirmation back), when a
// tenant's event was recorded as matching no endpoint instead.
func TestEmptyTableRoutesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL()})
	if _, err := b.pool.Exec(t.Context(), `DELETE FROM webhook_endpoints WHERE id = $1::uuid`, ep.ID); err != nil {
		t.Fatal(err)
	}
	b.holdXmin()
	cfg := b.config(c.URL())
	cfg.EncryptionKey = testKey
	b.start(cfg)
	plain := b.enqueue(outbox.Event{})
	acme := b.enqueue(outbox.Event{Tenant: "acme"})
	b.waitSettled(15 * time.Second)
	got := c.byDelivery()
	if len(got[plain]) != 1 || len(got[acme]) != 1 {
		t.Errorf("WEBHOOK_URL got the event without a tenant %d times and acme's %d times, want each once", len(got[plain]), len(got[acme]))
	}
}
