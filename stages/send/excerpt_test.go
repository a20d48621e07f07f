package send_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/send"
)

// TestSendKeepsAnExcerptOfTheAnswer: every answer, 2xx included, leaves the start of its body
// on the outcome, bounded by ResponseExcerptBytes and stored as text PostgreSQL accepts;
// excerpts off (0) leave none, and no response leaves none.
func TestSendKeepsAnExcerptOfTheAnswer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		limit   *int // nil: the default
		status  int
		body    string
		want    string
		wantSet bool
	}{
		{name: "2xx answer, default limit", status: 200, body: `{"received":true}`, want: `{"received":true}`, wantSet: true},
		{name: "retryable answer", limit: new(64), status: 503, body: "upstream down", want: "upstream down", wantSet: true},
		{name: "empty body is an empty excerpt, not none", status: 204, wantSet: true},
		{name: "cut at the limit", limit: new(8), status: 500, body: "0123456789abcdef", want: "01234567", wantSet: true},
		{name: "the default limit", status: 400, body: strings.Repeat("x", 5000), want: strings.Repeat("x", send.DefaultResponseExcerptBytes), wantSet: true},
		{name: "a character the limit cuts is dropped", limit: new(5), status: 200, body: "ééé", want: "éé", wantSet: true},
		{name: "invalid UTF-8 and NUL", limit: new(64), status: 502, body: "a\xff\xfeb\x00c", want: "a\uFFFDbc", wantSet: true},
		{name: "replacements stay within the limit", limit: new(4), status: 502, body: "\xffa\xffb", want: "\uFFFDa", wantSet: true},
		{name: "excerpts off", limit: new(0), status: 200, body: "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			s := newSender(t, send.Config{ResponseExcerptBytes: tt.limit})
			d := newDelivery(t, s, srv.URL+"/hook")
			s.Send(context.Background(), d)
			if d.Outcome.Status != tt.status {
				t.Fatalf("Outcome = %+v, want status %d", d.Outcome, tt.status)
			}
			if d.Outcome.Excerpt != tt.want || d.Outcome.Excerpted != tt.wantSet {
				t.Errorf("Excerpt, Excerpted = %q, %v; want %q, %v", d.Outcome.Excerpt, d.Outcome.Excerpted, tt.want, tt.wantSet)
			}
		})
	}

	t.Run("no response", func(t *testing.T) {
		t.Parallel()
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			panic(http.ErrAbortHandler) // the connection is closed without an answer
		})
		s := newSender(t, send.Config{})
		d := newDelivery(t, s, srv.URL+"/hook")
		s.Send(context.Background(), d)
		if d.Outcome.Kind != delivery.Retry || d.Outcome.Excerpted || d.Outcome.Excerpt != "" {
			t.Errorf("Outcome = %+v, want a retry without an excerpt", d.Outcome)
		}
	})
}

// TestSendExcerptBesideConflict: the excerpt and a 409's classification share one read of the
// body. An excerpt shorter than what the classification looks at must not hide the consumer's
// "still being handled" from it, and the excerpt keeps only its own limit.
func TestSendExcerptBesideConflict(t *testing.T) {
	t.Parallel()
	body := `{"error":"verify: delivery id d-1 is still being handled"}`
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, body)
	})
	for _, limit := range []int{8, 4096} {
		s := newSender(t, send.Config{ResponseExcerptBytes: new(limit)})
		d := newDelivery(t, s, srv.URL+"/hook")
		s.Send(context.Background(), d)
		want := body[:min(limit, len(body))]
		if d.Outcome.Kind != delivery.Retry || d.Outcome.Excerpt != want {
			t.Errorf("limit %d: Outcome = %+v, want a retry (still being handled) with excerpt %q", limit, d.Outcome, want)
		}
	}
}

// BenchmarkSendExcerpt measures what keeping the answer costs an attempt to a consumer that
// answers a short JSON body: with excerpts off the body is only drained, as before; with the
// default limit it is read into a pooled buffer and copied into the excerpt's string (one
// allocation). Run:
//
//	go test -run XXX -bench SendExcerpt -benchmem ./stages/send/
func BenchmarkSendExcerpt(b *testing.B) {
	srv := newServer(b, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"received":true}`)
	})
	for _, limit := range []int{0, send.DefaultResponseExcerptBytes} {
		b.Run("excerpt="+strconv.Itoa(limit), func(b *testing.B) {
			s := newSender(b, send.Config{ResponseExcerptBytes: new(limit)})
			d := newDelivery(b, s, srv.URL+"/hook")
			b.ReportAllocs()
			for b.Loop() {
				s.Send(context.Background(), d)
				if d.Outcome.Kind != delivery.Delivered {
					b.Fatalf("Outcome = %+v", d.Outcome)
				}
			}
		})
	}
}
