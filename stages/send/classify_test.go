package send_test

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/send"
	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// TestClassify: 2xx is delivered, 410 and the permanent statuses are dead-lettered at once,
// every other answer is retried (4xx and 3xx included: a consumer's bad deploy answers 401 or
// 404 for a while).
func TestClassify(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		permanent []int
		want      map[delivery.Kind][]int
	}{
		{send.DefaultPermanentStatuses, map[delivery.Kind][]int{
			delivery.Delivered: {200, 201, 202, 204, 299},
			delivery.Retry:     {0, 100, 199, 300, 301, 302, 307, 400, 401, 403, 404, 408, 409, 422, 425, 429, 500, 501, 502, 503, 504, 505, 599, 600},
			delivery.Permanent: {410, 413},
		}},
		{[]int{400, 404, 422}, map[delivery.Kind][]int{
			delivery.Retry:     {401, 403, 413, 429, 503},
			delivery.Permanent: {400, 404, 410, 422},
		}},
		{[]int{}, map[delivery.Kind][]int{
			delivery.Retry:     {413},
			delivery.Permanent: {410},
		}},
	} {
		for kind, statuses := range c.want {
			for _, status := range statuses {
				if got := send.Classify(status, c.permanent); got != kind {
					t.Errorf("Classify(%d, %v) = %v, want %v", status, c.permanent, got, kind)
				}
			}
		}
	}
}

// TestParsePermanentStatuses: the setting's list, "none", and a clear error for anything else.
func TestParsePermanentStatuses(t *testing.T) {
	t.Parallel()
	if got, err := send.ParsePermanentStatuses(" 400, 404,404 ,422"); err != nil || !slices.Equal(got, []int{400, 404, 422}) {
		t.Errorf("ParsePermanentStatuses = %v, %v", got, err)
	}
	if got, err := send.ParsePermanentStatuses("none"); err != nil || got == nil || len(got) != 0 {
		t.Errorf("ParsePermanentStatuses(none) = %#v, %v; want an empty, non-nil list", got, err)
	}
	for _, bad := range []string{"", "200", "4xx", "600", "400,,404"} {
		if _, err := send.ParsePermanentStatuses(bad); err == nil || !strings.Contains(err.Error(), "WEBHOOK_PERMANENT_STATUSES") {
			t.Errorf("ParsePermanentStatuses(%q) = %v, want an error naming the variable", bad, err)
		}
	}
}

