package send_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/send"
	"github.com/fluxora/fluxhook/stages/sign"
	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// asStandard turns d's fluxora headers into the Standard Webhooks scheme's, as sign does: the
// webhook-* trio replaces x-fluxora-delivery-id, -timestamp and -signature.
func asStandard(d *delivery.Delivery) {
	for _, k := range []string{"X-Fluxora-Delivery-Id", "X-Fluxora-Timestamp", "X-Fluxora-Signature"} {
		d.Header.Del(k)
	}
	d.Header.Set("Webhook-Id", d.DeliveryID)
	d.Header.Set("Webhook-Timestamp", "1710000000")
	d.Header.Set("Webhook-Signature", "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=")
}

// TestSendConflictAndTooLarge is the classification table for the answers that depend on more
// than the status: 409 (by setting and wire format, body and Retry-After) and 413 (a reason
// naming the body size and WEBHOOK_MAX_PAYLOAD_BYTES).
func TestSendConflictAndTooLarge(t *testing.T) {
	t.Parallel()
	type answer struct {
		status     int
		body       string
		retryAfter string
	}
	big := bytes.Repeat([]byte("x"), 300000)
	const (
		inProgress = "verify: delivery id already received (another request with it is still being handled): \"d-1\"\n"
		duplicate  = "verify: delivery id already received: \"d-1\"\n"
	)
	tests := []struct {
		name     string
		setting  *bool
		standard bool
		payload  []byte
		answer   answer
		want     delivery.Outcome // Duration is not compared
	}{
		{name: "fluxora 409 is already delivered", answer: answer{status: 409, body: duplicate},
			want: delivery.Outcome{Kind: delivery.Delivered, Status: 409, AlreadyDelivered: true}},
		{name: "fluxora 409 without a body", answer: answer{status: 409},
			want: delivery.Outcome{Kind: delivery.Delivered, Status: 409, AlreadyDelivered: true}},
		{name: "fluxora 409, setting on", setting: new(true), answer: answer{status: 409},
			want: delivery.Outcome{Kind: delivery.Delivered, Status: 409, AlreadyDelivered: true}},
		{name: "fluxora 409, setting off: retried like any other answer", setting: new(false), answer: answer{status: 409, body: duplicate},
			want: delivery.Outcome{Kind: delivery.Retry, Status: 409, Error: "HTTP 409 Conflict"}},
		{name: "standard 409 by default is retried", standard: true, answer: answer{status: 409},
			want: delivery.Outcome{Kind: delivery.Retry, Status: 409, Error: "HTTP 409 Conflict"}},
		{name: "standard 409, setting on", standard: true, setting: new(true), answer: answer{status: 409},
			want: delivery.Outcome{Kind: delivery.Delivered, Status: 409, AlreadyDelivered: true}},
		{name: "409 while the first attempt is still being handled is retried", answer: answer{status: 409, body: inProgress},
			want: delivery.Outcome{Kind: delivery.Retry, Status: 409,
				Error: "HTTP 409 Conflict: the consumer is still handling an earlier attempt of this delivery"}},
		{name: "409 with Retry-After is retried after it", answer: answer{status: 409, retryAfter: "30"},
			want: delivery.Outcome{Kind: delivery.Retry, Status: 409, Delay: 30 * time.Second,
				Error: "HTTP 409 Conflict: the consumer is still handling an earlier attempt of this delivery"}},
		{name: "in-progress 409 with the setting off is retried", setting: new(false), answer: answer{status: 409, body: inProgress},
			want: delivery.Outcome{Kind: delivery.Retry, Status: 409, Error: "HTTP 409 Conflict"}},
		{name: "2xx is not already delivered", answer: answer{status: 200},
			want: delivery.Outcome{Kind: delivery.Delivered, Status: 200}},
		{name: "fluxora 413 over the original's limit", payload: big, answer: answer{status: 413, body: "verify: body larger than the limit"},
			want: delivery.Outcome{Kind: delivery.Permanent, Status: 413, Error: "HTTP 413 Request Entity Too Large",
				Reason: "permanent failure: HTTP 413 Request Entity Too Large: the consumer refused a 300000-byte body; " +
					"the original's receiver accepts at most 262144 bytes; lower WEBHOOK_MAX_PAYLOAD_BYTES to 262144 " +
					"to dead-letter such events before sending, or raise the consumer's limit"}},
		{name: "413 to a small body", answer: answer{status: 413},
			want: delivery.Outcome{Kind: delivery.Permanent, Status: 413, Error: "HTTP 413 Request Entity Too Large",
				Reason: "permanent failure: HTTP 413 Request Entity Too Large: the consumer refused a 35-byte body; " +
					"lower WEBHOOK_MAX_PAYLOAD_BYTES below 35 (to the consumer's limit) to dead-letter such events before sending, " +
					"or raise the consumer's limit"}},
		{name: "standard 413", standard: true, payload: big, answer: answer{status: 413},
			want: delivery.Outcome{Kind: delivery.Permanent, Status: 413, Error: "HTTP 413 Request Entity Too Large",
				Reason: "permanent failure: HTTP 413 Request Entity Too Large: the consumer refused a 300000-byte body; " +
					"lower WEBHOOK_MAX_PAYLOAD_BYTES below 300000 (to the consumer's limit) to dead-letter such events before sending, " +
					"or raise the consumer's limit"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if tt.answer.retryAfter != "" {
					w.Header().Set("Retry-After", tt.answer.retryAfter)
				}
				w.WriteHeader(tt.answer.status)
				_, _ = io.WriteString(w, tt.answer.body)
			})
			// Without excerpts: the start of a 409's body is read for its classification alone
			// (TestSendExcerptBesideConflict reads both).
			s := newSender(t, send.Config{Conflict409Delivered: tt.setting, ResponseExcerptBytes: new(0)})
			d := newDelivery(t, s, srv.URL+"/hook")
			if tt.payload != nil {
				d.Payload = tt.payload
			}
			if tt.standard {
				asStandard(d)
			}
			s.Send(context.Background(), d)
			got := d.Outcome
			if got.Duration <= 0 {
				t.Errorf("Duration = %v, want it measured", got.Duration)
			}
			got.Duration = 0
			if got != tt.want {
				t.Errorf("Outcome =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

// TestSendConflictReusesTheConnection checks that keeping the start of a 409 body does not
// cost the connection: the rest is drained as for any answer, so the next request reuses it.
func TestSendConflictReusesTheConnection(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var conns []string
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns = append(conns, r.RemoteAddr)
		mu.Unlock()
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, strings.Repeat("already received. ", 200)) // over the peek
	})
	s := newSender(t, send.Config{})
	for range 2 {
		d := newDelivery(t, s, srv.URL+"/hook")
		s.Send(context.Background(), d)
		if d.Outcome.Kind != delivery.Delivered || !d.Outcome.AlreadyDelivered {
			t.Fatalf("Outcome = %+v, want already delivered", d.Outcome)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(conns) != 2 || conns[0] != conns[1] {
		t.Errorf("requests came from %v, want one reused connection", conns)
	}
}

// TestConflictInProgressFromVerifyIsRetried runs the consumer package's own middleware, which
// answers 409 both to an id it acknowledged and to one whose first request is still being
// handled. Only the first means the consumer has the event: the handler of the second may yet
// fail, and verify then releases the id for a retry. It pins send's reading of verify's
// in-progress answer (inProgressMarker) to what verify really writes.
func TestConflictInProgressFromVerifyIsRetried(t *testing.T) {
	t.Parallel()
	const secret = "consumer-secret"
	entered := make(chan struct{}, 1)
	hold := newLatch()
	v := &verify.Verifier{Secret: secret}
	srv := newServer(t, v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case entered <- struct{}{}:
		default:
		}
		hold.wait(r)
		w.WriteHeader(http.StatusNoContent)
	})).ServeHTTP)
	t.Cleanup(hold.open)

	signer, err := sign.New(sign.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	s := newSender(t, send.Config{})
	attempt := func(n int) *delivery.Delivery {
		d := newDelivery(t, s, srv.URL+"/hook")
		d.DeliveryID, d.Attempt = "evt-409", n
		signer.Sign(d, time.Now())
		return d
	}

	// The first attempt is held by the handler; a second with the same id meanwhile is
	// answered "still being handled".
	first := attempt(1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Send(context.Background(), first)
	}()
	wait(t, entered, "the first attempt in the handler")
	second := attempt(2)
	s.Send(context.Background(), second)
	if o := second.Outcome; o.Kind != delivery.Retry || o.Status != http.StatusConflict || o.AlreadyDelivered {
		t.Errorf("409 while the first attempt is being handled: Outcome = %+v, want a retry", o)
	}

	// Once the first is acknowledged, the id's 409 means the consumer has it.
	hold.open()
	wait(t, done, "the first attempt")
	if o := first.Outcome; o.Kind != delivery.Delivered || o.Status != http.StatusNoContent {
		t.Fatalf("first attempt: Outcome = %+v, want delivered with 204", o)
	}
	third := attempt(3)
	s.Send(context.Background(), third)
	if o := third.Outcome; o.Kind != delivery.Delivered || o.Status != http.StatusConflict || !o.AlreadyDelivered || o.Error != "" {
		t.Errorf("409 to an acknowledged id: Outcome = %+v, want already delivered", o)
	}
}

