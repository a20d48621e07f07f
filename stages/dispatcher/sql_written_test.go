package dispatcher_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestEndpointWrittenBySQLIsChecked: an endpoint's headers and URL written by SQL, which no
// validation guards, are checked when the dispatcher loads it. A header that would replace one
// fluxhook sets (the signature, the content type), one HTTP cannot carry, two names that differ
// only in case, and a URL the dispatcher refuses each dead-letter the endpoint's deliveries
// with the reason (no value in it), counted as endpoint_invalid and logged once; no request
// goes to such an endpoint, and a sound endpoint beside them gets the event, signed.
func TestEndpointWrittenBySQLIsChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cases := []struct{ name, set, says string }{
		{"a forged signature", `headers = '{"X-Fluxora-Signature": "v1=forged"}'`, `headers: header "X-Fluxora-Signature" is reserved`},
		{"a content type", `headers = '{"content-type": "text/plain"}'`, `headers: header "content-type" is reserved`},
		{"a line feed in a value", `headers = '{"X-Team": "forged\nX-Injected: 1"}'`, `headers: header "X-Team": the value has a control character`},
		{"names that differ in case", `headers = '{"X-Team": "forged-a", "x-team": "forged-b"}'`, `headers: "X-Team" and "x-team" are the same header`},
		{"a name with a space", `headers = '{"X Team": "forged"}'`, `headers: header name "X Team" is not a valid HTTP header name`},
		{"plain http to a public host", `url = 'http://example.com/secret-path?token=forged'`, `url: http:// is allowed only for loopback hosts`},
	}
	good := newConsumer(t, nil)
	goodEP := b.addEndpoint(endpoints.New{URL: good.URL(), Headers: map[string]string{"X-Team": "good"}})
	bad := make([]*consumer, len(cases))
	ids := make([]string, len(cases))
	for i, c := range cases {
		bad[i] = newConsumer(t, nil)
		ids[i] = b.addEndpoint(endpoints.New{URL: bad[i].URL()}).ID
		if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET `+c.set+` WHERE id = $1::uuid`, ids[i]); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	cfg, logs := b.observedConfig("", zapcore.WarnLevel)
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	d := b.start(cfg)

	id := b.enqueue(outbox.Event{})
	b.waitSettled(15 * time.Second)
	if got := good.arrivals(); len(got) != 1 || verifyFluxora(got[0], goodEP.Secret) != nil || got[0].Header.Get("X-Team") != "good" {
		t.Fatalf("the sound endpoint got %d requests, want 1, signed, with its header", len(got))
	}
	for i, c := range cases {
		for _, a := range bad[i].arrivals() {
			t.Errorf("%s: the endpoint got a request (signature %q, X-Team %q)", c.name, a.Header.Get("X-Fluxora-Signature"), a.Header.Get("X-Team"))
		}
		var reason string
		if err := b.pool.QueryRow(t.Context(), `SELECT reason FROM webhook_dead_letter WHERE endpoint_id = $1::uuid AND delivery_id = $2`,
			ids[i], id).Scan(&reason); err != nil {
			t.Errorf("%s: no dead letter: %v", c.name, err)
			continue
		}
		if want := "endpoint " + ids[i] + " is misconfigured: " + c.says; !strings.HasPrefix(reason, want) || strings.Contains(reason, "forged") {
			t.Errorf("%s: dead-lettered with %q; want it to start %q, with no value or URL path", c.name, reason, want)
		}
		if n := logs.FilterMessage("endpoint cannot be delivered to").FilterField(zap.String("endpoint_id", ids[i])).Len(); n != 1 {
			t.Errorf("%s: %d warnings naming the endpoint, want 1", c.name, n)
		}
	}
	for _, e := range logs.All() {
		if line := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(line, "forged") || strings.Contains(line, "secret-path") {
			t.Errorf("a log line repeats a stored value or a URL's path: %s", line)
		}
	}
	// Counted once the settle has returned, a moment after the rows show it.
	eventually(t, 5*time.Second, "every dead letter counted as endpoint_invalid", func() bool {
		v, _ := metricValue(t, d.Registry(), "fluxora_webhook_dead_letters_total", map[string]string{"reason": "endpoint_invalid"})
		return v == float64(len(cases))
	})
}

// TestEndpointPreviousSecretRefused: a previous secret SQL wrote that cannot sign (not a
// Standard Webhooks secret) leaves the endpoint signing with its current secret, logged once,
// instead of dead-lettering every delivery the current secret could sign; an endpoint whose
// current secret is empty is dead-lettered with a reason that names its column, not a variable
// of the dispatcher's.
func TestEndpointPreviousSecretRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	graced, empty := newConsumer(t, nil), newConsumer(t, nil)
	gracedEP := b.addEndpoint(endpoints.New{URL: graced.URL(), Scheme: endpoints.SchemeStandard})
	emptyEP := b.addEndpoint(endpoints.New{URL: empty.URL()})
	for _, q := range []string{
		`UPDATE webhook_endpoints SET previous_secret = 'not-base64!', previous_secret_expires_at = now() + interval '1 hour' WHERE id = '` + gracedEP.ID + `'`,
		`UPDATE webhook_endpoints SET secret = '' WHERE id = '` + emptyEP.ID + `'`,
	} {
		if _, err := b.pool.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	cfg, logs := b.observedConfig("", zapcore.WarnLevel)
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	b.start(cfg)

	id := b.enqueue(outbox.Event{})
	b.waitSettled(15 * time.Second)
	got := graced.arrivals()
	if len(got) != 1 {
		t.Fatalf("the endpoint with a refused previous secret got %d requests, want 1", len(got))
	}
	if sigs := strings.Fields(got[0].Header.Get("Webhook-Signature")); len(sigs) != 1 || sigs[0] != standardSignature(t, got[0], gracedEP.Secret) {
		t.Errorf("signatures %q; want the current secret's alone", sigs)
	}
	if n := logs.FilterMessage("endpoint signs with its current secret only").FilterField(zap.String("endpoint_id", gracedEP.ID)).Len(); n != 1 {
		t.Errorf("%d warnings about the previous secret, want 1", n)
	}
	_, _, reason := b.deadLetter(id)
	if want := "endpoint " + emptyEP.ID + " is misconfigured: secret is empty"; !strings.HasPrefix(reason, want) {
		t.Errorf("the endpoint without a secret: dead-lettered with %q, want it to start %q", reason, want)
	}
	if n := empty.received(); n != 0 {
		t.Errorf("the endpoint without a secret got %d requests", n)
	}
}

// standardSignature is the Standard Webhooks signature of a with secret ("whsec_" and base64),
// as a consumer's library computes it.
func standardSignature(t *testing.T, a arrival, secret string) string {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(a.Header.Get("Webhook-Id") + "." + a.Header.Get("Webhook-Timestamp") + "."))
	mac.Write(a.Body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
