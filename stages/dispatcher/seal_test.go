package dispatcher_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestEndpointSealedValueCopiedIsNotUsed: a sealed value copied by SQL onto another endpoint
// (its secret) or under another header name does not open there, and the dispatcher
// dead-letters that endpoint's deliveries with the reason instead of signing with another
// endpoint's secret or sending a secret as a header value. The endpoint the values belong to
// keeps working, its header sealed at rest and sent in clear.
func TestEndpointSealedValueCopiedIsNotUsed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	owner, thief, leak := newConsumer(t, nil), newConsumer(t, nil), newConsumer(t, nil)
	ownerEP := b.addEndpoint(endpoints.New{URL: owner.URL(), Headers: map[string]string{"Authorization": "Bearer owner-token"}})
	thiefEP := b.addEndpoint(endpoints.New{URL: thief.URL()})
	leakEP := b.addEndpoint(endpoints.New{URL: leak.URL(), Headers: map[string]string{"Authorization": "Bearer leak-token", "X-Team": "leak"}})
	if n := b.count(`SELECT count(*) FROM webhook_endpoints e WHERE e::text LIKE '%owner-token%'`); n != 0 {
		t.Errorf("the header value is stored in clear")
	}
	// The owner's secret onto the thief's row; on the leak endpoint, its own Authorization
	// under another name, which it would send to a consumer that should not see it.
	if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET secret = (SELECT secret FROM webhook_endpoints WHERE id = $1::uuid)
		WHERE id = $2::uuid`, ownerEP.ID, thiefEP.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET headers = jsonb_set(headers, '{X-Team}', headers->'Authorization')
		WHERE id = $1::uuid`, leakEP.ID); err != nil {
		t.Fatal(err)
	}
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	b.start(cfg)

	id := b.enqueue(outbox.Event{})
	b.waitSettled(15 * time.Second)
	if owner.received() != 1 {
		t.Fatalf("the owner got %d requests, want 1", owner.received())
	}
	if a := owner.arrivals()[0]; verifyFluxora(a, ownerEP.Secret) != nil || a.Header.Get("Authorization") != "Bearer owner-token" {
		t.Errorf("the owner's request: verifies %v, Authorization %q", verifyFluxora(a, ownerEP.Secret), a.Header.Get("Authorization"))
	}
	for _, a := range thief.arrivals() {
		t.Errorf("the endpoint holding a copied secret got a request (verifies with the owner's secret: %v)", verifyFluxora(a, ownerEP.Secret) == nil)
	}
	for _, a := range leak.arrivals() {
		t.Errorf("the endpoint holding a copied header got a request with X-Team %q", a.Header.Get("X-Team"))
	}
	for _, ep := range []endpoints.Endpoint{thiefEP, leakEP} {
		var reason string
		if err := b.pool.QueryRow(t.Context(), `SELECT reason FROM webhook_dead_letter WHERE endpoint_id = $1::uuid AND delivery_id = $2`,
			ep.ID, id).Scan(&reason); err != nil {
			t.Errorf("no dead letter for endpoint %s: %v", ep.ID, err)
			continue
		}
		if !strings.Contains(reason, "does not open") || strings.Contains(reason, "enc:v") || strings.Contains(reason, "token") {
			t.Errorf("endpoint %s dead-lettered with reason %q; want why it cannot be used, without the value", ep.ID, reason)
		}
	}
}
