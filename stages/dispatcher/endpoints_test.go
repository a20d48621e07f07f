package dispatcher_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// testKey seals the endpoints' secrets in these tests, as WEBHOOK_ENCRYPTION_KEY would.
const testKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="

// signedBy reports whether a carries a valid Standard Webhooks signature made with secret.
func signedBy(t testing.TB, a arrival, secret string) bool {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	return wh.Verify(a.Body, a.Header) == nil
}

// addEndpoint creates a managed endpoint through the store, sealed with testKey.
func (b *bundle) addEndpoint(n endpoints.New) endpoints.Endpoint {
	b.t.Helper()
	c, err := endpoints.NewCipher(testKey, "")
	if err != nil {
		b.t.Fatal(err)
	}
	ep, err := endpoints.Add(context.Background(), b.pool, c, n)
	if err != nil {
		b.t.Fatalf("adding endpoint %s: %v", n.URL, err)
	}
	return ep
}

// endpointsVersion is the last value of webhook_endpoints_version, which every trigger-fired
// change to the endpoints moves: what a dispatcher's endpoint cache compares with.
func (b *bundle) endpointsVersion() int64 {
	b.t.Helper()
	return b.db.EndpointsVersion(b.t)
}

// execInTx runs the statements in one transaction and commits it: a change made under a
// setting of its own (SET LOCAL) or with the table's triggers off for its length.
func (b *bundle) execInTx(statements ...string) {
	b.t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, s := range statements {
		if _, err := tx.Exec(ctx, s); err != nil {
			b.t.Fatalf("%s: %v", s, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		b.t.Fatal(err)
	}
}

// verifyFluxora checks a request with the consumer-side package, as a consumer holding secret.
func verifyFluxora(a arrival, secret string) error {
	v := &verify.Verifier{Secret: secret}
	_, err := v.Verify(a.Header, a.Body, time.Now())
	return err
}

// TestEndpointsFanOut: one event reaches every endpoint whose filter and tenant match, each
// signed with its own secret (sealed at rest) that the consumer-side package verifies, and no
// other; the default consumer (WEBHOOK_URL) keeps receiving the events without a tenant; an
// event that matches nothing is recorded, not dropped. Deliveries of one event share its id.
func TestEndpointsFanOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	def := newConsumer(t, nil)
	streams, payments, acme := newConsumer(t, nil), newConsumer(t, nil), newConsumer(t, nil)
	streamsEP := b.addEndpoint(endpoints.New{URL: streams.URL(), EventTypes: []string{"stream.*"}, Headers: map[string]string{"X-Team": "streams"}})
	paymentsEP := b.addEndpoint(endpoints.New{URL: payments.URL(), EventTypes: []string{"payment.settled"}, Scheme: endpoints.SchemeStandard})
	acmeEP := b.addEndpoint(endpoints.New{URL: acme.URL(), Tenant: "acme"})
	cfg := b.config(def.URL())
	cfg.EncryptionKey = testKey
	d := b.start(cfg)

	created := b.enqueue(outbox.Event{EventType: "stream.created"})
	settled := b.enqueue(outbox.Event{EventType: "payment.settled"})
	other := b.enqueue(outbox.Event{EventType: "other.event"})
	var acmeID string
	if err := b.pool.QueryRow(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, tenant)
		VALUES ('stream.updated', '{"t": 1}', 'acme') RETURNING delivery_id::text`).Scan(&acmeID); err != nil {
		t.Fatal(err)
	}
	var lonely string // a tenant nobody serves
	if err := b.pool.QueryRow(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, tenant)
		VALUES ('stream.updated', '{}', 'globex') RETURNING delivery_id::text`).Scan(&lonely); err != nil {
		t.Fatal(err)
	}
	b.waitSettled(15 * time.Second)

	ids := func(c *consumer) []string {
		var out []string
		for _, a := range c.arrivals() {
			out = append(out, a.DeliveryID+a.Header.Get("webhook-id"))
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	for name, tc := range map[string]struct {
		c    *consumer
		want []string
	}{
		"default":  {def, sorted(created, settled, other)},
		"streams":  {streams, []string{created}},
		"payments": {payments, []string{settled}},
		"acme":     {acme, []string{acmeID}},
	} {
		if got := ids(tc.c); !slices.Equal(got, tc.want) {
			t.Errorf("%s consumer got %v, want %v", name, got, tc.want)
		}
	}
	// Each endpoint's requests verify with its own secret and not with another's.
	if a := streams.arrivals()[0]; verifyFluxora(a, streamsEP.Secret) != nil || verifyFluxora(a, testSecret) == nil || verifyFluxora(a, acmeEP.Secret) == nil {
		t.Errorf("the streams endpoint's request does not verify with exactly its own secret")
	} else if a.Header.Get("X-Team") != "streams" {
		t.Errorf("custom header X-Team = %q, want streams", a.Header.Get("X-Team"))
	}
	if a := acme.arrivals()[0]; verifyFluxora(a, acmeEP.Secret) != nil {
		t.Errorf("the acme endpoint's request does not verify with its secret")
	}
	wh, err := standardwebhooks.NewWebhook(paymentsEP.Secret)
	if err != nil {
		t.Fatal(err)
	}
	if a := payments.arrivals()[0]; wh.Verify(a.Body, a.Header) != nil {
		t.Errorf("the standard endpoint's request does not verify with the Standard Webhooks library")
	}
	if a := def.arrivals()[0]; verifyFluxora(a, testSecret) != nil {
		t.Errorf("the default consumer's request does not verify with WEBHOOK_SECRET")
	}
	// The unserved tenant's event is recorded as matching nothing, and counted.
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed AND error = 'no endpoint matched'`, lonely); n != 1 {
		t.Errorf("the unserved tenant's event is not recorded as unrouted")
	}
	if got := counterValue(t, d, "fluxora_webhook_unrouted_total", "", ""); got != 1 {
		t.Errorf("unrouted_total = %v, want 1", got)
	}
	// No secret in clear in the table.
	for _, s := range []string{streamsEP.Secret, paymentsEP.Secret, acmeEP.Secret} {
		if n := b.count(`SELECT count(*) FROM webhook_endpoints e WHERE e::text LIKE '%' || $1 || '%'`, s); n != 0 {
			t.Errorf("a secret is stored in clear")
		}
	}
}

// TestEndpointRotationGrace: after rotate-secret with a grace, a standard endpoint's requests
// carry signatures for both secrets, so consumers holding either verify; once the grace ends,
// only the new one verifies.
func TestEndpointRotationGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Scheme: endpoints.SchemeStandard})
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	b.start(cfg)
	cipher, _ := endpoints.NewCipher(testKey, "")
	const grace = 3 * time.Second
	newSecret, err := endpoints.RotateSecret(context.Background(), b.pool, cipher, ep.ID, "", grace)
	if err != nil {
		t.Fatal(err)
	}
	rotated := time.Now()
	verifies := func(a arrival, secret string) bool { return signedBy(t, a, secret) }
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the delivery during the grace", func() bool { return c.received() == 1 })
	if a := c.arrivals()[0]; a.At.After(rotated.Add(grace)) {
		t.Fatalf("the delivery came %s after the rotation, past the grace: the test proves nothing; raise the grace", a.At.Sub(rotated))
	} else if !verifies(a, ep.Secret) || !verifies(a, newSecret) {
		t.Errorf("during the grace: old verifies %v, new verifies %v; want both", verifies(a, ep.Secret), verifies(a, newSecret))
	}
	// The grace is the fault under test: wait it out.
	time.Sleep(time.Until(rotated.Add(grace + 100*time.Millisecond)))
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the delivery after the grace", func() bool { return c.received() == 2 })
	if a := c.arrivals()[1]; verifies(a, ep.Secret) || !verifies(a, newSecret) {
		t.Errorf("after the grace: old verifies %v, new verifies %v; want only the new", verifies(a, ep.Secret), verifies(a, newSecret))
	}
}

// TestEndpointGoneIsDisabled: an endpoint that answers 410 Gone is disabled with the reason
// (as the Standard Webhooks specification asks), the delivery and the endpoint's other
// pending deliveries go to the dead-letter table with the endpoint recorded, and another
// endpoint is not affected.
func TestEndpointGoneIsDisabled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gone := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusGone) })
	fine := newConsumer(t, nil)
	goneEP := b.addEndpoint(endpoints.New{URL: gone.URL()})
	b.addEndpoint(endpoints.New{URL: fine.URL()})
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	d := b.start(cfg)
	ctx := context.Background()
	// A retry of an earlier event, scheduled for later: pending when the endpoint goes.
	if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, attempt, endpoint_id, routed_at, created_at)
		VALUES ('test.event', '{}', 2, $1, now(), now() + interval '1 hour')`, goneEP.ID); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the endpoint disabled", func() bool {
		return b.count(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND NOT enabled
			AND disabled_reason = 'the endpoint answered 410 Gone' AND disabled_at IS NOT NULL`, goneEP.ID) == 1
	})
	eventually(t, 10*time.Second, "the endpoint's deliveries dead-lettered", func() bool {
		return b.count(`SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1`, goneEP.ID) == 2
	})
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1 AND delivery_id = $2 AND last_status = 410`, goneEP.ID, id); n != 1 {
		t.Error("the 410 delivery is not dead-lettered with its status and endpoint")
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1 AND reason = 'endpoint disabled: the endpoint answered 410 Gone'`, goneEP.ID); n != 1 {
		t.Error("the pending retry is not dead-lettered as 'endpoint disabled: ...'")
	}
	b.waitSettled(10 * time.Second)
	if fine.received() != 1 {
		t.Errorf("the other endpoint got %d requests, want its 1", fine.received())
	}
	// A new event no longer goes to the disabled endpoint.
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the next event at the other endpoint", func() bool { return fine.received() == 2 })
	b.waitSettled(10 * time.Second)
	if gone.received() != 1 {
		t.Errorf("the disabled endpoint got %d requests, want only the first", gone.received())
	}
	// The change is counted once the claim that follows it reloads the endpoints.
	if got := counterValue(t, d, "fluxora_webhook_endpoint_lifecycle_total", "change", "disabled"); got != 1 {
		t.Errorf("endpoint_lifecycle_total{change=disabled} = %v, want 1", got)
	}
	// Enabled again (by an operator): observed, logged and counted.
	if err := endpoints.Enable(context.Background(), b.pool, goneEP.ID); err != nil {
		t.Fatal(err)
	}
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the re-enabled endpoint counted", func() bool {
		return counterValue(t, d, "fluxora_webhook_endpoint_lifecycle_total", "change", "enabled") == 1
	})
}

// TestFailingEndpointIsDisabledAfterAWhile: an endpoint failing without a success for longer
// than EndpointDisableAfter is disabled by housekeeping, with the reason.
func TestFailingEndpointIsDisabledAfterAWhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL()})
	if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET failing_since = now() - interval '6 days',
		last_success_at = now() - interval '7 days' WHERE id = $1`, ep.ID); err != nil {
		t.Fatal(err)
	}
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	cfg.PollInterval = 100 * time.Millisecond // housekeeping runs at this interval
	b.start(cfg)
	eventually(t, 10*time.Second, "the failing endpoint disabled", func() bool {
		return b.count(`SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND NOT enabled
			AND disabled_reason = 'no successful delivery for 120h0m0s'`, ep.ID) == 1
	})
}

// TestNoEndpointsNoRouting: without managed endpoints nothing is routed: events go to
// WEBHOOK_URL exactly as before, with no routed_at and the global secret.
func TestNoEndpointsNoRouting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	b.start(b.config(c.URL()))
	b.enqueue(outbox.Event{})
	b.waitSettled(10 * time.Second)
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE routed_at IS NULL AND endpoint_id IS NULL AND status_code = 200`); n != 1 {
		t.Errorf("the event was not delivered straight to WEBHOOK_URL")
	}
	if a := c.arrivals()[0]; a.VerifyErr != nil {
		t.Errorf("signature: %v", a.VerifyErr)
	}
}

// TestTenantChangeNeverCarriesEventsAcross: a retry of an acme event is pending for an acme
// endpoint when the endpoint is given to globex, URL and all, by SQL (which the store's
// dead-lettering does not see). The retry is dead-lettered with a reason that names both
// tenants, and globex's consumer receives nothing: an event goes only to an endpoint of its
// tenant at the time of the request, whatever was routed before.
func TestTenantChangeNeverCarriesEventsAcross(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acme := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	globex := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: acme.URL(), Tenant: "acme"})
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	cfg.RetrySchedule = []time.Duration{2 * time.Second, 2 * time.Second}
	b.start(cfg)

	var id string
	if err := b.pool.QueryRow(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, tenant)
		VALUES ('order.paid', '{"secret": "acme data"}', 'acme') RETURNING delivery_id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the first attempt failed and its retry waits", func() bool {
		return acme.received() == 1 && b.count(`SELECT count(*) FROM webhook_outbox WHERE attempt = 2 AND endpoint_id = $1`, ep.ID) == 1
	})
	if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET tenant = 'globex', url = $2 WHERE id = $1`,
		ep.ID, globex.URL()); err != nil {
		t.Fatal(err)
	}
	b.waitSettled(20 * time.Second)
	if n := globex.received(); n != 0 {
		t.Fatalf("globex's consumer received %d requests of an acme event after the endpoint changed tenant", n)
	}
	_, _, reason := b.deadLetter(id)
	// acme reads its dead letter: the endpoint's new tenant, another customer, is not named.
	if strings.Contains(reason, `globex`) || !strings.Contains(reason, `tenant "acme"`) {
		t.Errorf("dead-letter reason %q, want one naming the event's tenant (acme) alone", reason)
	}
	if n := acme.received(); n != 1 {
		t.Errorf("acme's old URL received %d requests, want only the first attempt", n)
	}
}

