package endpoints

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/fluxora/fluxhook/stages/send"
)

// ErrInvalid is wrapped by every validation error of Add, Update, RotateSecret and Remove, so
// that a caller can tell a bad value (fix the input, do not retry) from a database error.
var ErrInvalid = errors.New("invalid endpoint")

// InvalidError is a value rejected before anything was written. Field names the offending
// field in webhook_endpoints' terms ("url", "event_types", "secret", ...), so that the CLI
// can name its own flag for it; Err says what is wrong and what to do.
type InvalidError struct {
	Field string
	Err   error
}

// Error names the field first, so that the message says what to fix before why.
func (e *InvalidError) Error() string { return e.Field + ": " + e.Err.Error() }

// Unwrap returns the reason, for errors.Is on send.ErrInvalidURL and the like.
func (e *InvalidError) Unwrap() error { return e.Err }

// Is makes every InvalidError match ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Err: fmt.Errorf(format, args...)}
}

// The bounds of an endpoint's free-form fields, in bytes unless said otherwise. Every list
// and every audit entry holds whole endpoints: unbounded, one tenant's key could make each
// page of GET /v1/endpoints or /v1/audit hundreds of megabytes, built in memory by the API
// process (the dispatcher's, under fluxhook serve). Each bound is far above what a consumer
// needs (a browser's URL limit, a few auth headers, a filter of tens of types).
const (
	MaxURL            = 2048
	MaxDescription    = 1024
	MaxTenant         = 200
	MaxHeaders        = 32   // headers per endpoint
	MaxHeaderBytes    = 8192 // every custom header's name and value together
	MaxEventTypes     = 100  // entries of the filter
	MaxEventType      = 200  // one entry
	MaxDisabledReason = 1024
)

// MaxTenantEndpoints is how many endpoints a tenant's own callers (its API keys, its portal
// sessions) may make: New.TenantQuota. An operator (an admin key, the CLI) is not held to it,
// and may give a tenant more.
const MaxTenantEndpoints = 100

// QuotaError is Add's refusal of an endpoint past its tenant's quota (New.TenantQuota).
type QuotaError struct {
	Tenant string
	Limit  int
}

// Error says what the limit is and what to do.
func (e *QuotaError) Error() string {
	return fmt.Sprintf("tenant %q has %d endpoints, its limit: remove one first, or ask the operator", e.Tenant, e.Limit)
}

// validText refuses what PostgreSQL cannot store in text (a NUL byte, invalid UTF-8) and, with
// controls, every control character but tab, line feed and carriage return: the store's last
// guard, whoever the caller is, so that such a value is a field's error and not a failed
// statement.
func validText(field, v string, controls bool) error {
	switch {
	case !utf8.ValidString(v):
		return invalid(field, "is not valid UTF-8")
	case strings.ContainsRune(v, 0):
		return invalid(field, "contains a NUL byte")
	case controls && strings.ContainsFunc(v, func(r rune) bool { return r < ' ' && r != '\t' && r != '\n' && r != '\r' || r == 0x7f }):
		return invalid(field, "contains a control character")
	}
	return nil
}

// validateDescription bounds the free text for people.
func validateDescription(d string) error {
	if len(d) > MaxDescription {
		return invalid("description", "%d bytes; at most %d", len(d), MaxDescription)
	}
	return validText("description", d, true)
}

// Generated secret sizes. Standard Webhooks asks for 24 to 64 random bytes; 24 is its
// reference libraries' choice. A Fluxora secret is used as the HMAC-SHA256 key byte for byte,
// so it gets 32 random bytes, the digest size: more adds no strength to the MAC.
const (
	standardSecretBytes = 24
	fluxoraSecretBytes  = 32
	standardPrefix      = "whsec_"
)

