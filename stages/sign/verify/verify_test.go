package verify_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/sign"
	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// TestVectors checks every Fluxora vector of testdata/signatures.json: accepted under its
// secret as the current one and, during its grace window, as a previous one; refused when one
// byte of the signature, body or timestamp differs.
func TestVectors(t *testing.T) {
	t.Parallel()
	for _, vec := range loadVectors(t) {
		t.Run(vec.Name, func(t *testing.T) {
			t.Parallel()
			ts, err := strconv.ParseInt(vec.Timestamp, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(ts, 0)
			h := http.Header{
				sign.HeaderDeliveryID: {"d-" + vec.Name},
				sign.HeaderTimestamp:  {vec.Timestamp},
				sign.HeaderSignature:  {vec.Signature},
			}
			body := []byte(vec.Body)

			current := &verify.Verifier{Secret: vec.Secret}
			if vec.PreviousSecret != "" {
				current.Previous = []verify.Previous{{Secret: vec.PreviousSecret, Until: now.Add(time.Hour)}}
			}
			d, err := current.Verify(h, body, now)
			if err != nil {
				t.Fatalf("as the current secret: %v", err)
			}
			if d.Secret != 0 || d.ID != "d-"+vec.Name || !d.Timestamp.Equal(now) || string(d.Body) != vec.Body {
				t.Errorf("Delivery = %+v", d)
			}

			previous := &verify.Verifier{Secret: "rotated-in", Previous: []verify.Previous{{Secret: vec.Secret, Until: now.Add(time.Second)}}}
			if d, err := previous.Verify(h, body, now); err != nil || d.Secret != 1 {
				t.Errorf("as a previous secret: Secret %d, %v; want 1, nil", d.Secret, err)
			}

			for name, tamper := range map[string]func() (http.Header, []byte){
				"signature": func() (http.Header, []byte) {
					c := h.Clone()
					flipped := "0"
					if strings.HasSuffix(vec.Signature, "0") {
						flipped = "1"
					}
					c.Set(sign.HeaderSignature, vec.Signature[:len(vec.Signature)-1]+flipped)
					return c, body
				},
				"body": func() (http.Header, []byte) { return h, append([]byte(vec.Body), ' ') },
				"timestamp": func() (http.Header, []byte) {
					c := h.Clone()
					c.Set(sign.HeaderTimestamp, strconv.FormatInt(ts+1, 10))
					return c, body
				},
			} {
				th, tb := tamper()
				if _, err := current.Verify(th, tb, now); !errors.Is(err, verify.ErrSignatureMismatch) || verify.StatusOf(err) != 401 {
					t.Errorf("%s changed: %v (status %d), want a 401 signature mismatch", name, err, verify.StatusOf(err))
				}
			}
		})
	}
}

// TestCheckOrder sends requests that fail several checks at once: the answer must be the
// first failing check's, in the original receiver's order (docs/wire-format.md), with its status, through the function API
// and through the middleware alike.
func TestCheckOrder(t *testing.T) {
	t.Parallel()
	const tol = 300
	big := strings.Repeat("x", verify.DefaultMaxBody+1)
	exact := `"` + strings.Repeat("x", verify.DefaultMaxBody-2) + `"`
	withTS := func(ts string) func(request) request {
		return func(r request) request { r.ts, r.sig = ts, "bad"; return r }
	}
	keep := func(r request) request { return r }
	// acknowledge makes the vector's id already received; claim makes it in progress.
	acknowledge := func(v *verify.Verifier) {
		_ = v.Claim(context.Background(), "d-1")
		_ = v.Settle(context.Background(), "d-1", true)
	}
	claim := func(v *verify.Verifier) { _ = v.Claim(context.Background(), "d-1") }

	for _, tc := range []struct {
		name     string
		config   func(*verify.Verifier) // changes to a Verifier with the vector's secret
		prior    func(*verify.Verifier) // state before the request
		edit     func(request) request
		status   int
		want     error  // for rejections
		mentions string // in the error and the answer's body
	}{
		// 1. secret configured
		{
			name: "no secret, before everything", config: func(v *verify.Verifier) { v.Secret = "" },
			edit:   func(r request) request { r.id, r.ts, r.sig, r.body = "", "x", "", big; return r },
			status: 500, want: verify.ErrNoSecret, mentions: "secret",
		},
		{
			name: "only an expired previous secret",
			config: func(v *verify.Verifier) {
				v.Secret, v.Previous = "", []verify.Previous{{Secret: vecSecret, Until: vecTime}}
			},
			edit: keep, status: 500, want: verify.ErrNoSecret,
		},
		// 2. headers present, in order
		{
			name: "delivery id missing first", edit: func(r request) request { r.id, r.ts, r.sig, r.body = "", "", "", big; return r },
			status: 401, want: verify.ErrMissingHeader, mentions: "x-fluxora-delivery-id",
		},
		{
			name: "timestamp missing", edit: func(r request) request { r.ts, r.sig, r.body = "", "", big; return r },
			status: 401, want: verify.ErrMissingHeader, mentions: "x-fluxora-timestamp",
		},
		{
			name: "signature missing", edit: func(r request) request { r.sig, r.ts, r.body = "", "abc", big; return r },
			status: 401, want: verify.ErrMissingHeader, mentions: "x-fluxora-signature",
		},
		{
			name: "blank signature is missing", edit: func(r request) request { r.sig, r.ts = " \t", "abc"; return r },
			status: 401, want: verify.ErrMissingHeader, mentions: "x-fluxora-signature",
		},
		// 3. body size
		{
			name: "body too large, before timestamp syntax", edit: func(r request) request { r.ts, r.sig, r.body = "abc", "bad", big; return r },
			status: 413, want: verify.ErrBodyTooLarge, mentions: "262144 bytes",
		},
		{
			name: "body over a custom limit", config: func(v *verify.Verifier) { v.MaxBody = 10 },
			edit:   func(r request) request { r.ts, r.body = "abc", "12345678901"; return r },
			status: 413, want: verify.ErrBodyTooLarge, mentions: "10 bytes",
		},
		{
			name: "body of exactly the limit", status: 204,
			edit: func(r request) request { r.body = exact; return r.signed(vecSecret, vecTS) },
		},
		// 4. timestamp syntax
		{name: "timestamp not a number", edit: withTS("abc"), status: 400, want: verify.ErrInvalidTimestamp, mentions: "abc"},
		{name: "timestamp negative", edit: withTS("-1710000000"), status: 400, want: verify.ErrInvalidTimestamp},
		{name: "timestamp zero", edit: withTS("0"), status: 400, want: verify.ErrInvalidTimestamp},
		{name: "timestamp with plus sign", edit: withTS("+1710000000"), status: 400, want: verify.ErrInvalidTimestamp},
		{name: "timestamp with a space", edit: withTS(" 1710000000"), status: 400, want: verify.ErrInvalidTimestamp},
		{name: "timestamp fractional", edit: withTS("1710000000.5"), status: 400, want: verify.ErrInvalidTimestamp},
		{name: "timestamp overflows", edit: withTS("99999999999999999999"), status: 400, want: verify.ErrInvalidTimestamp},
		// 5. tolerance, inclusive
		{name: "timestamp too old, before signature", edit: withTS(strconv.Itoa(vecTS - tol - 1)), status: 401, want: verify.ErrTimestampOutOfTolerance, mentions: "301s"},
		{name: "timestamp too new, before signature", edit: withTS(strconv.Itoa(vecTS + tol + 1)), status: 401, want: verify.ErrTimestampOutOfTolerance},
		{name: "timestamp far in the future", edit: withTS("9223372036854775807"), status: 401, want: verify.ErrTimestampOutOfTolerance},
		{name: "timestamp in milliseconds", edit: withTS("1710000000000"), status: 401, want: verify.ErrTimestampOutOfTolerance},
		{name: "exactly tolerance old", edit: func(r request) request { return r.signed(vecSecret, vecTS-tol) }, status: 204},
		{name: "exactly tolerance ahead", edit: func(r request) request { return r.signed(vecSecret, vecTS+tol) }, status: 204},
		{
			name: "custom tolerance", config: func(v *verify.Verifier) { v.Tolerance = 10 * time.Second },
			edit: func(r request) request { return r.signed(vecSecret, vecTS-11) }, status: 401, want: verify.ErrTimestampOutOfTolerance, mentions: "10s",
		},
		// 6. signature
		{name: "signature wrong", edit: func(r request) request { r.sig = strings.Repeat("0", 64); return r }, status: 401, want: verify.ErrSignatureMismatch},
		{name: "signed with another secret", edit: func(r request) request { return r.signed("other", vecTS) }, status: 401, want: verify.ErrSignatureMismatch},
		{name: "signature of another timestamp", edit: func(r request) request { r.sig = r.signed(vecSecret, vecTS-1).sig; return r }, status: 401, want: verify.ErrSignatureMismatch},
		{name: "trailing newline added to the body", edit: func(r request) request { r.body += "\n"; return r }, status: 401, want: verify.ErrSignatureMismatch},
		{name: "prefixed signature", edit: func(r request) request { r.sig = "sha256=" + r.sig; return r }, status: 401, want: verify.ErrSignatureMismatch},
		{name: "upper case with spaces", edit: func(r request) request { r.sig = "  " + strings.ToUpper(vecSig) + "\t"; return r }, status: 204},
		{
			name: "previous secret in its window", config: func(v *verify.Verifier) {
				v.Secret, v.Previous = "new", []verify.Previous{{Secret: vecSecret, Until: vecTime.Add(time.Second)}}
			},
			edit: keep, status: 204,
		},
		{
			name: "previous secret past its window", config: func(v *verify.Verifier) {
				v.Secret, v.Previous = "new", []verify.Previous{{Secret: vecSecret, Until: vecTime}}
			},
			edit: keep, status: 401, want: verify.ErrSignatureMismatch,
		},
		// 7. duplicates, last
		{name: "id already acknowledged", prior: acknowledge, edit: keep, status: 409, want: verify.ErrDuplicate, mentions: `"d-1"`},
		{name: "id being handled", prior: claim, edit: keep, status: 409, want: verify.ErrInProgress, mentions: "still being handled"},
		{
			name: "bad signature on an acknowledged id is still 401", prior: acknowledge,
			edit: func(r request) request { r.sig = strings.Repeat("0", 64); return r }, status: 401, want: verify.ErrSignatureMismatch,
		},
		{
			name: "store down", config: func(v *verify.Verifier) { v.Store = failingStore{claim: errBackend} },
			edit: keep, status: 503, want: verify.ErrStore, mentions: errBackend.Error(),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			newVerifier := func() *verify.Verifier {
				v := &verify.Verifier{Secret: vecSecret, Now: fixedClock(vecTime)}
				if tc.config != nil {
					tc.config(v)
				}
				if tc.prior != nil {
					tc.prior(v)
				}
				return v
			}
			r := tc.edit(validRequest())

			got := viaFunctions(newVerifier(), r)
			if got.status != tc.status {
				t.Fatalf("function API: status %d (%v), want %d", got.status, got.err, tc.status)
			}
			if tc.want != nil {
				if !errors.Is(got.err, tc.want) || !strings.Contains(got.err.Error(), tc.mentions) {
					t.Errorf("function API: error %q, want %v mentioning %q", got.err, tc.want, tc.mentions)
				}
				if e, ok := errors.AsType[*verify.Error](got.err); !ok || e.Status != tc.status {
					t.Errorf("function API: error %#v is not an *Error with status %d", got.err, tc.status)
				}
			}

			got = viaMiddleware(t, newVerifier(), r)
			if got.status != tc.status {
				t.Fatalf("middleware: status %d (%q), want %d", got.status, got.body, tc.status)
			}
			if tc.want != nil && (!strings.Contains(got.body, tc.want.Error()) || !strings.Contains(got.body, tc.mentions)) {
				t.Errorf("middleware: answer %q, want it to say %q and %q", got.body, tc.want, tc.mentions)
			}
		})
	}
}