// TestNewEndpointReceivesEventsEnqueuedAfterItsCommit: an endpoint receives the events enqueued
// after the transaction that created it committed, and none enqueued while that transaction was
// open, whenever they are routed: here the one enqueued while the endpoint's transaction was
// open is routed after its commit (it reached the endpoint when created_at was the insert's
// clock, while one routed before the commit did not).
func TestNewEndpointReceivesEventsEnqueuedAfterItsCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret) VALUES ($1, 'endpoint-secret')`, c.URL()); err != nil {
		t.Fatal(err)
	}
	during := b.enqueue(outbox.Event{EventType: "t.during"})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after := b.enqueue(outbox.Event{EventType: "t.after"})
	b.start(b.config(""))
	b.waitSettled(15 * time.Second)
	got := c.byDelivery()
	if len(got[during]) != 0 || len(got[after]) != 1 {
		t.Errorf("the new endpoint got the event enqueued while it was being created %d times (want 0), the one after its commit %d (want 1)",
			len(got[during]), len(got[after]))
	}
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND error = 'no endpoint matched'`, during); n != 1 {
		t.Errorf("the event enqueued while the endpoint was being created is not recorded as matching no endpoint")
	}
}

// TestEndpointChangeWithoutTriggersIsSeen: a change to webhook_endpoints that fires no trigger
// (a restore with triggers disabled) moves no version; the dispatcher still reads the
// endpoints again within Config.EndpointRecheck and sends to the new URL. Logical replication
// and session_replication_role = replica fire the version triggers (ENABLE ALWAYS) and are
// seen at the next claim.
func TestEndpointChangeWithoutTriggersIsSeen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old, moved := newConsumer(t, nil), newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: old.URL()})
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	cfg.EndpointRecheck = 300 * time.Millisecond
	b.start(cfg)
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the first event delivered", func() bool { return old.received() == 1 })

	// A change under session_replication_role = replica moves the version.
	start := b.endpointsVersion()
	b.execInTx(`SET LOCAL session_replication_role = replica`,
		`UPDATE webhook_endpoints SET url = '`+moved.URL()+`?replica' WHERE id = '`+ep.ID+`'`)
	if after := b.endpointsVersion(); after <= start {
		t.Errorf("a change under session_replication_role = replica left the endpoints' version at %d, want it moved past %d", after, start)
	}
	if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET url = $1 WHERE id = $2`, old.URL(), ep.ID); err != nil {
		t.Fatal(err)
	}
	before := b.endpointsVersion()
	b.execInTx(`ALTER TABLE webhook_endpoints DISABLE TRIGGER USER`,
		`UPDATE webhook_endpoints SET url = '`+moved.URL()+`' WHERE id = '`+ep.ID+`'`,
		`ALTER TABLE webhook_endpoints ENABLE TRIGGER USER`,
		// ENABLE resets ALWAYS triggers to ordinary ones: as schema 10 leaves them.
		`ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_changed`,
		`ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_changed_update`,
		`ALTER TABLE webhook_endpoints ENABLE ALWAYS TRIGGER webhook_endpoints_truncated`)
	if after := b.endpointsVersion(); after != before {
		t.Fatalf("the endpoints' version moved (%d to %d): the change did fire a trigger", before, after)
	}
	eventually(t, 15*time.Second, "an event delivered to the endpoint's new URL", func() bool {
		if moved.received() > 0 {
			return true
		}
		b.enqueue(outbox.Event{})
		b.waitSettled(10 * time.Second)
		return moved.received() > 0
	})

}

// loadBeforeCommit makes the running dispatcher load the endpoints while change (SQL taking
// the endpoint id) is still uncommitted, so that its cache holds the old rows at the moved
// version, and keeps that cache from being confirmed (holdXmin): it commits the change only
// once before, an event of the old endpoint's, has been claimed and delivered to c.
func (b *bundle) loadBeforeCommit(t *testing.T, c *consumer, change, id string, before outbox.Event) {
	t.Helper()
	b.holdXmin()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, change, id); err != nil {
		t.Fatal(err)
	}
	b.enqueue(before)
	eventually(t, 10*time.Second, "the event before the change commits", func() bool { return c.received() == 1 })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// holdXmin opens a transaction with an id and keeps it open until the test ends: every
// snapshot's xmin stays at or below it, so no endpoint cache loaded meanwhile is confirmed
// (as a long report or a forgotten session elsewhere on the server would do).
func (b *bundle) holdXmin() {
	b.t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT txid_current()`); err != nil {
		b.t.Fatal(err)
	}
}

