package send

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
)

// MaxRetryAfter caps what ParseRetryAfter returns, so that a consumer answering
// "Retry-After: 99999999999" cannot park an event for years or overflow a duration; settle caps
// it again at the retry schedule's largest step.
const MaxRetryAfter = 30 * 24 * time.Hour

// Classify decides what a status code means for the row, following REFERENCE.md: any 2xx is
// delivered (a 204 without a body or Content-Type included), the statuses that signal a
// passing condition are retried, and everything else, including 3xx because redirects are not
// followed, will not improve by retrying and goes to the dead-letter table.
func Classify(status int) delivery.Kind {
	switch {
	case status >= 200 && status <= 299:
		return delivery.Delivered
	}
	switch status {
	case http.StatusRequestTimeout, // 408
		http.StatusTooEarly,            // 425
		http.StatusTooManyRequests,     // 429
		http.StatusInternalServerError, // 500
		http.StatusBadGateway,          // 502
		http.StatusServiceUnavailable,  // 503
		http.StatusGatewayTimeout:      // 504
		return delivery.Retry
	}
	return delivery.Permanent
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