// TestPreviousSecretGraceWindow follows a rotation: the old secret verifies until its Until,
// on the verifier's clock, and not from then on, while the new one keeps working.
func TestPreviousSecretGraceWindow(t *testing.T) {
	t.Parallel()
	until := vecTime.Add(time.Hour)
	at := func(now time.Time, secret string) (verify.Delivery, error) {
		v := &verify.Verifier{
			Secret:   "new-secret",
			Previous: []verify.Previous{{Secret: "expired", Until: vecTime}, {Secret: vecSecret, Until: until}},
		}
		r := validRequest().signed(secret, now.Unix())
		return v.Verify(r.header(), []byte(r.body), now)
	}

	for _, tc := range []struct {
		name   string
		now    time.Time
		secret string
		index  int   // Delivery.Secret when accepted
		want   error // nil: accepted
	}{
		{"old secret at the start of the window", vecTime, vecSecret, 2, nil},
		{"old secret just before Until", until.Add(-time.Nanosecond), vecSecret, 2, nil},
		{"old secret at Until", until, vecSecret, 0, verify.ErrSignatureMismatch},
		{"old secret after Until", until.Add(24 * time.Hour), vecSecret, 0, verify.ErrSignatureMismatch},
		{"new secret during the window", vecTime, "new-secret", 0, nil},
		{"new secret after the window", until.Add(time.Hour), "new-secret", 0, nil},
		{"a secret whose window had already ended", vecTime, "expired", 0, verify.ErrSignatureMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, err := at(tc.now, tc.secret)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
			if err == nil && d.Secret != tc.index {
				t.Errorf("Delivery.Secret = %d, want %d", d.Secret, tc.index)
			}
		})
	}
}