// TestStaleTenantIsReadAgainWhileConfirmationWaits: an instance loads the endpoints while a
// tenant change (acme to globex) is still uncommitted, so its cache keeps acme, and a long
// transaction elsewhere keeps the cache from being confirmed. A globex event routed after the
// commit meets the stale acme entry: the instance reads the committed tenant, finds it matches,
// and reads the endpoints again before the row's next claim, so the event is delivered at
// once, not released every 250 ms for as long as the long transaction lasts.
func TestStaleTenantIsReadAgainWhileConfirmationWaits(t *testing.T) {
	// Not parallel: holdXmin holds back every cache confirmation on the server (in-memory
	// routing tests wait for one).
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Tenant: "acme"})
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	b.start(cfg) // EndpointRecheck stays at its 30 s: the periodic re-read must not be what helps
	b.loadBeforeCommit(t, c, `UPDATE webhook_endpoints SET tenant = 'globex' WHERE id = $1`, ep.ID, outbox.Event{Tenant: "acme"})
	globex := b.enqueue(outbox.Event{Tenant: "globex"})
	eventually(t, 10*time.Second, "globex's event delivered while the cache is not confirmed", func() bool {
		return len(c.byDelivery()[globex]) == 1
	})
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, globex); n != 0 {
		t.Errorf("globex's event was dead-lettered by the stale cache")
	}
}

