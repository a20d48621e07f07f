package send

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/sign"
)

// MaxRetryAfter caps what ParseRetryAfter returns, so that a consumer answering
// "Retry-After: 99999999999" cannot park an event for years or overflow a duration; settle caps
// it again at the retry schedule's largest step.
const MaxRetryAfter = 30 * 24 * time.Hour

// DefaultPermanentStatuses are the answers dead-lettered at once, without a retry, besides 410
// Gone, when WEBHOOK_PERMANENT_STATUSES is not set: 413, because a body too large for the
// consumer does not shrink on retry.
var DefaultPermanentStatuses = []int{http.StatusRequestEntityTooLarge}

// Classify decides what a status code means for the row: any 2xx is delivered (a 204 without a
// body or Content-Type included); 410 Gone, and the statuses in permanent
// (WEBHOOK_PERMANENT_STATUSES, or a managed endpoint's permanent_statuses), go to the
// dead-letter table at once; every other answer is retried on the schedule, 4xx and 3xx
// included (redirects are not followed). A consumer's bad deploy answers 401 or 404 for a
// minute: dead-lettering those on the first attempt lost the events, where Stripe, Svix and
// Convoy retry. (The original dispatcher retried only 408,
// 425, 429, 500, 502, 503 and 504; list the others in WEBHOOK_PERMANENT_STATUSES to keep its
// behaviour.) A 409 Conflict that ConflictDelivered says means "already have it" is delivered
// by Send instead (classifyConflict).
func Classify(status int, permanent []int) delivery.Kind {
	switch {
	case status >= 200 && status <= 299:
		return delivery.Delivered
	case status == http.StatusGone || slices.Contains(permanent, status):
		return delivery.Permanent
	}
	return delivery.Retry
}

