package dispatcher_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestAddressedRowsOutsideTheEndpointsRulesAreNeverSent: rows that name a managed endpoint
// directly (written by a role the insert trigger lets through, as a restore or a mistaken
// script might) reach the dispatcher addressed to acme's endpoint, whose filter is acme.*: the
// review's row (no tenant, billing.forged), an acme event of a type the filter does not name,
// and an acme event enqueued before the endpoint was created. None is sent; each is
// dead-lettered with a reason naming what is wrong. An acme.* event the producer enqueued
// reaches the endpoint, and so does a replay (its dead letter marked replayed) of an event
// enqueued before the endpoint existed, of a type outside its filter: an operator's replay
// waives the filter and the creation time, not the tenant.
func TestAddressedRowsOutsideTheEndpointsRulesAreNeverSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Tenant: "acme", EventTypes: []string{"acme.*"},
		Headers: map[string]string{"Authorization": "Bearer acme-credential"}})
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	b.start(cfg)
	ctx := context.Background()

	forge := func(eventType, tenant, enqueued string) string {
		t.Helper()
		var id string
		if err := b.pool.QueryRow(ctx, `INSERT INTO webhook_outbox (event_type, payload, tenant, endpoint_id, enqueued_at)
			VALUES ($1, '{"forged": true}', nullif($2, ''), $3, `+enqueued+`) RETURNING delivery_id::text`,
			eventType, tenant, ep.ID).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	review := forge("billing.forged", "", "now()")
	filtered := forge("billing.forged", "acme", "now()")
	early := forge("acme.order.paid", "acme", "now() - interval '1 hour'")

	// A replay: the dead letter of an event older than the endpoint, of a type outside its
	// filter, marked replayed, and its row addressed to the endpoint, as `dlq replay
	// --to-endpoint` writes them.
	var replay string
	if err := b.pool.QueryRow(ctx, `WITH dl AS (
			INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, reason, enqueued_at, tenant, replayed_at)
			VALUES (gen_random_uuid(), 'legacy.invoice', '{"n": 1}', 1, 'endpoint tenant changed', now() - interval '1 hour', 'acme', now())
			RETURNING delivery_id, event_type, payload, enqueued_at, tenant)
		INSERT INTO webhook_outbox (delivery_id, event_type, payload, enqueued_at, tenant, endpoint_id, routed_at)
		SELECT delivery_id, event_type, payload, enqueued_at, tenant, $1, now() FROM dl
		RETURNING delivery_id::text`, ep.ID).Scan(&replay); err != nil {
		t.Fatal(err)
	}
	good := b.enqueue(outbox.Event{EventType: "acme.order.paid", Tenant: "acme"})
	b.waitSettled(20 * time.Second)

	got := c.byDelivery()
	if len(got[good]) != 1 || len(got[replay]) != 1 {
		t.Errorf("the producer's acme.order.paid reached the endpoint %d times and the replay %d times, want 1 each",
			len(got[good]), len(got[replay]))
	}
	for name, want := range map[string]struct{ id, reason string }{
		"the review's row (no tenant)":          {review, `tenant "acme"`},
		"an acme event outside the filter":      {filtered, `event type "billing.forged" does not match the filter of endpoint ` + ep.ID + ` (acme.*)`},
		"an acme event older than the endpoint": {early, "before endpoint " + ep.ID + " was created"},
	} {
		if n := len(got[want.id]); n != 0 {
			t.Errorf("%s reached the endpoint %d times, want never", name, n)
		}
		_, _, reason := b.deadLetter(want.id)
		if !strings.Contains(reason, want.reason) {
			t.Errorf("%s: dead-letter reason %q, want it to say %q", name, reason, want.reason)
		}
	}
}

// TestStaleFilterIsReadAgainWhileConfirmationWaits: an instance loads the endpoints while a
// change that widens an endpoint's filter (acme.* to every type) is still uncommitted, so its
// cache keeps acme.*, and a long transaction elsewhere keeps the cache from being confirmed. An
// event of another type, routed by statement after the commit, meets the stale filter where
// its request is built: the instance reads the committed endpoint, finds that it takes the
// event, and reads the endpoints again, so the event is delivered, not dead-lettered by stale
// data.
func TestStaleFilterIsReadAgainWhileConfirmationWaits(t *testing.T) {
	// Not parallel: holdXmin holds back every cache confirmation on the server.
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Tenant: "acme", EventTypes: []string{"acme.*"}})
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	b.start(cfg)
	b.loadBeforeCommit(t, c, `UPDATE webhook_endpoints SET event_types = '{}' WHERE id = $1`, ep.ID,
		outbox.Event{EventType: "acme.order.paid", Tenant: "acme"})
	other := b.enqueue(outbox.Event{EventType: "billing.invoiced", Tenant: "acme"})
	eventually(t, 10*time.Second, "the event the widened filter takes delivered while the cache is not confirmed", func() bool {
		return len(c.byDelivery()[other]) == 1
	})
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, other); n != 0 {
		t.Errorf("the event was dead-lettered by the stale filter")
	}
}