// TestKeyedRowsGoWhileConfirmationWaits: an endpoint ordered streams and its retries carry
// order keys when it stops ordering; a long transaction elsewhere keeps the instance's cache
// from being confirmed at the new version. The keyed rows are claimed (with the head check,
// since the cache cannot yet say that nothing orders), in order, while the transaction lasts,
// rather than left to a confirmed cache that no instance has.
func TestKeyedRowsGoWhileConfirmationWaits(t *testing.T) {
	// Not parallel: holdXmin holds back every cache confirmation on the server (in-memory
	// routing tests wait for one).
	b := setup(t)
	var healthy atomic.Bool
	var mu sync.Mutex
	var accepted []string // delivery ids answered 2xx, in the order answered
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		mu.Lock()
		accepted = append(accepted, a.DeliveryID)
		mu.Unlock()
	})
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Ordering: endpoints.OrderingStream})
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	cfg.RetrySchedule = []time.Duration{300 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond,
		300 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond}
	b.start(cfg)
	first := b.enqueue(outbox.Event{StreamID: "s", Payload: map[string]int{"n": 1}})
	second := b.enqueue(outbox.Event{StreamID: "s", Payload: map[string]int{"n": 2}})
	eventually(t, 10*time.Second, "both events keyed for the ordered endpoint", func() bool {
		return b.count(`SELECT count(*) FROM webhook_outbox WHERE NOT processed AND endpoint_id = $1 AND order_key IS NOT NULL`, ep.ID) == 2
	})
	b.holdXmin()
	if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET ordering = 'none' WHERE id = $1`, ep.ID); err != nil {
		t.Fatal(err)
	}
	healthy.Store(true)
	eventually(t, 15*time.Second, "the keyed rows delivered while the cache is not confirmed", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND processed AND status_code = 200`, ep.ID) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	if i, j := slices.Index(accepted, first), slices.Index(accepted, second); i < 0 || j < 0 || i > j {
		t.Errorf("accepted %v; want the stream's first event (%s) before its second (%s)", accepted, first, second)
	}
}

