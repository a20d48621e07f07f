package send_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/send"
)

// payload ends in a newline on purpose: the body is signed and sent byte for byte.
var payload = []byte("{\"event\":\"stream.updated\",\"id\":42}\n")

// waitLimit bounds every wait on a signal, so that a broken test fails instead of hanging.
const waitLimit = 10 * time.Second

func newSender(t testing.TB, cfg send.Config) *send.Sender {
	t.Helper()
	s, err := send.New(cfg)
	if err != nil {
		t.Fatalf("send.New: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// newServer starts a loopback test server that is closed when the test ends.
func newServer(t testing.TB, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// latch holds handlers until it is opened, or until the client gives up on the request.
// Tests open it in a cleanup registered after the server's, so that it runs first (cleanups
// run last in, first out) and no handler outlives its test or blocks srv.Close.
type latch struct {
	ch   chan struct{}
	once sync.Once
}

func newLatch() *latch { return &latch{ch: make(chan struct{})} }

func (l *latch) open() { l.once.Do(func() { close(l.ch) }) }

func (l *latch) wait(r *http.Request) {
	select {
	case <-l.ch:
	case <-r.Context().Done():
	}
}

// newDelivery is a delivery to rawURL as a URL the operator configured (a managed endpoint's,
// as WEBHOOK_URL's), held to the operator's network policy. newRowDelivery is one to a row's
// endpoint_url.
func newDelivery(t testing.TB, s *send.Sender, rawURL string) *delivery.Delivery {
	t.Helper()
	ep, err := send.ManagedEndpoint(rawURL, rawURL, 0)
	if err != nil {
		t.Fatalf("ManagedEndpoint(%q): %v", rawURL, err)
	}
	return signedDelivery(ep)
}

// newRowDelivery is a delivery to rawURL as a row's endpoint_url (Sender.Endpoint).
func newRowDelivery(t testing.TB, s *send.Sender, rawURL string) *delivery.Delivery {
	t.Helper()
	ep, err := s.Endpoint(rawURL)
	if err != nil {
		t.Fatalf("Endpoint(%q): %v", rawURL, err)
	}
	return signedDelivery(ep)
}

func signedDelivery(ep *delivery.Endpoint) *delivery.Delivery {
	h := make(http.Header)
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "fluxhook-test")
	h.Set("X-Fluxora-Delivery-Id", "0b8a6c1e-7d1c-4a8e-9d1e-1f2a3b4c5d6e")
	h.Set("X-Fluxora-Timestamp", "1710000000")
	h.Set("X-Fluxora-Event", "stream.updated")
	h.Set("X-Fluxora-Signature", "925006549b879c8d9e91c10a153254fb4b6e2241820a1b072e28aa2fa8caeb79")
	return &delivery.Delivery{ID: 1, DeliveryID: "0b8a6c1e", Attempt: 1, Payload: payload, Endpoint: ep, Header: h}
}

func wait(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitLimit):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestSendClassifiesStatuses(t *testing.T) {
	t.Parallel()
	var redirectFollowed atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/target", func(w http.ResponseWriter, r *http.Request) {
		redirectFollowed.Add(1)
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("/status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.PathValue("code"))
		if code >= 300 && code < 400 {
			w.Header().Set("Location", "/target")
		}
		w.WriteHeader(code)
		if code == http.StatusOK {
			return // 200 with neither body nor Content-Type
		}
		if code != http.StatusNoContent && code != http.StatusNotModified {
			_, _ = io.WriteString(w, "some explanation")
		}
	})
	srv := newServer(t, mux.ServeHTTP)
	s := newSender(t, send.Config{})

	tests := map[delivery.Kind][]int{
		delivery.Delivered: {200, 201, 202, 204},
		delivery.Retry:     {408, 425, 429, 500, 502, 503, 504, 400, 401, 403, 404, 422, 501, 505, 301, 302, 303, 307, 308},
		delivery.Permanent: {410},
	}
	for kind, statuses := range tests {
		for _, status := range statuses {
			t.Run(strconv.Itoa(status), func(t *testing.T) {
				t.Parallel()
				d := newDelivery(t, s, srv.URL+"/status/"+strconv.Itoa(status))
				s.Send(context.Background(), d)
				o := d.Outcome
				if o.Kind != kind || o.Status != status {
					t.Fatalf("Outcome = %+v, want kind %v status %d", o, kind, status)
				}
				if o.Duration <= 0 {
					t.Errorf("Duration = %v, want it measured", o.Duration)
				}
				if o.Delay != 0 || o.Reason != "" {
					t.Errorf("Outcome = %+v, want no Delay or Reason", o)
				}
				switch {
				case kind == delivery.Delivered && o.Error != "":
					t.Errorf("Error = %q for a delivered row, want none", o.Error)
				case kind != delivery.Delivered && !strings.HasPrefix(o.Error, "HTTP "+strconv.Itoa(status)):
					t.Errorf("Error = %q, want it to start with %q", o.Error, "HTTP "+strconv.Itoa(status))
				}
			})
		}
	}
	t.Cleanup(func() {
		if n := redirectFollowed.Load(); n != 0 {
			t.Errorf("the redirect target was requested %d times; redirects must not be followed", n)
		}
	})
}

func TestSendWritesExactHeadersAndBody(t *testing.T) {
	t.Parallel()
	type request struct {
		method, path, query string
		header              http.Header
		body                []byte
		contentLength       int64
	}
	got := make(chan request, 1)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), body, r.ContentLength}
		w.WriteHeader(http.StatusNoContent)
	})
	s := newSender(t, send.Config{})
	d := newDelivery(t, s, srv.URL+"/hooks/in?token=abc")
	sent := d.Header.Clone()

	s.Send(context.Background(), d)
	if d.Outcome.Kind != delivery.Delivered {
		t.Fatalf("Outcome = %+v, want delivered", d.Outcome)
	}
	r := <-got
	if r.method != http.MethodPost || r.path != "/hooks/in" || r.query != "token=abc" {
		t.Errorf("request = %s %s?%s, want POST /hooks/in?token=abc", r.method, r.path, r.query)
	}
	if !bytes.Equal(r.body, payload) || r.contentLength != int64(len(payload)) {
		t.Errorf("body = %q (Content-Length %d), want %q byte for byte", r.body, r.contentLength, payload)
	}
	want := sent.Clone()
	want.Set("Content-Length", strconv.Itoa(len(payload))) // the only header HTTP itself adds
	if !reflect.DeepEqual(r.header, want) {
		t.Errorf("headers received:\n%v\nwant exactly:\n%v", r.header, want)
	}
	if !reflect.DeepEqual(d.Header, sent) {
		t.Errorf("Send modified d.Header: %v, was %v", d.Header, sent)
	}
}

