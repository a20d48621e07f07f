package dispatcher_test

import (
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/sign"
)

// TestStandardWebhooksVerifiedIndependently delivers with the Standard Webhooks scheme during
// a secret rotation and verifies each request with the reference implementation's Go library,
// not our own code: both the new and the previous secret must verify.
func TestStandardWebhooksVerifiedIndependently(t *testing.T) {
	t.Parallel()
	const current = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	const previous = "whsec_dGhlIHByZXZpb3VzIHNlY3JldCBrZXk="
	b := setup(t)
	c := newConsumer(t, nil)
	cfg := b.config(c.URL())
	cfg.Scheme = sign.Standard
	cfg.Secret = current
	cfg.PreviousSecret = previous
	b.start(cfg)
	id := b.enqueue(outbox.Event{EventType: "order.paid", Payload: map[string]any{"id": 7, "note": "é<>&"}})
	b.waitSettled(10 * time.Second)

	got := c.arrivals()
	if len(got) != 1 {
		t.Fatalf("got %d requests", len(got))
	}
	a := got[0]
	if a.Header.Get("webhook-id") != id {
		t.Fatalf("webhook-id %q, want the delivery id %q", a.Header.Get("webhook-id"), id)
	}
	if sigs := strings.Fields(a.Header.Get("webhook-signature")); len(sigs) != 2 {
		t.Fatalf("webhook-signature %q: want two signatures during the rotation", a.Header.Get("webhook-signature"))
	}
	for _, secret := range []string{current, previous} {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			t.Fatal(err)
		}
		if err := wh.Verify(a.Body, a.Header); err != nil {
			t.Errorf("standard-webhooks library rejects the delivery for secret %s…: %v", secret[:10], err)
		}
	}
	wrong, _ := standardwebhooks.NewWebhook("whsec_d3Jvbmcgc2VjcmV0IGtleSBoZXJlIQ==")
	if err := wrong.Verify(a.Body, a.Header); err == nil {
		t.Error("a wrong secret verified: the check proves nothing")
	}
}
