package sign

import (
	"crypto/hmac"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultTolerance is how far a Fluxora timestamp may be from the verifier's clock, either
// way, inclusive: the original receiver's window, wide enough for clock skew and a slow
// network, narrow enough that a captured request cannot be replayed later.
const DefaultTolerance = 300 * time.Second

// The reasons VerifyFluxora rejects a request. Each is a separate value because a receiver
// answers them differently (the original receiver's, docs/wire-format.md): ErrInvalidTimestamp is a
// malformed request (400), the others are authentication failures (401), and ErrNoSecret is
// the receiver's own misconfiguration. Match them with errors.Is; the returned error's
// message adds the detail (which header, how far off).
var (
	// ErrNoSecret: no non-empty secret was given. An empty key would make every forged
	// signature computable, so it never verifies anything.
	ErrNoSecret = errors.New("sign: no secret configured to verify against")
	// ErrMissingHeader: a required header is absent or blank; the message names it.
	ErrMissingHeader = errors.New("sign: missing header")
	// ErrInvalidTimestamp: the timestamp header is not a positive decimal integer.
	ErrInvalidTimestamp = errors.New("sign: timestamp is not a positive integer")
	// ErrTimestampOutOfTolerance: the timestamp is further from now than the tolerance,
	// the sign of a replay (or of a badly wrong clock on one side).
	ErrTimestampOutOfTolerance = errors.New("sign: timestamp outside tolerance")
	// ErrSignatureMismatch: the signature matches none of the secrets; the body, the
	// timestamp or the secret is not what the sender used.
	ErrSignatureMismatch = errors.New("sign: signature mismatch")
)

// VerifyFluxora is the consumer's check of a Fluxora-signed request, kept next to the signer
// so that the two cannot drift apart. It checks, in the original receiver's order, that a
// secret is configured, that x-fluxora-delivery-id, x-fluxora-timestamp and
// x-fluxora-signature are present, that the timestamp is a positive integer within tolerance
// of now (inclusive, compared in whole seconds; tolerance <= 0 means DefaultTolerance), and
// that the signature, trimmed and lower-cased, equals the HMAC under any one of secrets,
// compared in constant time. Pass the current and the previous secret during a rotation;
// empty secrets are skipped. It returns nil or an error matching one of the Err values above.
//
// It does not limit the body size or remember delivery ids: both need the receiver's state
// and answers (413, 409) and are the receiver's job.
func VerifyFluxora(h http.Header, body []byte, now time.Time, tolerance time.Duration, secrets ...[]byte) error {
	configured := false
	for _, s := range secrets {
		if len(s) > 0 {
			configured = true
			break
		}
	}
	if !configured {
		return ErrNoSecret
	}

	var missing string
	switch {
	case blank(h.Get(HeaderDeliveryID)):
		missing = "x-fluxora-delivery-id"
	case blank(h.Get(HeaderTimestamp)):
		missing = "x-fluxora-timestamp"
	case blank(h.Get(HeaderSignature)):
		missing = "x-fluxora-signature"
	}
	if missing != "" {
		return fmt.Errorf("%w %s", ErrMissingHeader, missing)
	}
	timestamp := h.Get(HeaderTimestamp)

	ts, ok := parsePositive(timestamp)
	if !ok {
		return fmt.Errorf("%w: x-fluxora-timestamp %q", ErrInvalidTimestamp, truncate(timestamp, 32))
	}

	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if diff, tol := distance(now.Unix(), ts), uint64(tolerance/time.Second); diff > tol {
		return fmt.Errorf("%w: x-fluxora-timestamp %d is %ds from now, more than %ds",
			ErrTimestampOutOfTolerance, ts, diff, tol)
	}

	got := []byte(strings.ToLower(strings.TrimSpace(h.Get(HeaderSignature))))
	for _, s := range secrets {
		if len(s) == 0 {
			continue
		}
		if hmac.Equal(got, []byte(FluxoraSignature(s, timestamp, body))) {
			return nil
		}
	}
	return ErrSignatureMismatch
}

// blank reports whether a header value is effectively absent, as the original's falsy check
// treated an empty value.
func blank(v string) bool { return strings.TrimSpace(v) == "" }

// parsePositive accepts only what a signer writes: decimal digits, no sign, no spaces, value
// above zero. strconv.ParseInt alone would also take "+5".
func parsePositive(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// distance is |a - b| without overflow for any a and any positive b.
func distance(a, b int64) uint64 {
	if a >= b {
		return uint64(a - b) // b > 0, so a - b cannot overflow
	}
	return uint64(b) - uint64(a) // modular arithmetic gives the exact value, which is < 2^64
}

// truncate bounds how much of an attacker-chosen header ends up in an error message and logs.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
