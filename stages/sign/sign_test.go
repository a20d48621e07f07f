package sign_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/sign"
)

const (
	// The Standard reference secret and a second key for rotation (from the vectors file).
	standardSecret   = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	standardPrevious = "whsec_Zmx1eGhvb2stcHJldmlvdXMtc2VjcmV0"
)

func newSigner(t testing.TB, cfg sign.Config) *sign.Signer {
	t.Helper()
	s, err := sign.New(cfg)
	if err != nil {
		t.Fatalf("New(%v): %v", cfg, err)
	}
	return s
}

// standardSig computes one "v1,<base64>" entry independently of the signer. It is called
// from worker goroutines, where t.Fatal is not allowed; the secrets are this file's constants.
func standardSig(secret, id, ts string, body []byte) string {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		panic(fmt.Sprintf("test secret %q: %v", secret, err))
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", id, ts, body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

func TestHeaderNamesAreCanonical(t *testing.T) {
	t.Parallel()
	for _, name := range []string{
		sign.HeaderContentType, sign.HeaderUserAgent, sign.HeaderAttempt, sign.HeaderDeliveryID,
		sign.HeaderTimestamp, sign.HeaderEvent, sign.HeaderSignature,
		sign.HeaderWebhookID, sign.HeaderWebhookTimestamp, sign.HeaderWebhookSignature,
	} {
		// Sign assigns these directly as map keys; a non-canonical one would be invisible to
		// http.Header.Get and sent twice by anyone who also calls Set.
		if c := textproto.CanonicalMIMEHeaderKey(name); c != name {
			t.Errorf("%q is not canonical (%q)", name, c)
		}
	}
}

func TestSignFluxoraHeaders(t *testing.T) {
	t.Parallel()
	s := newSigner(t, sign.Config{Secret: "topsecret"})
	payload := []byte(`{"event":"stream.updated"}`)
	orig := bytes.Clone(payload)
	d := &delivery.Delivery{
		ID: 7, DeliveryID: "0b6f7d9e-1c1e-4c55-9d7e-2f3b6a1d0c42", StreamID: "st-1",
		EventType: "stream.updated", Payload: payload, Attempt: 3,
		Header: http.Header{"X-Stale": {"from a previous attempt"}},
	}
	s.Sign(d, time.Unix(1710000000, 999_999_999))

	want := http.Header{
		"Content-Type":          {"application/json"},
		"User-Agent":            {"fluxhook"},
		"X-Fluxora-Attempt":     {"3"},
		"X-Fluxora-Delivery-Id": {"0b6f7d9e-1c1e-4c55-9d7e-2f3b6a1d0c42"},
		"X-Fluxora-Timestamp":   {"1710000000"},
		"X-Fluxora-Event":       {"stream.updated"},
		"X-Fluxora-Signature":   {"925006549b879c8d9e91c10a153254fb4b6e2241820a1b072e28aa2fa8caeb79"},
	}
	assertHeader(t, d.Header, want)
	if !bytes.Equal(d.Payload, orig) {
		t.Errorf("payload changed to %q", d.Payload)
	}
}

func TestSignStandardHeaders(t *testing.T) {
	t.Parallel()
	s := newSigner(t, sign.Config{Secret: standardSecret, Scheme: sign.Standard, UserAgent: "fluxhook/test"})
	payload := []byte(`{"test": 2432232314}`)
	orig := bytes.Clone(payload)
	d := &delivery.Delivery{DeliveryID: "msg_p5jXN8AQM9LWM0D4loKWxJek", EventType: "test.event", Payload: payload, Attempt: 1}
	s.Sign(d, time.Unix(1614265330, 0))

	want := http.Header{
		"Content-Type":      {"application/json"},
		"User-Agent":        {"fluxhook/test"},
		"X-Fluxora-Attempt": {"1"},
		"X-Fluxora-Event":   {"test.event"},
		"Webhook-Id":        {"msg_p5jXN8AQM9LWM0D4loKWxJek"},
		"Webhook-Timestamp": {"1614265330"},
		"Webhook-Signature": {"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
	}
	assertHeader(t, d.Header, want)
	if !bytes.Equal(d.Payload, orig) {
		t.Errorf("payload changed to %q", d.Payload)
	}
}

func assertHeader(t *testing.T, got, want http.Header) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok || !slices.Equal(g, w) {
			t.Errorf("header %s = %q, want %q", k, g, w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected header %s = %q", k, g)
		}
	}
}

// TestSignHeadersIndependent checks that the shared backing array behind the header values
// does not let one header's Add overwrite another's value, and that two deliveries share
// nothing.
func TestSignHeadersIndependent(t *testing.T) {
	t.Parallel()
	s := newSigner(t, sign.Config{Secret: "topsecret"})
	a := &delivery.Delivery{DeliveryID: "a", EventType: "e", Payload: []byte(`{}`), Attempt: 1}
	b := &delivery.Delivery{DeliveryID: "b", EventType: "e", Payload: []byte(`{}`), Attempt: 1}
	now := time.Unix(1710000000, 0)
	s.Sign(a, now)
	s.Sign(b, now)
	before := b.Header.Clone()

	for k := range a.Header {
		a.Header.Add(k, "extra")
	}
	for k, v := range a.Header {
		if len(v) != 2 || v[1] != "extra" || v[0] == "extra" {
			t.Errorf("after Add, %s = %q", k, v)
		}
	}
	assertHeader(t, b.Header, before)
}

func TestSignDefaults(t *testing.T) {
	t.Parallel()
	s := newSigner(t, sign.Config{Secret: "s"})
	d := &delivery.Delivery{DeliveryID: "x", EventType: "e", Payload: []byte(`{}`), Attempt: 1}
	s.Sign(d, time.Unix(1710000000, 0))
	if got := d.Header.Get("User-Agent"); got != sign.DefaultUserAgent {
		t.Errorf("User-Agent = %q, want %q", got, sign.DefaultUserAgent)
	}
	if got := d.Header.Get("x-fluxora-signature"); got != "dc505f7c9b093137f0cefdcac425ed49f2ae97ee574217feb261c05855a6e876" {
		t.Errorf("zero Scheme did not sign as Fluxora: x-fluxora-signature = %q", got)
	}
}

func TestSignLargeValues(t *testing.T) {
	t.Parallel()
	// A delivery id larger than the pooled scratch buffer, a large attempt and a large body.
	id := strings.Repeat("i", 10_000)
	body := bytes.Repeat([]byte("b"), 1<<20)
	for _, scheme := range []sign.Scheme{sign.Fluxora, sign.Standard} {
		s := newSigner(t, sign.Config{Secret: standardSecret, PreviousSecret: standardPrevious, Scheme: scheme})
		for range 3 {
			d := &delivery.Delivery{DeliveryID: id, EventType: "e", Payload: body, Attempt: 123456}
			s.Sign(d, time.Unix(1710000000, 0))
			if got := d.Header.Get(sign.HeaderAttempt); got != "123456" {
				t.Errorf("%s: attempt = %q", scheme, got)
			}
			if scheme == sign.Fluxora {
				if got, want := d.Header.Get(sign.HeaderSignature), sign.FluxoraSignature([]byte(standardSecret), "1710000000", body); got != want {
					t.Errorf("fluxora signature = %s, want %s", got, want)
				}
				continue
			}
			want := standardSig(standardSecret, id, "1710000000", body) + " " + standardSig(standardPrevious, id, "1710000000", body)
			if got := d.Header.Get(sign.HeaderWebhookSignature); got != want {
				t.Errorf("standard signature = %s, want %s", got, want)
			}
		}
	}
}

// TestSignConcurrent signs from many goroutines at once through one Signer, as the send stage
// does; run with -race. Each result is checked against an independent computation, so a pooled
// hash shared by two goroutines or a state not reset between uses shows up as a wrong value.
func TestSignConcurrent(t *testing.T) {
	t.Parallel()
	for _, cfg := range []sign.Config{
		{Secret: "topsecret", PreviousSecret: "old"},
		{Secret: standardSecret, Scheme: sign.Standard},
		{Secret: standardSecret, PreviousSecret: standardPrevious, Scheme: sign.Standard},
	} {
		name := string(cfg.Scheme)
		if cfg.PreviousSecret != "" {
			name += "+previous"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSigner(t, cfg)
			const workers, each = 32, 200
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Go(func() {
					for i := range each {
						id := fmt.Sprintf("d-%d-%d", w, i)
						body := []byte(fmt.Sprintf(`{"worker":%d,"i":%d,"pad":%q}`, w, i, strings.Repeat("x", i)))
						now := time.Unix(1710000000+int64(w*each+i), 0)
						d := &delivery.Delivery{DeliveryID: id, EventType: "e", Payload: body, Attempt: i + 1}
						s.Sign(d, now)
						if err := checkSigned(cfg, d, now); err != nil {
							errs <- fmt.Errorf("worker %d, delivery %d: %w", w, i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

func checkSigned(cfg sign.Config, d *delivery.Delivery, now time.Time) error {
	ts := strconv.FormatInt(now.Unix(), 10)
	if got := d.Header.Get(sign.HeaderAttempt); got != strconv.Itoa(d.Attempt) {
		return fmt.Errorf("attempt = %q, want %d", got, d.Attempt)
	}
	if cfg.Scheme == sign.Standard {
		want := standardSig(cfg.Secret, d.DeliveryID, ts, d.Payload)
		if cfg.PreviousSecret != "" {
			want += " " + standardSig(cfg.PreviousSecret, d.DeliveryID, ts, d.Payload)
		}
		if got := d.Header.Get(sign.HeaderWebhookSignature); got != want {
			return fmt.Errorf("webhook-signature = %q, want %q", got, want)
		}
		if got := d.Header.Get(sign.HeaderWebhookTimestamp); got != ts {
			return fmt.Errorf("webhook-timestamp = %q, want %q", got, ts)
		}
		return nil
	}
	if got, want := d.Header.Get(sign.HeaderSignature), sign.FluxoraSignature([]byte(cfg.Secret), ts, d.Payload); got != want {
		return fmt.Errorf("x-fluxora-signature = %q, want %q", got, want)
	}
	if got := d.Header.Get(sign.HeaderTimestamp); got != ts {
		return fmt.Errorf("x-fluxora-timestamp = %q, want %q", got, ts)
	}
	return nil
}

func TestRotation(t *testing.T) {
	t.Parallel()
	body := []byte(`{"event":"stream.updated"}`)
	now := time.Unix(1710000000, 0)

	t.Run("standard sends both", func(t *testing.T) {
		t.Parallel()
		s := newSigner(t, sign.Config{Secret: standardSecret, PreviousSecret: standardPrevious, Scheme: sign.Standard})
		d := &delivery.Delivery{DeliveryID: "msg_1", EventType: "e", Payload: body, Attempt: 1}
		s.Sign(d, now)
		sigs := strings.Split(d.Header.Get(sign.HeaderWebhookSignature), " ")
		want := []string{
			standardSig(standardSecret, "msg_1", "1710000000", body),
			standardSig(standardPrevious, "msg_1", "1710000000", body),
		}
		if !slices.Equal(sigs, want) {
			t.Errorf("webhook-signature entries = %q, want current then previous %q", sigs, want)
		}
	})

	t.Run("standard same key once", func(t *testing.T) {
		t.Parallel()
		s := newSigner(t, sign.Config{Secret: standardSecret, PreviousSecret: standardSecret, Scheme: sign.Standard})
		d := &delivery.Delivery{DeliveryID: "msg_1", EventType: "e", Payload: body, Attempt: 1}
		s.Sign(d, now)
		if got, want := d.Header.Get(sign.HeaderWebhookSignature), standardSig(standardSecret, "msg_1", "1710000000", body); got != want {
			t.Errorf("webhook-signature = %q, want a single %q", got, want)
		}
	})

	t.Run("fluxora signs with current", func(t *testing.T) {
		t.Parallel()
		s := newSigner(t, sign.Config{Secret: "new-secret", PreviousSecret: "old-secret"})
		d := &delivery.Delivery{DeliveryID: "d", EventType: "e", Payload: body, Attempt: 1}
		s.Sign(d, now)
		if got, want := d.Header.Get(sign.HeaderSignature), sign.FluxoraSignature([]byte("new-secret"), "1710000000", body); got != want {
			t.Errorf("x-fluxora-signature = %s, want the current secret's %s", got, want)
		}
		// A consumer that already has the new secret accepts; one still on only the old does not.
		if err := sign.VerifyFluxora(d.Header, body, now, 0, []byte("new-secret")); err != nil {
			t.Errorf("verify with current: %v", err)
		}
		if err := sign.VerifyFluxora(d.Header, body, now, 0, []byte("old-secret")); err == nil {
			t.Error("verify with only the previous secret succeeded")
		}
	})
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   sign.Config
		names string // the variable the error must name
	}{
		{"empty secret", sign.Config{}, "WEBHOOK_SECRET"},
		{"empty secret standard", sign.Config{Scheme: sign.Standard, PreviousSecret: standardPrevious}, "WEBHOOK_SECRET"},
		{"standard secret not base64", sign.Config{Secret: "whsec_not base64!", Scheme: sign.Standard}, "WEBHOOK_SECRET"},
		{"standard raw secret", sign.Config{Secret: "topsecret", Scheme: sign.Standard}, "WEBHOOK_SECRET"},
		{"standard empty key", sign.Config{Secret: "whsec_", Scheme: sign.Standard}, "WEBHOOK_SECRET"},
		{"standard previous not base64", sign.Config{Secret: standardSecret, PreviousSecret: "whsec_%%%%", Scheme: sign.Standard}, "WEBHOOK_SECRET_PREVIOUS"},
		{"unknown scheme", sign.Config{Secret: "s", Scheme: "Fluxora"}, "WEBHOOK_SIGNATURE_SCHEME"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := sign.New(tc.cfg)
			if err == nil {
				t.Fatalf("New(%v) = %v, want an error", tc.cfg, s)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.names+" ") && !strings.Contains(msg, tc.names+":") {
				t.Errorf("error %q does not name %s", msg, tc.names)
			}
			for _, secret := range []string{tc.cfg.Secret, tc.cfg.PreviousSecret} {
				if len(secret) > len("whsec_") && strings.Contains(msg, secret) {
					t.Errorf("error %q leaks a secret", msg)
				}
			}
		})
	}

	// A Fluxora previous secret is never decoded, so any bytes are fine.
	if _, err := sign.New(sign.Config{Secret: "s", PreviousSecret: "not base64!"}); err != nil {
		t.Errorf("Fluxora with a raw previous secret: %v", err)
	}
}

func TestConfigRedactsSecrets(t *testing.T) {
	t.Parallel()
	cfg := sign.Config{Secret: "current-secret-value", PreviousSecret: "previous-secret-value", Scheme: sign.Standard}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		out := fmt.Sprintf(verb, cfg)
		if strings.Contains(out, "secret-value") {
			t.Errorf("%s prints a secret: %s", verb, out)
		}
		if !strings.Contains(out, "standard") {
			t.Errorf("%s hides the non-secret fields: %s", verb, out)
		}
	}
}

// TestSignAllocations guards the performance budget: no per-request key setup, and only the
// header map, its value array and one string per request. Keying an HMAC alone costs more
// allocations than this bound, so a regression to per-request keys fails here.
func TestSignAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	// Not parallel: AllocsPerRun counts the whole process's allocations, and refuses to run
	// in a parallel test.
	for _, cfg := range []sign.Config{
		{Secret: "topsecret"},
		{Secret: standardSecret, PreviousSecret: standardPrevious, Scheme: sign.Standard},
	} {
		s := newSigner(t, cfg)
		d := &delivery.Delivery{DeliveryID: "0b6f7d9e-1c1e-4c55-9d7e-2f3b6a1d0c42", EventType: "e", Payload: []byte(`{}`), Attempt: 1}
		now := time.Unix(1710000000, 0)
		s.Sign(d, now) // warm the pools
		if n := testing.AllocsPerRun(1000, func() { s.Sign(d, now) }); n > 4 {
			t.Errorf("%s: Sign allocates %.1f times per call, want at most 4", cfg.Scheme, n)
		}
	}
}