// TestConflictDelivered is the table for what a 409 Conflict means: the setting decides when
// set; unset, the request's wire format does (fluxora: the original's receiver answers 409 to
// an id it already accepted; Standard Webhooks: no such meaning).
func TestConflictDelivered(t *testing.T) {
	t.Parallel()
	fluxora := http.Header{}
	fluxora.Set("X-Fluxora-Delivery-Id", "d-1")
	fluxora.Set("X-Fluxora-Timestamp", "1710000000")
	fluxora.Set("X-Fluxora-Signature", "925006549b879c8d9e91c10a153254fb4b6e2241820a1b072e28aa2fa8caeb79")
	fluxora.Set("X-Fluxora-Event", "stream.updated")
	standard := http.Header{}
	standard.Set("Webhook-Id", "d-1")
	standard.Set("Webhook-Timestamp", "1710000000")
	standard.Set("Webhook-Signature", "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=")
	standard.Set("X-Fluxora-Event", "stream.updated") // the Standard scheme keeps these two
	standard.Set("X-Fluxora-Attempt", "2")
	tests := []struct {
		name    string
		setting *bool
		header  http.Header
		want    bool
	}{
		{"fluxora, default", nil, fluxora, true},
		{"fluxora, on", new(true), fluxora, true},
		{"fluxora, off", new(false), fluxora, false},
		{"standard, default", nil, standard, false},
		{"standard, on", new(true), standard, true},
		{"standard, off", new(false), standard, false},
		{"no headers, default", nil, http.Header{}, false},
	}
	for _, tt := range tests {
		if got := send.ConflictDelivered(tt.setting, tt.header); got != tt.want {
			t.Errorf("%s: ConflictDelivered = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestPayloadTooLargeReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		size    int
		fluxora bool
		want    string
	}{
		{300000, true, "permanent failure: HTTP 413 Request Entity Too Large: the consumer refused a 300000-byte body; " +
			"the original's receiver accepts at most 262144 bytes; lower WEBHOOK_MAX_PAYLOAD_BYTES to 262144 " +
			"to dead-letter such events before sending, or raise the consumer's limit"},
		// At or under the original's limit the consumer's own limit is lower: naming 256 KiB
		// would mislead.
		{262144, true, "permanent failure: HTTP 413 Request Entity Too Large: the consumer refused a 262144-byte body; " +
			"lower WEBHOOK_MAX_PAYLOAD_BYTES below 262144 (to the consumer's limit) to dead-letter such events before sending, " +
			"or raise the consumer's limit"},
		// A Standard Webhooks consumer is not the original's receiver.
		{300000, false, "permanent failure: HTTP 413 Request Entity Too Large: the consumer refused a 300000-byte body; " +
			"lower WEBHOOK_MAX_PAYLOAD_BYTES below 300000 (to the consumer's limit) to dead-letter such events before sending, " +
			"or raise the consumer's limit"},
	}
	for _, tt := range tests {
		if got := send.PayloadTooLargeReason(tt.size, tt.fluxora); got != tt.want {
			t.Errorf("PayloadTooLargeReason(%d, %v) =\n%s\nwant\n%s", tt.size, tt.fluxora, got, tt.want)
		}
	}
}

// TestOriginalMaxBodyIsVerifyDefault pins the limit the 413 reason names to the consumer
// package's, which follows the original's receiver.
func TestOriginalMaxBodyIsVerifyDefault(t *testing.T) {
	t.Parallel()
	if send.OriginalMaxBody != verify.DefaultMaxBody {
		t.Errorf("send.OriginalMaxBody = %d, verify.DefaultMaxBody = %d", send.OriginalMaxBody, verify.DefaultMaxBody)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2024, 3, 10, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration, layout string) string { return now.Add(d).Format(layout) }
	const (
		rfc850  = "Monday, 02-Jan-06 15:04:05 GMT"
		ansiC   = time.ANSIC
		maxWait = send.MaxRetryAfter
	)
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"120", 120 * time.Second, true},
		{"0", 0, true},
		{" 120\t", 120 * time.Second, true},
		{"0120", 120 * time.Second, true},
		{"000000000000000000120", 120 * time.Second, true},
		{"2592000", maxWait, true},
		{"2592001", maxWait, true},
		{"999999999", maxWait, true},
		{"99999999999999999999999999", maxWait, true},
		{date(90*time.Second, http.TimeFormat), 90 * time.Second, true},
		{date(2*time.Hour, rfc850), 2 * time.Hour, true},
		{date(5*time.Minute, ansiC), 5 * time.Minute, true},
		{date(-time.Hour, http.TimeFormat), 0, true}, // in the past: no wait
		{date(365*24*time.Hour, http.TimeFormat), maxWait, true},
		{"Fri, 31 Dec 9999 23:59:59 GMT", maxWait, true},
		{"Mon, 01 Jan 0001 00:00:00 GMT", 0, true},
		{"", 0, false},
		{"   ", 0, false},
		{"-5", 0, false},
		{"+5", 0, false},
		{"1.5", 0, false},
		{"1e3", 0, false},
		{"120s", 0, false},
		{"soon", 0, false},
		{"Sun, 10 Mar 2024 13:00:00 PST", 0, false},
		{"Sun, 10 Mar 2024", 0, false},
	}
	for _, tt := range tests {
		got, ok := send.ParseRetryAfter(tt.in, now)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2024, 3, 10, 12, 0, 0, 0, time.UTC)
	for _, seed := range []string{
		"120", "0", "-1", "", " 7 ", "99999999999999999999", "1.5",
		"Sun, 10 Mar 2024 12:01:00 GMT", "Sunday, 10-Mar-24 12:01:00 GMT", "Sun Mar 10 12:01:00 2024",
		"Fri, 31 Dec 9999 23:59:59 GMT",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := send.ParseRetryAfter(v, now)
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, false; want 0 when not ok", v, d)
		}
		if d < 0 || d > send.MaxRetryAfter {
			t.Fatalf("ParseRetryAfter(%q) = %v, outside [0, %v]", v, d, send.MaxRetryAfter)
		}
		// Plain delta-seconds must agree with strconv where strconv can tell.
		if n, err := strconv.ParseUint(v, 10, 32); err == nil && v[0] != '+' {
			want := min(time.Duration(n)*time.Second, send.MaxRetryAfter)
			if !ok || d != want {
				t.Fatalf("ParseRetryAfter(%q) = %v, %v; want %v, true", v, d, ok, want)
			}
		}
	})
}

func BenchmarkClassify(b *testing.B) {
	statuses := []int{200, 204, 301, 400, 404, 429, 500, 503, 504, 505}
	var sink delivery.Kind
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sink += send.Classify(statuses[i%len(statuses)], send.DefaultPermanentStatuses)
	}
	_ = sink
}