// ParsePermanentStatuses reads WEBHOOK_PERMANENT_STATUSES: comma-separated HTTP statuses from
// 300 to 599 that are dead-lettered at once; "none" for no status but 410. The error names the
// variable and the entry.
func ParsePermanentStatuses(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "none" {
		return []int{}, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n < 300 || n > 599 {
			return nil, fmt.Errorf("WEBHOOK_PERMANENT_STATUSES: %q is not an HTTP status from 300 to 599; use e.g. 400,404,422 (or none)", f)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// OriginalMaxBody is the largest body the original's receiver accepts (as does
// stages/sign/verify, DefaultMaxBody); it answers 413 to anything larger. Our own limit,
// WEBHOOK_MAX_PAYLOAD_BYTES, defaults to 1 MiB, so a fluxora consumer can refuse events the
// dispatcher was willing to send, and the dead-letter reason says so (PayloadTooLargeReason).
const OriginalMaxBody = 256 << 10

// inProgressMarker is what stages/sign/verify's 409 says when the delivery id is held by a
// request still being handled (verify.ErrInProgress) rather than acknowledged: the first
// attempt outlived our timeout and may yet fail, so that 409 does not mean "already
// delivered". The body is the only place verify says so (it sets no header);
// TestConflictInProgressFromVerifyIsRetried pins the coupling.
const inProgressMarker = "still being handled"

// conflictPeekBytes is how much of a 409 body is kept to look for inProgressMarker: verify's
// answer is one short line, and the rest is drained as for any other answer.
const conflictPeekBytes = 512

// isFluxora reports whether h is the fluxora wire format: only that scheme sends
// x-fluxora-signature (the Standard Webhooks scheme sends webhook-signature, though it keeps
// x-fluxora-attempt and x-fluxora-event). It is decided per request, not from
// WEBHOOK_SIGNATURE_SCHEME, because a managed endpoint has a scheme of its own.
func isFluxora(h http.Header) bool {
	_, ok := h[sign.HeaderSignature] // sign sets the canonical key; Get would canonicalize again
	return ok
}

// ConflictDelivered reports whether a 409 Conflict answer to a request with headers h means
// that the consumer already has the event. The original's receiver answers 409 to a delivery
// id it has already accepted, so with stable delivery ids a first attempt that timed out after
// the consumer stored it comes back as 409 on the retry: dead-lettering it would report a
// failure for an event the consumer has. setting is Config.Conflict409Delivered: when set it
// decides; nil means the wire format decides, true for fluxora requests and false for the
// Standard Webhooks scheme, whose specification gives 409 no such meaning.
func ConflictDelivered(setting *bool, h http.Header) bool {
	if setting != nil {
		return *setting
	}
	return isFluxora(h)
}

// classifyConflict refines a 409 answer that ConflictDelivered says means "already delivered":
// Delivered, unless the consumer says it is still handling the id (verify's in-progress
// answer, see inProgressMarker) or asks to come back (a Retry-After header). Then the earlier
// attempt has not been acknowledged and may still fail, so the row is retried: calling it
// delivered could lose the event, while a retry at worst delivers it twice (at least once).
func classifyConflict(head []byte, retryAfter string) (kind delivery.Kind, errText string) {
	if bytes.Contains(head, []byte(inProgressMarker)) || retryAfter != "" {
		return delivery.Retry, statusError(http.StatusConflict) + ": the consumer is still handling an earlier attempt of this delivery"
	}
	return delivery.Delivered, ""
}

// PayloadTooLargeReason is the dead-letter reason of a 413 answer to a size-byte body: it
// names the size and the setting that can keep such events from being sent at all, because a
// bare "HTTP 413" leaves the operator to find both. fluxora says the request was in the
// fluxora wire format, whose receiver (the original's, and verify's default) accepts at most
// OriginalMaxBody bytes; when the body is over that, the reason names that limit too.
func PayloadTooLargeReason(size int, fluxora bool) string {
	prefix := fmt.Sprintf("permanent failure: %s: the consumer refused a %d-byte body; ",
		statusError(http.StatusRequestEntityTooLarge), size)
	if fluxora && size > OriginalMaxBody {
		return prefix + fmt.Sprintf("the original's receiver accepts at most %d bytes; "+
			"lower WEBHOOK_MAX_PAYLOAD_BYTES to %d to dead-letter such events before sending, or raise the consumer's limit",
			OriginalMaxBody, OriginalMaxBody)
	}
	return prefix + fmt.Sprintf("lower WEBHOOK_MAX_PAYLOAD_BYTES below %d (to the consumer's limit) to dead-letter such events before sending, "+
		"or raise the consumer's limit", size)
}

// ParseRetryAfter reads a Retry-After header so that a consumer that asks for a pause (429,
// 503) gets at least that pause before the next attempt. It accepts delta-seconds and an
// HTTP-date, measured from now; a date in the past means "no wait" (0, true). Malformed
// values, including negative numbers, return ok=false and should be ignored. Values beyond
// MaxRetryAfter are capped to it.
func ParseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = trimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		for len(v) > 1 && v[0] == '0' {
			v = v[1:]
		}
		// Nine digits fit an int on every platform and already exceed the cap, so longer
		// values are capped without parsing them (and cannot overflow).
		if len(v) > 9 {
			return MaxRetryAfter, true
		}
		n, _ := strconv.Atoi(v)
		return min(time.Duration(n)*time.Second, MaxRetryAfter), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	// Sub saturates instead of overflowing, so dates far in either direction are safe.
	d = t.Sub(now)
	return max(0, min(d, MaxRetryAfter)), true
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return len(s) > 0
}

// trimSpace trims the optional whitespace HTTP allows around a field value (space and tab).
func trimSpace(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// describeError turns a transport error into a short text for the outbox's error column. It
// never includes the URL (url.Error does, and a query string may carry a token) nor the
// resolved address, only what went wrong.
func describeError(err error, timeout time.Duration, timedOut bool) string {
	if timedOut || errors.Is(err, context.DeadlineExceeded) {
		return "timeout after " + timeout.String()
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset by peer"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by the server before a complete response"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "dns lookup failed: " + dnsErr.Err
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		if opErr.Timeout() {
			return opErr.Op + ": i/o timeout"
		}
		if opErr.Err != nil {
			return opErr.Op + ": " + opErr.Err.Error()
		}
	}
	return err.Error()
}