// TestRowURLToLoopbackIsDeadLetteredWithoutAllowance: without WEBHOOK_ROW_URL_NETWORKS, a row
// whose endpoint_url names a loopback listener (by IP or as localhost) is dead-lettered, and the
// listener receives nothing, while the operator's WEBHOOK_URL and managed endpoint on loopback
// still deliver. The dead letter, which the row's tenant reads, names no setting; the log's
// line names the address class and the setting.
func TestRowURLToLoopbackIsDeadLetteredWithoutAllowance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	def, managed, local := newConsumer(t, nil), newConsumer(t, nil), newConsumer(t, nil)
	b.addEndpoint(endpoints.New{URL: managed.URL(), EventTypes: []string{"managed.event"}})
	cfg, logs := b.observedConfig(def.URL(), zapcore.ErrorLevel)
	cfg.EncryptionKey = testKey
	cfg.RowURLNetworks = nil // the default: rows' URLs reach public addresses only
	b.start(cfg)

	port := local.srv.Listener.Addr().(*net.TCPAddr).Port
	rows := map[string]string{}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		url := fmt.Sprintf("http://%s:%d/containers/create?name=x", host, port)
		rows[host] = b.enqueue(outbox.Event{EventType: "row.event", EndpointURL: url})
	}
	toDefault := b.enqueue(outbox.Event{EventType: "default.event"})
	toManaged := b.enqueue(outbox.Event{EventType: "managed.event"})
	b.waitSettled(15 * time.Second)

	if n := local.received(); n != 0 {
		t.Errorf("the loopback listener named by rows received %d requests, want none", n)
	}
	for host, id := range rows {
		_, _, reason := b.deadLetter(id)
		want := []string{"invalid endpoint_url: endpoint refused: "}
		if host == "127.0.0.1" { // the URL names the address itself: its class is no secret
			want = append(want, "a loopback address")
		}
		for _, w := range want {
			if !strings.Contains(reason, w) {
				t.Errorf("%s row: reason %q, want it to contain %q", host, reason, w)
			}
		}
		if strings.Contains(reason, "WEBHOOK_") {
			t.Errorf("%s row: reason %q names the operator's setting, which the row's tenant reads", host, reason)
		}
		if strings.Contains(reason, "containers") || strings.Contains(reason, "name=x") {
			t.Errorf("%s row: reason %q repeats the URL's path or query", host, reason)
		}
	}
	detailed := 0
	for _, e := range logs.FilterMessage("delivery dead-lettered").All() {
		if d, _ := e.ContextMap()["detail"].(string); strings.Contains(d, "a loopback address") && strings.Contains(d, "WEBHOOK_ROW_URL_NETWORKS") {
			detailed++
		}
	}
	if detailed != len(rows) {
		t.Errorf("%d dead-lettered lines name the class and the setting in detail, want %d", detailed, len(rows))
	}
	if got := def.byDelivery(); len(got[toDefault]) != 1 || len(got[toManaged]) != 1 {
		t.Errorf("WEBHOOK_URL on loopback got %v, want one request for each of %s and %s", got, toDefault, toManaged)
	}
	if got := managed.byDelivery(); len(got) != 1 || len(got[toManaged]) != 1 {
		t.Errorf("the managed endpoint on loopback got %v, want one request for %s", got, toManaged)
	}
}