func TestSendTimesOut(t *testing.T) {
	t.Parallel()
	hold := newLatch()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { hold.wait(r) })
	t.Cleanup(hold.open)
	const timeout = 200 * time.Millisecond
	s := newSender(t, send.Config{Timeout: timeout})
	d := newDelivery(t, s, srv.URL+"/?token=s3cret")

	start := time.Now()
	s.Send(context.Background(), d)
	elapsed := time.Since(start)

	o := d.Outcome
	if o.Kind != delivery.Retry || o.Status != 0 || o.Error != "timeout after 200ms" {
		t.Errorf("Outcome = %+v, want retry with \"timeout after 200ms\"", o)
	}
	// The deadline is set a moment before the attempt's clock starts: a duration a hair under
	// the timeout is the timeout.
	if o.Duration < timeout*9/10 || o.Duration > timeout+2*time.Second || elapsed > timeout+2*time.Second {
		t.Errorf("Duration = %v (Send took %v), want about %v", o.Duration, elapsed, timeout)
	}
}

func TestSendConnectionRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	s := newSender(t, send.Config{})
	d := newDelivery(t, s, "http://"+addr+"/hook?token=s3cret")

	s.Send(context.Background(), d)
	o := d.Outcome
	if o.Kind != delivery.Retry || o.Status != 0 || o.Error != "connection refused" {
		t.Errorf("Outcome = %+v, want retry with \"connection refused\"", o)
	}
}

func TestSendBoundsResponses(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	tests := []struct {
		name    string
		handler http.HandlerFunc
		timeout time.Duration
		want    delivery.Kind
		status  int
		errHas  string
	}{
		{
			name: "endless body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusOK)
				chunk := bytes.Repeat([]byte("x"), 32<<10)
				for r.Context().Err() == nil {
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
			},
			timeout: 30 * time.Second, // the read limit, not the timeout, must end it
			want:    delivery.Delivered,
			status:  http.StatusOK,
		},
		{
			name: "trickling body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusOK)
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for {
					if _, err := w.Write([]byte("x")); err != nil {
						return
					}
					w.(http.Flusher).Flush()
					select {
					case <-tick.C:
					case <-r.Context().Done():
						return
					}
				}
			},
			timeout: 300 * time.Millisecond, // the timeout must end it
			want:    delivery.Delivered,
			status:  http.StatusOK,
		},
		{
			name: "endless header line",
			handler: func(w http.ResponseWriter, r *http.Request) {
				conn, buf, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer conn.Close()
				_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nX-Endless: ")
				chunk := bytes.Repeat([]byte("h"), 32<<10)
				for {
					if _, err := buf.Write(chunk); err != nil {
						return
					}
					if err := buf.Flush(); err != nil {
						return
					}
				}
			},
			timeout: 30 * time.Second, // the header limit, not the timeout, must end it
			want:    delivery.Retry,
			errHas:  "header",
		},
		{
			name: "huge headers",
			handler: func(w http.ResponseWriter, r *http.Request) {
				v := strings.Repeat("h", 1<<10)
				for i := range 200 {
					w.Header().Set("X-Big-"+strconv.Itoa(i), v)
				}
				w.WriteHeader(http.StatusOK)
			},
			timeout: 30 * time.Second,
			want:    delivery.Retry,
			errHas:  "header",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, tt.handler)
			s := newSender(t, send.Config{Timeout: tt.timeout})
			d := newDelivery(t, s, srv.URL)

			start := time.Now()
			s.Send(context.Background(), d)
			elapsed := time.Since(start)

			o := d.Outcome
			t.Logf("Outcome = %+v", o)
			if o.Kind != tt.want || o.Status != tt.status || !strings.Contains(o.Error, tt.errHas) {
				t.Errorf("Outcome = %+v, want kind %v status %d error containing %q", o, tt.want, tt.status, tt.errHas)
			}
			if limit := min(tt.timeout, timeout) + 2*time.Second; elapsed > limit {
				t.Errorf("Send took %v, want under %v", elapsed, limit)
			}
		})
	}
}

func TestSendHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	inAnHour := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	tests := []struct {
		status     int
		retryAfter string
		min, max   time.Duration
	}{
		{429, "120", 120 * time.Second, 120 * time.Second},
		{503, "120", 120 * time.Second, 120 * time.Second},
		{429, inAnHour, time.Hour - 5*time.Second, time.Hour},
		{503, inAnHour, time.Hour - 5*time.Second, time.Hour},
		{429, "soon", 0, 0},
		{503, "-1", 0, 0},
		{429, "", 0, 0},
		// Malformed values are ignored: the retry schedule alone decides.
		{429, "1.5", 0, 0},
		{503, "120 seconds", 0, 0},
		{429, "0x10", 0, 0},
		{503, "+5", 0, 0},
		{429, "Sun, 99 Mar 2024 12:05:00 GMT", 0, 0},
		{503, strings.Repeat("garbage ", 512), 0, 0},
		// Absurd but well-formed values are capped, not overflowed.
		{429, strings.Repeat("9", 40), send.MaxRetryAfter, send.MaxRetryAfter},
		{500, "120", 0, 0}, // only 429 and 503 carry a meaningful Retry-After
		{502, "120", 0, 0},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status)+"/"+truncateName(tt.retryAfter), func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
			})
			s := newSender(t, send.Config{})
			d := newDelivery(t, s, srv.URL)
			s.Send(context.Background(), d)
			o := d.Outcome
			if o.Kind != delivery.Retry || o.Status != tt.status || o.Delay < tt.min || o.Delay > tt.max {
				t.Errorf("Outcome = %+v, want retry with Delay in [%v, %v]", o, tt.min, tt.max)
			}
		})
	}
}

func truncateName(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

func TestSendLimitsConcurrencyPerEndpoint(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	arrived := make(chan struct{}, 8)
	hold := newLatch()
	slow := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		arrived <- struct{}{}
		hold.wait(r)
		w.WriteHeader(http.StatusNoContent)
	})
	t.Cleanup(hold.open)
	fast := newServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })

	s := newSender(t, send.Config{EndpointConcurrency: 2})
	slowURL := slow.URL + "/hook?tenant=1"
	first, second := newDelivery(t, s, slowURL), newDelivery(t, s, slowURL)
	var wg sync.WaitGroup
	wg.Go(func() { s.Send(context.Background(), first) })
	wg.Go(func() { s.Send(context.Background(), second) })
	wait(t, arrived, "the first request")
	wait(t, arrived, "the second request")

	third := newDelivery(t, s, slowURL)
	s.Send(context.Background(), third)
	want := delivery.Outcome{Kind: delivery.Release, Delay: send.SaturatedDelay}
	if third.Outcome != want {
		t.Errorf("third Send to a saturated endpoint: Outcome = %+v, want %+v", third.Outcome, want)
	}
	if n := requests.Load(); n != 2 {
		t.Errorf("the saturated endpoint received %d requests, want 2", n)
	}
	if got := s.Saturated(nil); !slices.Equal(got, []string{slowURL}) {
		t.Errorf("Saturated = %q, want [%q]", got, slowURL)
	}

	other := newDelivery(t, s, fast.URL+"/hook")
	s.Send(context.Background(), other)
	if other.Outcome.Kind != delivery.Delivered {
		t.Errorf("Send to another endpoint while one is saturated: Outcome = %+v, want delivered", other.Outcome)
	}

	hold.open()
	wg.Wait()
	for _, d := range []*delivery.Delivery{first, second} {
		if d.Outcome.Kind != delivery.Delivered {
			t.Errorf("in-flight Send: Outcome = %+v, want delivered", d.Outcome)
		}
	}
	if got := s.Saturated(nil); len(got) != 0 {
		t.Errorf("Saturated after the requests finished = %q, want none", got)
	}
	again := newDelivery(t, s, slowURL)
	s.Send(context.Background(), again)
	if again.Outcome.Kind != delivery.Delivered {
		t.Errorf("Send after slots freed: Outcome = %+v, want delivered", again.Outcome)
	}
}

