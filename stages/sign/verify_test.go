package sign_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/sign"
)

// verifyBundle is a correctly signed request that each case breaks in one way.
type verifyBundle struct {
	header http.Header
	body   []byte
	now    time.Time
	secret []byte
}

func setupVerify(t *testing.T) verifyBundle {
	t.Helper()
	body := []byte(`{"event":"stream.updated"}`)
	return verifyBundle{
		header: http.Header{
			sign.HeaderDeliveryID: {"d-1"},
			sign.HeaderTimestamp:  {"1710000000"},
			sign.HeaderSignature:  {"925006549b879c8d9e91c10a153254fb4b6e2241820a1b072e28aa2fa8caeb79"},
		},
		body:   body,
		now:    time.Unix(1710000000, 0),
		secret: []byte("topsecret"),
	}
}

// signedAt returns headers signed with secret at timestamp ts.
func (b verifyBundle) signedAt(ts int64, secret []byte) http.Header {
	h := b.header.Clone()
	s := strconv.FormatInt(ts, 10)
	h.Set(sign.HeaderTimestamp, s)
	h.Set(sign.HeaderSignature, sign.FluxoraSignature(secret, s, b.body))
	return h
}

func TestVerifyFluxoraAccepts(t *testing.T) {
	t.Parallel()
	b := setupVerify(t)
	for _, tc := range []struct {
		name    string
		header  http.Header
		now     time.Time
		secrets [][]byte
	}{
		{"reference vector", b.header, b.now, [][]byte{b.secret}},
		{"previous secret", b.header, b.now, [][]byte{[]byte("new-secret"), b.secret}},
		{"empty secret skipped", b.header, b.now, [][]byte{nil, b.secret}},
		{"upper-case signature", with(b.header, sign.HeaderSignature, strings.ToUpper(b.header.Get(sign.HeaderSignature))), b.now, [][]byte{b.secret}},
		{"padded signature", with(b.header, sign.HeaderSignature, " \t"+strings.ToUpper(b.header.Get(sign.HeaderSignature))+"  "), b.now, [][]byte{b.secret}},
		{"300 s old", b.signedAt(1710000000-300, b.secret), b.now, [][]byte{b.secret}},
		{"300 s ahead", b.signedAt(1710000000+300, b.secret), b.now, [][]byte{b.secret}},
		// Whole seconds: 300.999 s after the timestamp is still 300 s.
		{"300 s old, sub-second now", b.signedAt(1710000000-300, b.secret), b.now.Add(999 * time.Millisecond), [][]byte{b.secret}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := sign.VerifyFluxora(tc.header, b.body, tc.now, 0, tc.secrets...); err != nil {
				t.Errorf("VerifyFluxora: %v", err)
			}
		})
	}
}

func TestVerifyFluxoraRejects(t *testing.T) {
	t.Parallel()
	b := setupVerify(t)
	for _, tc := range []struct {
		name      string
		header    http.Header
		body      []byte
		now       time.Time
		tolerance time.Duration
		secrets   [][]byte
		want      error
		mentions  string // a substring the message must contain
	}{
		{name: "no secret", header: b.header, want: sign.ErrNoSecret},
		{name: "only empty secrets", header: b.header, secrets: [][]byte{nil, {}}, want: sign.ErrNoSecret},
		{name: "no delivery id", header: without(b.header, sign.HeaderDeliveryID), want: sign.ErrMissingHeader, mentions: "x-fluxora-delivery-id"},
		{name: "no timestamp", header: without(b.header, sign.HeaderTimestamp), want: sign.ErrMissingHeader, mentions: "x-fluxora-timestamp"},
		{name: "no signature", header: without(b.header, sign.HeaderSignature), want: sign.ErrMissingHeader, mentions: "x-fluxora-signature"},
		{name: "blank signature", header: with(b.header, sign.HeaderSignature, "  "), want: sign.ErrMissingHeader, mentions: "x-fluxora-signature"},
		{name: "no headers", header: http.Header{}, want: sign.ErrMissingHeader, mentions: "x-fluxora-delivery-id"},
		// Presence is checked before the timestamp's form, as the original receiver did.
		{name: "bad timestamp and no signature", header: without(with(b.header, sign.HeaderTimestamp, "x"), sign.HeaderSignature), want: sign.ErrMissingHeader, mentions: "x-fluxora-signature"},
		{name: "timestamp not a number", header: with(b.header, sign.HeaderTimestamp, "soon"), want: sign.ErrInvalidTimestamp, mentions: "soon"},
		{name: "timestamp zero", header: with(b.header, sign.HeaderTimestamp, "0"), want: sign.ErrInvalidTimestamp},
		{name: "timestamp negative", header: with(b.header, sign.HeaderTimestamp, "-1710000000"), want: sign.ErrInvalidTimestamp},
		{name: "timestamp with plus", header: with(b.header, sign.HeaderTimestamp, "+1710000000"), want: sign.ErrInvalidTimestamp},
		{name: "timestamp fractional", header: with(b.header, sign.HeaderTimestamp, "1710000000.5"), want: sign.ErrInvalidTimestamp},
		{name: "timestamp in milliseconds overflows", header: with(b.header, sign.HeaderTimestamp, "99999999999999999999"), want: sign.ErrInvalidTimestamp},
		{name: "301 s old", header: b.signedAt(1710000000-301, b.secret), want: sign.ErrTimestampOutOfTolerance, mentions: "301s"},
		{name: "301 s ahead", header: b.signedAt(1710000000+301, b.secret), want: sign.ErrTimestampOutOfTolerance, mentions: "301s"},
		{name: "milliseconds", header: b.signedAt(1710000000_000, b.secret), want: sign.ErrTimestampOutOfTolerance},
		{name: "custom tolerance", header: b.signedAt(1710000000-11, b.secret), tolerance: 10 * time.Second, want: sign.ErrTimestampOutOfTolerance, mentions: "10s"},
		{name: "wrong secret", header: b.header, secrets: [][]byte{[]byte("nope")}, want: sign.ErrSignatureMismatch},
		{name: "body changed", header: b.header, body: []byte(`{"event":"stream.deleted"}`), want: sign.ErrSignatureMismatch},
		{name: "trailing newline added", header: b.header, body: []byte("{\"event\":\"stream.updated\"}\n"), want: sign.ErrSignatureMismatch},
		{name: "timestamp changed", header: with(b.header, sign.HeaderTimestamp, "1710000001"), want: sign.ErrSignatureMismatch},
		{name: "truncated signature", header: with(b.header, sign.HeaderSignature, b.header.Get(sign.HeaderSignature)[:63]), want: sign.ErrSignatureMismatch},
		{name: "prefixed signature", header: with(b.header, sign.HeaderSignature, "sha256="+b.header.Get(sign.HeaderSignature)), want: sign.ErrSignatureMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body, now, secrets := tc.body, tc.now, tc.secrets
			if body == nil {
				body = b.body
			}
			if now.IsZero() {
				now = b.now
			}
			if secrets == nil && tc.want != sign.ErrNoSecret {
				secrets = [][]byte{b.secret}
			}
			err := sign.VerifyFluxora(tc.header, body, now, tc.tolerance, secrets...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("VerifyFluxora = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.mentions) {
				t.Errorf("error %q does not mention %q", err, tc.mentions)
			}
		})
	}
}