// TestRestrictedEndpointDialsAsARowURL: a managed endpoint whose URL a tenant wrote
// (restricted, schema 18) is dialled under the row-URL policy, as a producer's endpoint_url:
// on loopback, without WEBHOOK_ROW_URL_NETWORKS, its delivery is dead-lettered with a reason
// naming the class (the URL names the address) but not the setting, which the tenant reads, and
// its listener receives nothing, while the operator's endpoint on loopback delivers. Once the
// operator vouches for it (restricted false), a running dispatcher sees the change and delivers
// to it.
func TestRestrictedEndpointDialsAsARowURL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	def, operator, tenant := newConsumer(t, nil), newConsumer(t, nil), newConsumer(t, nil)
	b.addEndpoint(endpoints.New{URL: operator.URL(), EventTypes: []string{"x.*"}})
	restricted := b.addEndpoint(endpoints.New{URL: tenant.URL(), EventTypes: []string{"x.*"}, Restricted: true})
	cfg := b.config(def.URL())
	cfg.EncryptionKey = testKey
	cfg.RowURLNetworks = nil // the default: public addresses only
	b.start(cfg)

	first := b.enqueue(outbox.Event{EventType: "x.first"})
	b.waitSettled(15 * time.Second)
	if n := tenant.received(); n != 0 {
		t.Errorf("the restricted endpoint's loopback listener received %d requests, want none", n)
	}
	if got := operator.byDelivery(); len(got[first]) != 1 {
		t.Errorf("the operator's endpoint on loopback got %v, want one request for %s", got, first)
	}
	var reason string
	if err := b.pool.QueryRow(context.Background(), `SELECT reason FROM webhook_dead_letter WHERE delivery_id = $1 AND endpoint_id = $2`,
		first, restricted.ID).Scan(&reason); err != nil {
		t.Fatalf("the restricted endpoint's dead letter: %v", err)
	}
	if !strings.Contains(reason, "a loopback address") || strings.Contains(reason, "WEBHOOK_") {
		t.Errorf("reason %q, want it to name the class, not the setting", reason)
	}

	b.execInTx(fmt.Sprintf(`UPDATE webhook_endpoints SET restricted = false WHERE id = '%s'`, restricted.ID))
	second := b.enqueue(outbox.Event{EventType: "x.second"})
	b.waitSettled(15 * time.Second)
	if got := tenant.byDelivery(); len(got) != 1 || len(got[second]) != 1 {
		t.Errorf("the endpoint the operator vouched for got %v, want one request for %s", got, second)
	}
}

