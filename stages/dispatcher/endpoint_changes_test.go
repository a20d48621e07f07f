package dispatcher_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestFilterChangeBySQLIsAppliedAtTheNextClaim pins that a change of an endpoint's event-type
// filter alone, made by plain SQL while a dispatcher runs and routes in memory, is applied to
// the events claimed after it: a type the new filter names is delivered, one only the old
// filter named is not (it is recorded as matching no endpoint). The dispatcher learns of the
// change only through the version trigger; were the filter missing from its comparison, the
// cache would keep the old filter (until the 30 s re-read), delivering the old type and
// dead-lettering the new one as not matching.
func TestFilterChangeBySQLIsAppliedAtTheNextClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), EventTypes: []string{"order.*"}})
	b.startInMemory()
	first := b.enqueue(outbox.Event{EventType: "order.paid"})
	eventually(t, 10*time.Second, "the event the first filter names", func() bool { return len(c.byDelivery()[first]) == 1 })
	before := b.endpointsVersion()
	if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET event_types = '{invoice.*}' WHERE id = $1`, ep.ID); err != nil {
		t.Fatal(err)
	}
	if after := b.endpointsVersion(); after <= before {
		t.Errorf("the filter change left the endpoints' version at %d", after)
	}
	dropped := b.enqueue(outbox.Event{EventType: "order.shipped"})
	added := b.enqueue(outbox.Event{EventType: "invoice.sent"})
	b.waitSettled(15 * time.Second)
	got := c.byDelivery()
	if len(got[dropped]) != 0 || len(got[added]) != 1 {
		t.Errorf("after the filter change the endpoint got the type it no longer names %d times (want 0), the type it now names %d (want 1)",
			len(got[dropped]), len(got[added]))
	}
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND error = 'no endpoint matched'`, dropped); n != 1 {
		t.Errorf("the event of the type the filter no longer names is not recorded as matching no endpoint")
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

// TestCacheNeverConfirmsOnStaleRows pins the endpoint cache's confirmation (endpointCache:
// confirmed, confirmAfter, xmin). The endpoints' version is a sequence, bumped by a changing
// transaction before it commits, so every load while the change is open reads the new version
// with the old rows. Here an endpoint moves from tenant acme to globex in a transaction left
// open while several batches are claimed and routed (each claim loads or confirms the cache),
// then committed. The events claimed before the commit go by the old endpoint (acme's
// delivered, globex's matching nothing), those enqueued after it by the new one (globex's
// delivered, acme's matching nothing). A cache confirmed on a load that could not see the
// commit (at once, or at a second batch before xmin passed the change) keeps routing acme's
// events to the endpoint after the commit, and refuses globex's.
func TestCacheNeverConfirmsOnStaleRows(t *testing.T) {
	// Not parallel: the open change holds back every cache confirmation on the server (the
	// in-memory routing tests wait for one).
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Tenant: "acme"})
	b.startInMemory()
	ctx := t.Context()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `UPDATE webhook_endpoints SET tenant = 'globex' WHERE id = $1`, ep.ID); err != nil {
		t.Fatal(err)
	}
	unrouted := func(id string) bool {
		return b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND error = 'no endpoint matched'`, id) == 1
	}
	var acmeBefore, globexBefore []string
	for i := range 3 { // one batch after another, each claimed and routed while the change is open
		acme := b.enqueue(outbox.Event{Tenant: "acme", Payload: map[string]int{"before": i}})
		globex := b.enqueue(outbox.Event{Tenant: "globex", Payload: map[string]int{"before": i}})
		eventually(t, 10*time.Second, fmt.Sprintf("batch %d routed by the endpoint as committed (acme)", i), func() bool {
			return len(c.byDelivery()[acme]) == 1 && unrouted(globex)
		})
		acmeBefore, globexBefore = append(acmeBefore, acme), append(globexBefore, globex)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var acmeAfter, globexAfter []string
	for i := range 3 {
		acmeAfter = append(acmeAfter, b.enqueue(outbox.Event{Tenant: "acme", Payload: map[string]int{"after": i}}))
		globexAfter = append(globexAfter, b.enqueue(outbox.Event{Tenant: "globex", Payload: map[string]int{"after": i}}))
		b.waitSettled(10 * time.Second)
	}
	got := c.byDelivery()
	for i := range 3 {
		if len(got[acmeBefore[i]]) != 1 || len(got[globexBefore[i]]) != 0 {
			t.Errorf("before the commit, batch %d: acme's event reached the endpoint %d times (want 1), globex's %d (want 0)",
				i, len(got[acmeBefore[i]]), len(got[globexBefore[i]]))
		}
		if len(got[acmeAfter[i]]) != 0 || len(got[globexAfter[i]]) != 1 {
			t.Errorf("after the commit, event pair %d: acme's event reached the endpoint %d times (want 0), globex's %d (want 1)",
				i, len(got[acmeAfter[i]]), len(got[globexAfter[i]]))
		}
		if !unrouted(acmeAfter[i]) {
			t.Errorf("acme's event %d after the commit is not recorded as matching no endpoint", i)
		}
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

// TestDisabledEndpointsPendingDeliveriesAreNeverSent pins that a delivery waiting for its
// retry when its endpoint is disabled (by SQL, as an operator may) is dead-lettered with the
// reason "endpoint disabled: <the endpoint's reason>", never sent. Two paths lead there, and
// each is covered: an instance that sees the endpoint go from enabled to disabled
// dead-letters its pending deliveries when it reloads; a row that no such reload moved (here
// claimed by an instance started after the change, which never saw the endpoint enabled; in
// general one in flight or leased while the reload ran) must be refused where its request is
// built. Without that refusal the second path sends the retry to the disabled endpoint.
func TestDisabledEndpointsPendingDeliveriesAreNeverSent(t *testing.T) {
	t.Parallel()
	for _, restarted := range []bool{false, true} {
		name := "seen disabled by the running instance"
		if restarted {
			name = "claimed by an instance that never saw it enabled"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
			ep := b.addEndpoint(endpoints.New{URL: c.URL()})
			cfg := b.config("")
			cfg.EncryptionKey = testKey
			cfg.RetrySchedule = []time.Duration{time.Hour} // the retry waits until the test makes it due
			cfg.PollInterval = 100 * time.Millisecond      // claims (and reloads) follow the change without a new event
			d := b.start(cfg)
			id := b.enqueue(outbox.Event{})
			eventually(t, 10*time.Second, "the first attempt failed and its retry waits", func() bool {
				return c.received() == 1 && b.count(`SELECT count(*) FROM webhook_outbox WHERE NOT processed AND attempt = 2
					AND endpoint_id = $1 AND lease_until IS NULL`, ep.ID) == 1
			})
			if restarted {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := d.Stop(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET enabled = false, disabled_at = now(),
				disabled_reason = 'x' WHERE id = $1`, ep.ID); err != nil {
				t.Fatal(err)
			}
			if restarted {
				if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_outbox SET created_at = now() WHERE endpoint_id = $1`, ep.ID); err != nil {
					t.Fatal(err)
				}
				b.start(cfg)
			}
			eventually(t, 15*time.Second, "the retry dead-lettered", func() bool {
				return b.count(`SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, id) == 1
			})
			b.waitSettled(10 * time.Second)
			if _, attempts, reason := b.deadLetter(id); reason != "endpoint disabled: x" || attempts != 2 {
				t.Errorf("dead letter after %d attempts, reason %q; want the pending retry (attempt 2), 'endpoint disabled: x'", attempts, reason)
			}
			if n := c.received(); n != 1 {
				t.Errorf("the disabled endpoint received %d requests, want only the first attempt, made while it was enabled", n)
			}
		})
	}
}