func TestDeliveryFields(t *testing.T) {
	t.Parallel()
	v := &verify.Verifier{Secret: vecSecret}
	r := validRequest()
	r.attempt = "3"
	d, err := v.Verify(r.header(), []byte(r.body), vecTime)
	if err != nil {
		t.Fatal(err)
	}
	want := verify.Delivery{ID: "d-1", Event: "stream.updated", Timestamp: vecTime, Attempt: 3, Secret: 0, Body: []byte(vecBody)}
	if d.ID != want.ID || d.Event != want.Event || !d.Timestamp.Equal(want.Timestamp) || d.Attempt != want.Attempt ||
		d.Secret != want.Secret || string(d.Body) != string(want.Body) {
		t.Errorf("Delivery = %+v, want %+v", d, want)
	}

	r.attempt = "first" // unsigned and informative only: never a reason to reject
	if d, err := v.Verify(r.header(), []byte(r.body), vecTime); err != nil || d.Attempt != 0 {
		t.Errorf("non-numeric attempt: Attempt %d, %v; want 0, nil", d.Attempt, err)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	good := verify.Verifier{Secret: "s", Previous: []verify.Previous{{Secret: "old", Until: vecTime}}}
	if err := good.Validate(); err != nil {
		t.Errorf("Validate() = %v for a good configuration", err)
	}
	bad := verify.Verifier{
		Previous:  []verify.Previous{{Secret: "old"}, {Until: vecTime}},
		Tolerance: -time.Second,
		MaxBody:   -1,
	}
	err := bad.Validate()
	for _, field := range []string{"Secret is empty", "Previous[0].Until", "Previous[1].Secret", "Tolerance", "MaxBody"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate() = %v, want it to name %s", err, field)
		}
	}
}

func TestStatusOf(t *testing.T) {
	t.Parallel()
	if got := verify.StatusOf(errors.New("plain")); got != 500 {
		t.Errorf("StatusOf(plain error) = %d, want 500", got)
	}
	wrapped := fmt.Errorf("handling: %w", &verify.Error{Status: 413, Err: verify.ErrBodyTooLarge})
	if got := verify.StatusOf(wrapped); got != 413 {
		t.Errorf("StatusOf(wrapped *Error) = %d, want 413", got)
	}
}