// TestEndpointPermanentStatuses: an endpoint's permanent_statuses (schema 13) replaces
// WEBHOOK_PERMANENT_STATUSES for its deliveries only. The endpoint with 404 dead-letters a 404
// on the first attempt, while an endpoint without a list of its own retries its 404 through
// the schedule (the setting's default is 413); an endpoint with an empty list ("none")
// retries a 413 that the setting would dead-letter at once.
func TestEndpointPermanentStatuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	answer := func(status int) *consumer {
		return newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(status) })
	}
	own, def, none := answer(http.StatusNotFound), answer(http.StatusNotFound), answer(http.StatusRequestEntityTooLarge)
	ownEP := b.addEndpoint(endpoints.New{URL: own.URL(), PermanentStatuses: []int{404}})
	defEP := b.addEndpoint(endpoints.New{URL: def.URL()})
	noneEP := b.addEndpoint(endpoints.New{URL: none.URL(), PermanentStatuses: []int{}})
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	b.start(cfg)

	b.enqueue(outbox.Event{})
	attempts := len(cfg.RetrySchedule) + 1
	for _, tc := range []struct {
		name     string
		c        *consumer
		id       string
		attempts int
	}{
		{"the endpoint with 404", own, ownEP.ID, 1},
		{"the endpoint without a list", def, defEP.ID, attempts},
		{"the endpoint with none", none, noneEP.ID, attempts},
	} {
		eventually(t, 15*time.Second, tc.name+"'s delivery dead-lettered", func() bool {
			return b.count(`SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1`, tc.id) == 1
		})
		if n := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1 AND attempts = $2`, tc.id, tc.attempts); n != 1 {
			t.Errorf("%s: its dead letter does not record %d attempts", tc.name, tc.attempts)
		}
		if got := tc.c.received(); got != tc.attempts {
			t.Errorf("%s got %d requests, want %d", tc.name, got, tc.attempts)
		}
	}
}
