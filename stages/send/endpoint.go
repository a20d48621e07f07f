package send

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fluxora/fluxhook/stages/delivery"
)

// ErrInvalidURL is wrapped by every error from ValidateURL and Endpoint about a malformed or
// disallowed URL, so that callers can tell "dead-letter this row" from other failures with
// errors.Is without matching text.
var ErrInvalidURL = errors.New("invalid endpoint URL")

// ErrNoEndpoint is returned by Endpoint for a row without endpoint_url when no WEBHOOK_URL is
// configured: the row has nowhere to go, which is a reason to dead-letter it, not to retry.
var ErrNoEndpoint = errors.New("row has no endpoint_url and WEBHOOK_URL is not set")

// maxCachedEndpoints bounds the endpoint cache: endpoint_url comes from rows, so the number of
// distinct values is not ours to control.
const maxCachedEndpoints = 10_000

// ValidateURL applies the endpoint rules to a consumer URL, both the configured WEBHOOK_URL
// at startup and each row's endpoint_url, so that one set of rules decides what fluxhook may
// call. Plain http is allowed only for loopback hosts, where it serves local development;
// credentials in the URL are refused because they would travel to, and be logged by, every
// hop. The error says what is wrong and what to do, without repeating the URL, which may carry
// a token in its query string.
func ValidateURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("%w: the URL is empty; set an https:// URL", ErrInvalidURL)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: %s; use the form https://host/path", ErrInvalidURL, parseProblem(err))
	}
	switch u.Scheme {
	case "https", "http":
	case "":
		return fmt.Errorf("%w: it has no scheme; use the form https://host/path", ErrInvalidURL)
	default:
		return fmt.Errorf("%w: scheme %q is not supported; use https:// (or http:// for a loopback host)",
			ErrInvalidURL, truncate(u.Scheme, 16))
	}
	if u.User != nil {
		return fmt.Errorf("%w: it contains a user name or password; remove them, consumers authenticate requests by their signature",
			ErrInvalidURL)
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("%w: it has no host; use the form https://host/path", ErrInvalidURL)
	}
	if err := checkHostName(u.Hostname()); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidURL, err)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%w: port %q is out of range; use a port from 1 to 65535", ErrInvalidURL, truncate(p, 16))
		}
	}
	if u.Scheme == "http" && !isLoopback(u.Hostname()) {
		return fmt.Errorf("%w: http:// is allowed only for loopback hosts (localhost, 127.0.0.0/8, ::1); use https://",
			ErrInvalidURL)
	}
	return nil
}

// parseProblem says what url.Parse found wrong without quoting any of the URL: its errors
// quote the part they choke on, and a password holding a '/', '?' or '#' is read as the host's
// port ("invalid port \":pa55\" after host"), so its text would reach logs and dead-letter
// reasons that tenants read.
func parseProblem(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	switch s := err.Error(); {
	case strings.Contains(s, "invalid port"):
		return "what follows the host's ':' is not a port number (a user name and password there are refused: " +
			"consumers authenticate requests by their signature)"
	case strings.Contains(s, "invalid URL escape"):
		return "a '%' is not followed by two hexadecimal digits (write a literal '%' as %25)"
	case strings.Contains(s, "control character"):
		return "it contains a control character"
	case strings.Contains(s, "missing protocol scheme"):
		return "it has no scheme"
	case strings.Contains(s, "in host name"), strings.Contains(s, "IPv6"):
		return "its host is not a DNS name or an IP address"
	}
	return "it does not parse as a URL"
}