func TestSendCancelledByShutdown(t *testing.T) {
	t.Parallel()
	want := delivery.Outcome{Kind: delivery.Release, Error: "cancelled by shutdown"}

	t.Run("before the request", func(t *testing.T) {
		t.Parallel()
		var requests atomic.Int64
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { requests.Add(1) })
		s := newSender(t, send.Config{})
		d := newDelivery(t, s, srv.URL)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		s.Send(ctx, d)
		if d.Outcome != want {
			t.Errorf("Outcome = %+v, want %+v", d.Outcome, want)
		}
		if n := requests.Load(); n != 0 {
			t.Errorf("server received %d requests, want none", n)
		}
	})

	t.Run("in flight", func(t *testing.T) {
		t.Parallel()
		arrived := make(chan struct{}, 1)
		hold := newLatch()
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			hold.wait(r)
		})
		t.Cleanup(hold.open)
		s := newSender(t, send.Config{})
		d := newDelivery(t, s, srv.URL)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.Send(ctx, d)
		}()
		wait(t, arrived, "the request")
		cancel()
		wait(t, done, "Send to return after cancel")

		got := d.Outcome
		got.Duration = 0
		if got != want {
			t.Errorf("Outcome = %+v, want %+v", d.Outcome, want)
		}
		if len(s.Saturated(nil)) != 0 {
			t.Errorf("the cancelled request still holds a slot")
		}
	})
}

// A row whose send-by time has passed (its dispatcher was paused past the point where the
// attempt could still finish inside the lease) is released unsent: another instance may
// already hold it. One whose send-by time is ahead, or unset, is sent.
func TestSendReleasesARowPastItsSendBy(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { requests.Add(1) })
	s := newSender(t, send.Config{})

	late := newDelivery(t, s, srv.URL)
	late.SendBy = time.Now().Add(-time.Millisecond)
	s.Send(context.Background(), late)
	if want := (delivery.Outcome{Kind: delivery.Release, Error: send.LeaseSpent}); late.Outcome != want {
		t.Errorf("Outcome = %+v, want %+v", late.Outcome, want)
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("server received %d requests for a row past its send-by time, want none", n)
	}
	if len(s.Saturated(nil)) != 0 {
		t.Errorf("the released row still holds its endpoint's slot")
	}

	for _, sendBy := range []time.Time{time.Now().Add(time.Minute), {}} {
		d := newDelivery(t, s, srv.URL)
		d.SendBy = sendBy
		s.Send(context.Background(), d)
		if d.Outcome.Kind != delivery.Delivered {
			t.Errorf("SendBy %v: Outcome = %+v, want delivered", sendBy, d.Outcome)
		}
	}
	if n := requests.Load(); n != 2 {
		t.Errorf("server received %d requests, want 2", n)
	}
}

func BenchmarkSend(b *testing.B) {
	srv := newServer(b, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})
	s := newSender(b, send.Config{})

	b.Run("serial", func(b *testing.B) {
		d := newDelivery(b, s, srv.URL+"/hook")
		b.ReportAllocs()
		for b.Loop() {
			s.Send(context.Background(), d)
			if d.Outcome.Kind != delivery.Delivered {
				b.Fatalf("Outcome = %+v", d.Outcome)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			d := newDelivery(b, s, srv.URL+"/hook")
			for pb.Next() {
				s.Send(context.Background(), d)
				if k := d.Outcome.Kind; k != delivery.Delivered && k != delivery.Release {
					b.Errorf("Outcome = %+v", d.Outcome)
					return
				}
			}
		})
	})
}

// A row without an endpoint or without signature headers is a wiring bug upstream: it must
// neither be sent unsigned nor loop forever, so it is dead-lettered with a reason.
func TestSendRejectsUnpreparedRows(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { requests.Add(1) })
	s := newSender(t, send.Config{})

	noEndpoint := newDelivery(t, s, srv.URL)
	noEndpoint.Endpoint = nil
	unsigned := newDelivery(t, s, srv.URL)
	unsigned.Header = nil
	for _, d := range []*delivery.Delivery{noEndpoint, unsigned} {
		s.Send(context.Background(), d)
		if d.Outcome.Kind != delivery.Permanent || d.Outcome.Reason == "" {
			t.Errorf("Outcome = %+v, want permanent with a reason", d.Outcome)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("server received %d requests, want none", n)
	}
}