// GenerateSecret returns a new random secret in the form scheme's consumers expect: for
// "standard", "whsec_" followed by the standard base64 of 24 random bytes, which every
// Standard Webhooks library accepts as is; for "fluxora" (or ""), 32 random bytes in lower-case
// hex (64 characters). Hex rather than base64 for Fluxora because its consumers use the
// secret's characters themselves as the HMAC key: hex survives shells, env files, YAML and
// copy-paste without quoting or a character that some tool treats specially (+, /, =).
func GenerateSecret(scheme string) (string, error) {
	switch scheme {
	case SchemeStandard:
		return standardPrefix + base64.StdEncoding.EncodeToString(randomBytes(standardSecretBytes)), nil
	case SchemeFluxora, "":
		return hex.EncodeToString(randomBytes(fluxoraSecretBytes)), nil
	}
	return "", validateScheme(scheme)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	// crypto/rand.Read never fails on supported platforms (it panics if it cannot read).
	_, _ = rand.Read(b)
	return b
}

// ValidateSecret reports whether secret can sign for scheme. A Standard secret must be
// "whsec_" followed by standard padded base64 of a non-empty key, the only form its consumers'
// libraries decode the same way we do. A Fluxora secret is any non-empty text without control
// characters or surrounding spaces (almost always a copy-paste accident). Neither may start
// with "enc:v1:" or "enc:v2:": stored in clear, it would be mistaken for a sealed secret. The
// error never repeats the secret.
func ValidateSecret(scheme, secret string) error {
	if err := validateScheme(scheme); err != nil {
		return err
	}
	switch {
	case secret == "":
		return invalid("secret", "empty; leave it unset to have one generated")
	case IsSealed(secret):
		return invalid("secret", "starts with %q, which marks an encrypted secret; give the secret itself", secret[:len(sealedPrefix)])
	case strings.TrimSpace(secret) != secret:
		return invalid("secret", "has leading or trailing spaces; remove them")
	case strings.ContainsFunc(secret, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return invalid("secret", "contains a control character")
	}
	if scheme == SchemeStandard {
		b64, ok := strings.CutPrefix(secret, standardPrefix)
		if !ok {
			return invalid("secret", "a standard secret is %q followed by base64; leave it unset to have one generated", standardPrefix)
		}
		key, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			// The decoder's message gives an offset, never secret material.
			return invalid("secret", "the part after %q is not base64 (standard alphabet, padded): %v", standardPrefix, err)
		}
		if len(key) == 0 {
			return invalid("secret", "the key after %q is empty", standardPrefix)
		}
	}
	return nil
}

func validateScheme(scheme string) error {
	if scheme != SchemeFluxora && scheme != SchemeStandard {
		return invalid("scheme", "%q is not a signature scheme; use %q or %q", scheme, SchemeFluxora, SchemeStandard)
	}
	return nil
}

// validateOrdering and validateOrderingFailure refuse a value the table's CHECK would refuse,
// before anything is written, with the allowed values: the CHECK is the backstop for SQL
// written by hand, and its violation names a constraint rather than what to type instead.
func validateOrdering(ordering string) error {
	if ordering != OrderingNone && ordering != OrderingStream {
		return invalid("ordering", "%q is not an ordering; use %q (no order between events) or %q (each stream's events in order)",
			ordering, OrderingNone, OrderingStream)
	}
	return nil
}

func validateOrderingFailure(failure string) error {
	if failure != OrderingFailureSkip && failure != OrderingFailureStop {
		return invalid("ordering_failure", "%q is not what an ordered stream does at a dead letter; use %q (go on without the event) or %q (wait until it is replayed or purged)",
			failure, OrderingFailureSkip, OrderingFailureStop)
	}
	return nil
}

// validateURL applies the dispatcher's own rules (send.ValidateURL): http(s), https unless the
// host is loopback, no credentials. The network policy (WEBHOOK_ALLOWED_NETWORKS) is the
// dispatcher's and is applied when it sends.
func validateURL(u string) error {
	if len(u) > MaxURL {
		return &InvalidError{Field: "url", Err: fmt.Errorf("%w: %d bytes; at most %d", send.ErrInvalidURL, len(u), MaxURL)}
	}
	if err := send.ValidateURL(u); err != nil {
		return &InvalidError{Field: "url", Err: err}
	}
	return nil
}