// TestReplayConflictFromVerifyIsRetried: verify refuses the same signed request under a second
// delivery id (its replay check, ErrReplay). The dispatcher never sends a request twice under
// two ids, but two distinct events with identical bodies signed in the same second look just
// like that; verify's 409 then carries Retry-After, which must make this a retry (signed
// anew, later) and not "already delivered", or the second event would be lost.
func TestReplayConflictFromVerifyIsRetried(t *testing.T) {
	t.Parallel()
	const secret = "consumer-secret"
	v := &verify.Verifier{Secret: secret}
	srv := newServer(t, v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})).ServeHTTP)
	signer, err := sign.New(sign.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	s := newSender(t, send.Config{})
	now := time.Now()
	attempt := func(id string, at time.Time) *delivery.Delivery {
		d := newDelivery(t, s, srv.URL+"/hook")
		d.DeliveryID, d.Attempt = id, 1
		signer.Sign(d, at)
		return d
	}

	first := attempt("evt-a", now)
	s.Send(context.Background(), first)
	if o := first.Outcome; o.Kind != delivery.Delivered || o.Status != http.StatusNoContent {
		t.Fatalf("first event: Outcome = %+v, want delivered with 204", o)
	}
	twin := attempt("evt-b", now) // same body, same second: the same signature
	s.Send(context.Background(), twin)
	if o := twin.Outcome; o.Kind != delivery.Retry || o.Status != http.StatusConflict || o.AlreadyDelivered {
		t.Fatalf("identical body signed in the same second under another id: Outcome = %+v, want a retry", o)
	}
	retry := attempt("evt-b", now.Add(time.Second))
	s.Send(context.Background(), retry)
	if o := retry.Outcome; o.Kind != delivery.Delivered || o.Status != http.StatusNoContent {
		t.Errorf("the twin's retry, signed a second later: Outcome = %+v, want delivered with 204", o)
	}
}