func with(h http.Header, key, value string) http.Header {
	c := h.Clone()
	c[key] = []string{value}
	return c
}

func without(h http.Header, key string) http.Header {
	c := h.Clone()
	delete(c, key)
	return c
}

// FuzzVerifyFluxora feeds arbitrary headers, bodies and clocks to the verifier, which faces
// the open internet in a consumer. Beyond not panicking, it must never accept what the
// signature definition rejects, and must always accept a correct signature.
func FuzzVerifyFluxora(f *testing.F) {
	for _, v := range loadVectors(f).Fluxora {
		ts, _ := strconv.ParseInt(v.Timestamp, 10, 64)
		f.Add("d-1", v.Timestamp, v.Signature, []byte(v.Body), []byte(v.Secret), ts)
		f.Add("d-1", v.Timestamp, " "+strings.ToUpper(v.Signature)+" ", []byte(v.Body), []byte(v.Secret), ts+300)
		f.Add("d-1", v.Timestamp, v.Signature, []byte(v.Body+" "), []byte(v.Secret), ts-301)
	}
	f.Add("", "", "", []byte(nil), []byte(nil), int64(0))
	f.Add(" ", "-1", "zz", []byte("{}"), []byte("s"), int64(-1<<63))
	f.Add("x", "9223372036854775807", "00", []byte("{}"), []byte("s"), int64(-1<<63))

	sentinels := []error{sign.ErrNoSecret, sign.ErrMissingHeader, sign.ErrInvalidTimestamp, sign.ErrTimestampOutOfTolerance, sign.ErrSignatureMismatch}
	f.Fuzz(func(t *testing.T, id, ts, sig string, body, secret []byte, nowUnix int64) {
		now := time.Unix(nowUnix, 0)
		h := http.Header{sign.HeaderDeliveryID: {id}, sign.HeaderTimestamp: {ts}, sign.HeaderSignature: {sig}}

		err := sign.VerifyFluxora(h, body, now, 0, secret)
		if err != nil {
			matched := 0
			for _, s := range sentinels {
				if errors.Is(err, s) {
					matched++
				}
			}
			if matched != 1 {
				t.Fatalf("error %q matches %d of the Err values, want exactly one", err, matched)
			}
		} else {
			n, perr := strconv.ParseInt(ts, 10, 64)
			if perr != nil || n <= 0 || ts[0] == '+' {
				t.Fatalf("accepted timestamp %q", ts)
			}
			if d := nowUnix - n; d > 300 || d < -300 {
				t.Fatalf("accepted timestamp %d at now %d", n, nowUnix)
			}
			if len(secret) == 0 || strings.TrimSpace(id) == "" {
				t.Fatalf("accepted with secret %q, id %q", secret, id)
			}
			if strings.ToLower(strings.TrimSpace(sig)) != sign.FluxoraSignature(secret, ts, body) {
				t.Fatalf("accepted signature %q", sig)
			}
		}

		// The correct signature, at a clock equal to the timestamp, must always pass.
		if n, perr := strconv.ParseInt(ts, 10, 64); perr == nil && n > 0 && ts[0] != '+' &&
			len(secret) > 0 && strings.TrimSpace(id) != "" {
			h[sign.HeaderSignature] = []string{sign.FluxoraSignature(secret, ts, body)}
			if err := sign.VerifyFluxora(h, body, time.Unix(n, 0), 0, secret); err != nil {
				t.Fatalf("rejected a correct signature: %v", err)
			}
		}
	})
}