func validateFilter(filter []string) error {
	if err := ValidateFilter(filter); err != nil {
		return &InvalidError{Field: "event_types", Err: err}
	}
	return nil
}

// validateHeaders is ValidateHeaders plus a check that no two names differ only in case
// (sameNames), and the bounds, MaxHeaders of them and MaxHeaderBytes together.
func validateHeaders(h map[string]string) error {
	if err := ValidateHeaders(h); err != nil {
		return &InvalidError{Field: "headers", Err: err}
	}
	if len(h) > MaxHeaders {
		return invalid("headers", "%d headers; at most %d", len(h), MaxHeaders)
	}
	size := 0
	for k, v := range h {
		size += len(k) + len(v)
	}
	if size > MaxHeaderBytes {
		return invalid("headers", "%d bytes of names and values; at most %d", size, MaxHeaderBytes)
	}
	if err := sameNames(slices.Sorted(maps.Keys(h))); err != nil {
		return &InvalidError{Field: "headers", Err: err}
	}
	return nil
}

// framingHeaders change how a request travels rather than what it says, and net/http drops
// (Trailer) or passes on (the others) what an operator writes in them, which is never what
// was meant: a new custom header may not be one. An endpoint that stores one from before keeps
// it, as it was sent, so that its headers can still be edited (refusing it would refuse every
// change that keeps it).
var framingHeaders = []string{"trailer", "te", "expect", "upgrade", "keep-alive", "proxy-connection"}

// validateNewHeaders refuses, among the names of h, a framing header the endpoint does not
// have already (stored: its headers as stored, nil for a new endpoint).
func validateNewHeaders(h map[string]string, stored map[string]string) error {
	for _, name := range slices.Sorted(maps.Keys(h)) {
		if !slices.Contains(framingHeaders, strings.ToLower(name)) {
			continue
		}
		had := false
		for old := range stored {
			had = had || strings.EqualFold(old, name)
		}
		if !had {
			return invalid("headers", "header %q changes how the request travels, and would not be sent as written; remove it", name)
		}
	}
	return nil
}

// validateTenant refuses tenants that can never match a producer's tenant by accident of
// typing: surrounding spaces and control characters. "" means no tenant.
func validateTenant(t string) error {
	if len(t) > MaxTenant {
		return invalid("tenant", "%d bytes; at most %d", len(t), MaxTenant)
	}
	if !utf8.ValidString(t) {
		return invalid("tenant", "is not valid UTF-8")
	}
	if strings.TrimSpace(t) != t {
		return invalid("tenant", "%q has leading or trailing spaces; tenants match exactly", t)
	}
	if strings.ContainsFunc(t, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return invalid("tenant", "%q contains a control character", t)
	}
	return nil
}

// validateLimit checks a per-endpoint override: 0 means the dispatcher's default, and the
// column is a positive integer.
func validateLimit(field string, n int) error {
	if n < 0 || n > math.MaxInt32 {
		return invalid(field, "must be a positive integer, or 0 for the dispatcher's default; got %d", n)
	}
	return nil
}

// validatePermanentStatuses checks an endpoint's permanent statuses: HTTP statuses from 300 to
// 599, as the column's CHECK and WEBHOOK_PERMANENT_STATUSES require (a 2xx is delivered
// whatever the list says, and below 300 nothing is a failure to classify).
func validatePermanentStatuses(list []int) error {
	for _, n := range list {
		if n < 300 || n > 599 {
			return invalid("permanent_statuses", "%d is not an HTTP status from 300 to 599; use e.g. 400,404,422 (or none for none but 410)", n)
		}
	}
	return nil
}