// TestDisableAfterLeavesAnAlreadyDisabledEndpointAlone pins endpoint_disable.sql's WHERE
// enabled: the housekeeping pass that disables endpoints failing for longer than
// EndpointDisableAfter must not touch one the operator already disabled, however long it has
// been failing, or the operator's reason ('maintenance') and time are overwritten by the
// dispatcher's, and `fluxhook status` no longer says why or since when it sends nothing. An
// enabled endpoint failing as long is the witness that the pass ran (it is disabled by the
// same statement).
func TestDisableAfterLeavesAnAlreadyDisabledEndpointAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	operators := b.addEndpoint(endpoints.New{URL: newConsumer(t, nil).URL()})
	witness := b.addEndpoint(endpoints.New{URL: newConsumer(t, nil).URL()})
	const disabledAt = "2026-01-02T03:04:05Z"
	if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET failing_since = now() - interval '6 days',
		last_success_at = now() - interval '7 days' WHERE id IN ($1, $2)`, operators.ID, witness.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET enabled = false, disabled_reason = 'maintenance',
		disabled_at = $2 WHERE id = $1`, operators.ID, disabledAt); err != nil {
		t.Fatal(err)
	}
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	cfg.PollInterval = 100 * time.Millisecond // housekeeping runs at this interval
	b.start(cfg)
	eventually(t, 10*time.Second, "the failing enabled endpoint disabled by the pass", func() bool {
		return b.count(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND NOT enabled
			AND disabled_reason = 'no successful delivery for 120h0m0s'`, witness.ID) == 1
	})
	var reason string
	var at time.Time
	if err := b.pool.QueryRow(t.Context(), `SELECT disabled_reason, disabled_at FROM webhook_endpoints WHERE id = $1`,
		operators.ID).Scan(&reason, &at); err != nil {
		t.Fatal(err)
	}
	if want, _ := time.Parse(time.RFC3339, disabledAt); reason != "maintenance" || !at.Equal(want) {
		t.Errorf("the operator's disabled endpoint now says %q since %s; want 'maintenance' since %s, as the operator left it",
			reason, at.UTC().Format(time.RFC3339), disabledAt)
	}
}

// TestUnconfirmedCacheSignsWithTheCommittedSecret pins freshen: a cache loaded while a secret
// rotation was open holds the old secret, and stays unconfirmed while an older transaction
// elsewhere on the server holds xmin back. An event enqueued after the rotation committed must
// be signed with the new secret, not the one the stale cache holds (consumers that already
// switched would refuse it; after a leak, the old secret must not sign again).
func TestUnconfirmedCacheSignsWithTheCommittedSecret(t *testing.T) {
	// Not parallel: holdXmin holds back every cache confirmation on the server.
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Scheme: endpoints.SchemeStandard})
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	cfg.PollInterval = 100 * time.Millisecond // idle claims (each reloading what moved) follow the open change
	d := b.start(cfg)
	ctx := t.Context()
	b.holdXmin()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	cipher, err := endpoints.NewCipher(testKey, "")
	if err != nil {
		t.Fatal(err)
	}
	newSecret, err := endpoints.RotateSecret(ctx, tx, cipher, ep.ID, "", -1) // no grace: the old one stops at once
	if err != nil {
		t.Fatal(err)
	}
	// Claims see the bumped version; the next one's refresh loads the old rows for it.
	from := d.Stats().Claims.Load()
	eventually(t, 10*time.Second, "three claims while the rotation is open", func() bool { return d.Stats().Claims.Load() >= from+3 })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the delivery", func() bool { return c.received() == 1 })
	verifies := func(a arrival, secret string) bool { return signedBy(t, a, secret) }
	if a := c.arrivals()[0]; verifies(a, ep.Secret) || !verifies(a, newSecret) {
		t.Errorf("after the rotation committed: old secret verifies %v, new verifies %v; want only the new", verifies(a, ep.Secret), verifies(a, newSecret))
	}
}