// checkHostName refuses a URL host that no connection could be made to, which url.Parse
// accepts (a comma, a space, a '$', a fullwidth '/'): retried, such a row would fail its lookup
// for the retry schedule's days. An IP literal passes; a name is letters, digits, '-', '_' and
// '.', and in an internationalized name (which the transport sends in its punycode form) also
// other scripts' letters, digits and marks and the full stops IDNA reads as '.'.
func checkHostName(host string) error {
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if !utf8.ValidString(host) {
		return fmt.Errorf("host %q is not valid UTF-8; use a DNS name or an IP address", truncate(host, 64))
	}
	if i := strings.IndexFunc(host, func(r rune) bool { return !hostNameRune(r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(host[i:])
		return fmt.Errorf("host %q has %q, which a host name cannot have; use a DNS name or an IP address", truncate(host, 64), r)
	}
	return nil
}

// hostNameRune says whether r may appear in a host name (see checkHostName).
func hostNameRune(r rune) bool {
	switch {
	case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '-', r == '_', r == '.':
		return true
	case r < utf8.RuneSelf:
		return false
	case r == '\u3002', r == '\uff0e', r == '\uff61': // ideographic, fullwidth and halfwidth full stops
		return true
	}
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r)
}

// isLoopback reports whether host names this machine without a DNS lookup: the name
// localhost or any name under it (RFC 6761: *.localhost is loopback, and resolvers may map
// it so), or a loopback address literal (IPv4-mapped and zoned forms included). A name
// under localhost is never looked up either: what a resolver says of it must not decide
// whether it is checked as loopback.
func isLoopback(host string) bool {
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.Unmap().IsLoopback()
}

// truncate keeps error messages short when they quote a piece of the URL.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Endpoint resolves a row's endpoint_url into the shared *delivery.Endpoint the rest of the
// pipeline uses, so that validation and hashing happen once per distinct URL rather than once
// per row, and rows for the same consumer share one value (and one concurrency count). An
// empty raw means the configured default. A row's own URL is marked RowURL, which holds it to
// RowURLNetworks when dialled; one whose host needs no lookup (an IP address, localhost) is
// checked against that policy here already, so that it is refused before the gate, a slot or
// a request. The error wraps ErrInvalidURL or ErrNoEndpoint, or is the guard's refusal, and
// is suitable as the row's dead-letter reason.
func (s *Sender) Endpoint(raw string) (*delivery.Endpoint, error) {
	if raw == "" {
		if s.defaultEndpoint == nil {
			return nil, ErrNoEndpoint
		}
		return s.defaultEndpoint, nil
	}
	s.endpointsMu.Lock()
	ep, ok := s.endpoints[raw]
	s.endpointsMu.Unlock()
	if ok {
		return ep, nil
	}
	if err := ValidateURL(raw); err != nil {
		return nil, err
	}
	ep = newEndpoint(raw, raw)
	ep.RowURL = true
	if ep.Parsed != nil {
		if err := s.rowGuard.checkHost(ep.Parsed.Hostname()); err != nil {
			return nil, err
		}
	}
	s.endpointsMu.Lock()
	defer s.endpointsMu.Unlock()
	if prev, ok := s.endpoints[raw]; ok {
		// Another caller resolved it meanwhile; keep one pointer per URL.
		return prev, nil
	}
	if len(s.endpoints) >= maxCachedEndpoints {
		// Resetting is simpler than LRU and costs only a re-validation per URL; concurrency
		// is counted by Key, so endpoints created before the reset keep sharing their slots.
		clear(s.endpoints)
	}
	s.endpoints[raw] = ep
	return ep, nil
}

// ManagedEndpoint validates rawURL and returns the target of a managed endpoint (a row of
// webhook_endpoints): its own key, so that its concurrency, breaker and rate limit are its own
// even when another endpoint shares the URL, and its concurrency limit (0: the configured
// default). The hash, the name in logs, metrics and Redis keys, is derived from the key for
// the same reason.
func ManagedEndpoint(rawURL, key string, concurrency int) (*delivery.Endpoint, error) {
	if err := ValidateURL(rawURL); err != nil {
		return nil, err
	}
	ep := newEndpoint(rawURL, key)
	sum := sha256.Sum256([]byte(key))
	ep.Hash = hex.EncodeToString(sum[:])
	ep.Concurrency = concurrency
	return ep, nil
}

func newEndpoint(rawURL, key string) *delivery.Endpoint {
	sum := sha256.Sum256([]byte(rawURL))
	ep := &delivery.Endpoint{URL: rawURL, Hash: hex.EncodeToString(sum[:]), Key: key}
	if u, err := url.Parse(rawURL); err == nil { // validated already; parse once for all requests
		ep.Parsed = u
	}
	return ep
}
