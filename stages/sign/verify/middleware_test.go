package verify_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// handlerBundle is a Middleware in front of a handler that records what it was given and
// answers with status.
type handlerBundle struct {
	v       *verify.Verifier
	h       http.Handler
	mu      sync.Mutex
	calls   int
	gotBody []string
	gotD    []verify.Delivery
	status  int
}

func setupHandler(t *testing.T) *handlerBundle {
	t.Helper()
	b := &handlerBundle{
		v:      &verify.Verifier{Secret: vecSecret, Now: fixedClock(vecTime)},
		status: http.StatusNoContent,
	}
	b.h = b.v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("next could not read the body: %v", err)
		}
		if r.ContentLength != int64(len(body)) {
			t.Errorf("next sees ContentLength %d for %d bytes", r.ContentLength, len(body))
		}
		d, ok := verify.FromContext(r.Context())
		if !ok {
			t.Error("next got no Delivery in its context")
		}
		b.mu.Lock()
		b.calls++
		b.gotBody = append(b.gotBody, string(body))
		b.gotD = append(b.gotD, d)
		status := b.status
		b.mu.Unlock()
		w.WriteHeader(status)
	}))
	return b
}

func (b *handlerBundle) serve(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	b.h.ServeHTTP(w, r)
	return w
}

func TestMiddlewarePassesBodyAndDelivery(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	if w := b.serve(validRequest().http(context.Background())); w.Code != http.StatusNoContent {
		t.Fatalf("status %d (%s), want 204", w.Code, w.Body)
	}
	if b.calls != 1 || b.gotBody[0] != vecBody {
		t.Fatalf("next called %d times with bodies %q, want once with the signed body", b.calls, b.gotBody)
	}
	d := b.gotD[0]
	if d.ID != "d-1" || d.Event != "stream.updated" || !d.Timestamp.Equal(vecTime) || d.Attempt != 1 || string(d.Body) != vecBody {
		t.Errorf("Delivery = %+v", d)
	}
}

func TestMiddlewareAnswersRejectionsItself(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	r := validRequest()
	r.sig = strings.Repeat("0", 64)
	w := b.serve(r.http(context.Background()))
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), verify.ErrSignatureMismatch.Error()) {
		t.Errorf("answer %d %q, want 401 saying the signature does not match", w.Code, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want text/plain", ct)
	}
	if b.calls != 0 {
		t.Errorf("next called %d times for a rejected request", b.calls)
	}
}

// TestMiddlewareRemembersOnlyAcknowledged: an id is refused as a duplicate only after next
// answered it with a 2xx to a client still waiting; otherwise the sender's retry is handled.
func TestMiddlewareRemembersOnlyAcknowledged(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	send := func() int { return b.serve(validRequest().http(context.Background())).Code }

	b.status = http.StatusServiceUnavailable
	for i := range 3 {
		if code := send(); code != http.StatusServiceUnavailable {
			t.Fatalf("attempt %d answered %d, want next's 503 every time (retries are not duplicates)", i+1, code)
		}
	}
	b.status = http.StatusAccepted
	if code := send(); code != http.StatusAccepted {
		t.Fatalf("attempt after the failures answered %d, want 202", code)
	}
	w := b.serve(validRequest().http(context.Background()))
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), `"d-1"`) {
		t.Errorf("after a 2xx: %d %q, want 409 naming the id", w.Code, w.Body)
	}
	if b.calls != 4 {
		t.Errorf("next called %d times, want 4 (not for the duplicate)", b.calls)
	}
}

func TestMiddlewareImplicit200Acknowledges(t *testing.T) {
	t.Parallel()
	v := &verify.Verifier{Secret: vecSecret, Now: fixedClock(vecTime)}
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.(http.Flusher).Flush() // streaming handlers keep working through the wrapper
	}))
	for i, want := range []int{http.StatusOK, http.StatusConflict} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, validRequest().http(context.Background()))
		if w.Code != want {
			t.Errorf("request %d: %d, want %d", i+1, w.Code, want)
		}
	}
}

// TestMiddlewareAbandonedIsNotRemembered: the client gave up (its timeout), so it never saw
// the 2xx and will retry; the retry must not be refused.
func TestMiddlewareAbandonedIsNotRemembered(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	for i := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if w := b.serve(validRequest().http(ctx)); w.Code != http.StatusNoContent {
			t.Fatalf("abandoned attempt %d: %d, want 204 (not a duplicate)", i+1, w.Code)
		}
	}
	if w := b.serve(validRequest().http(context.Background())); w.Code != http.StatusNoContent {
		t.Errorf("retry after abandoned attempts: %d, want 204", w.Code)
	}
}

func TestMiddlewarePanicReleasesTheID(t *testing.T) {
	t.Parallel()
	v := &verify.Verifier{Secret: vecSecret, Now: fixedClock(vecTime)}
	panicking := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		panic("handler bug")
	}))
	func() {
		defer func() { _ = recover() }()
		panicking.ServeHTTP(httptest.NewRecorder(), validRequest().http(context.Background()))
	}()
	if err := v.Claim(context.Background(), "d-1"); err != nil {
		t.Errorf("after a panicking handler, Claim = %v, want the id free for the retry", err)
	}
}

func TestMiddlewareBodyLimit(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	b.v.MaxBody = 8

	// Declared too large: answered without reading a byte.
	body := &unreadable{}
	req := validRequest().http(context.Background())
	req.Body, req.ContentLength = io.NopCloser(body), 9
	if w := b.serve(req); w.Code != http.StatusRequestEntityTooLarge || body.read {
		t.Errorf("Content-Length over the limit: %d, read %v; want 413 without reading", w.Code, body.read)
	}

	// Chunked (length unknown): read up to the limit, then refused.
	req = validRequest().http(context.Background())
	req.ContentLength = -1
	if w := b.serve(req); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked body over the limit: %d, want 413", w.Code)
	}

	// A body that cannot be read is a bad request.
	req = validRequest().http(context.Background())
	req.Body, req.ContentLength = io.NopCloser(&unreadable{}), -1
	if w := b.serve(req); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), verify.ErrReadBody.Error()) {
		t.Errorf("unreadable body: %d %q, want 400", w.Code, w.Body)
	}

	// Missing headers are answered before the body is touched.
	body = &unreadable{}
	r := validRequest()
	r.sig = ""
	req = r.http(context.Background())
	req.Body = io.NopCloser(body)
	if w := b.serve(req); w.Code != http.StatusUnauthorized || body.read {
		t.Errorf("missing signature: %d, read %v; want 401 without reading", w.Code, body.read)
	}
	if b.calls != 0 {
		t.Errorf("next called %d times", b.calls)
	}
}

// TestConcurrentSameID: while one request with an id is being handled, every other one with
// the same id is refused at once; exactly one reaches the handler.
func TestConcurrentSameID(t *testing.T) {
	t.Parallel()
	const n = 16
	v := &verify.Verifier{Secret: vecSecret, Now: fixedClock(vecTime)}
	entered, release := make(chan struct{}, n), make(chan struct{})
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release // hold the claim until every other request has been answered
		w.WriteHeader(http.StatusNoContent)
	}))

	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, validRequest().http(context.Background()))
			codes <- w.Code
		})
	}
	counts := map[int]int{}
	for range n - 1 {
		counts[<-codes]++
	}
	close(release)
	wg.Wait()
	counts[<-codes]++
	if counts[http.StatusNoContent] != 1 || counts[http.StatusConflict] != n-1 || len(entered) != 1 {
		t.Errorf("answers %v with %d handler runs, want one 204, %d 409 and one run", counts, len(entered), n-1)
	}

	w := httptest.NewRecorder()
	h.ServeHTTP(w, validRequest().http(context.Background()))
	if w.Code != http.StatusConflict || strings.Contains(w.Body.String(), "still being handled") {
		t.Errorf("after the first was acknowledged: %d %q, want a plain 409 duplicate", w.Code, w.Body)
	}
}

func TestMiddlewareHooks(t *testing.T) {
	t.Parallel()
	var rejected, settleFailed []error
	v := &verify.Verifier{
		Secret: vecSecret,
		Now:    fixedClock(vecTime),
		Store:  failingStore{settle: errBackend},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			rejected = append(rejected, err)
			w.WriteHeader(verify.StatusOf(err))
		},
		SettleError: func(_ *http.Request, err error) { settleFailed = append(settleFailed, err) },
	}
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))

	r := validRequest()
	r.ts = "soon"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r.http(context.Background()))
	if w.Code != 400 || len(rejected) != 1 || !errors.Is(rejected[0], verify.ErrInvalidTimestamp) || w.Body.Len() != 0 {
		t.Errorf("ErrorHandler: answer %d %q, saw %v; want it to get the 400 and answer alone", w.Code, w.Body, rejected)
	}

	w = httptest.NewRecorder()
	h.ServeHTTP(w, validRequest().http(context.Background()))
	if w.Code != 200 || len(settleFailed) != 1 || !errors.Is(settleFailed[0], errBackend) {
		t.Errorf("SettleError: answer %d, saw %v; want the handler's 200 and the store's error reported", w.Code, settleFailed)
	}
}

func TestFromContextOutsideMiddleware(t *testing.T) {
	t.Parallel()
	if d, ok := verify.FromContext(context.Background()); ok {
		t.Errorf("FromContext(Background) = %+v, true; want false", d)
	}
}

// TestMiddlewareRefusesReplayUnderNewID: the fluxora signature does not cover the delivery
// id, so a captured request resent under fresh ids must be recognised by what is signed.
// Only the first reaches the handler; the others get 409 ErrReplay with Retry-After (so a
// genuine twin is retried by the dispatcher, not taken for delivered).
func TestMiddlewareRefusesReplayUnderNewID(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	if w := b.serve(validRequest().http(context.Background())); w.Code != http.StatusNoContent {
		t.Fatalf("first request: %d %q, want 204", w.Code, w.Body)
	}
	for _, id := range []string{"d-2", "d-3"} {
		r := validRequest()
		r.id = id
		w := b.serve(r.http(context.Background()))
		if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), verify.ErrReplay.Error()) ||
			!strings.Contains(w.Body.String(), id) {
			t.Errorf("replay as %s: %d %q, want 409 saying it is a replay and naming the id", id, w.Code, w.Body)
		}
		if ra := w.Header().Get("Retry-After"); ra != "1" {
			t.Errorf("replay as %s: Retry-After %q, want 1", id, ra)
		}
		if strings.Contains(w.Body.String(), "still being handled") {
			t.Errorf("replay as %s: %q claims the delivery is in progress", id, w.Body)
		}
	}
	// Case and spacing of the signature are not a new request either.
	r := validRequest()
	r.id, r.sig = "d-4", " "+strings.ToUpper(vecSig)
	if w := b.serve(r.http(context.Background())); w.Code != http.StatusConflict {
		t.Errorf("replay with an upper-case signature: %d, want 409", w.Code)
	}
	if b.calls != 1 {
		t.Errorf("next called %d times, want once", b.calls)
	}
	// The refused replays left nothing held: the original id is still a plain duplicate,
	// and a replay id is free for a request of its own.
	if w := b.serve(validRequest().http(context.Background())); w.Code != http.StatusConflict || strings.Contains(w.Body.String(), verify.ErrReplay.Error()) {
		t.Errorf("original again: %d %q, want the id's 409", w.Code, w.Body)
	}
	other := validRequest().signed(vecSecret, vecTS+1)
	other.id = "d-2"
	if w := b.serve(other.http(context.Background())); w.Code != http.StatusNoContent {
		t.Errorf("a new signed request as d-2: %d %q, want 204", w.Code, w.Body)
	}
}

// TestMiddlewareReplayWhileHandled: the same signed request under another id is refused
// while the first is still in the handler, not only once it is acknowledged.
func TestMiddlewareReplayWhileHandled(t *testing.T) {
	t.Parallel()
	v := &verify.Verifier{Secret: vecSecret, Now: fixedClock(vecTime)}
	entered, release := make(chan struct{}), make(chan struct{})
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		w.WriteHeader(http.StatusNoContent)
	}))
	done := make(chan int)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, validRequest().http(context.Background()))
		done <- w.Code
	}()
	<-entered
	r := validRequest()
	r.id = "d-2"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r.http(context.Background()))
	close(release)
	if code := <-done; code != http.StatusNoContent {
		t.Errorf("first: %d, want 204", code)
	}
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), verify.ErrReplay.Error()) || w.Header().Get("Retry-After") == "" {
		t.Errorf("replay during the first: %d %q, want 409 ErrReplay with Retry-After", w.Code, w.Body)
	}
}

// TestMiddlewareRetriesStillHandled: the dispatcher's retry of a delivery is the same id
// and body under a new timestamp (sometimes the same second). A retry of an unacknowledged
// delivery is handled; once acknowledged, the id's retry gets the plain duplicate 409 the
// dispatcher settles as delivered.
func TestMiddlewareRetriesStillHandled(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	b.v.Now = fixedClock(vecTime.Add(5 * time.Second))

	b.status = http.StatusServiceUnavailable
	for _, ts := range []int64{vecTS, vecTS, vecTS + 2} { // a same-second retry is the same signed request
		if w := b.serve(validRequest().signed(vecSecret, ts).http(context.Background())); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("unacknowledged attempt at %d: %d %q, want next's 503", ts, w.Code, w.Body)
		}
	}
	b.status = http.StatusNoContent
	if w := b.serve(validRequest().signed(vecSecret, vecTS+4).http(context.Background())); w.Code != http.StatusNoContent {
		t.Fatalf("retry after the failures: %d %q, want 204", w.Code, w.Body)
	}
	for _, ts := range []int64{vecTS + 4, vecTS + 5} {
		w := b.serve(validRequest().signed(vecSecret, ts).http(context.Background()))
		if w.Code != http.StatusConflict || strings.Contains(w.Body.String(), verify.ErrReplay.Error()) || w.Header().Get("Retry-After") != "" {
			t.Errorf("retry at %d of the acknowledged id: %d %q (Retry-After %q), want the id's plain 409", ts, w.Code, w.Body, w.Header().Get("Retry-After"))
		}
	}
	if b.calls != 4 {
		t.Errorf("next called %d times, want 4", b.calls)
	}
}

// TestMiddlewareIDOnly: with IDOnly the signature is not remembered, so an identical body
// signed in the same second under another id is handled (the old, id-only promise).
func TestMiddlewareIDOnly(t *testing.T) {
	t.Parallel()
	b := setupHandler(t)
	b.v.IDOnly = true
	for _, id := range []string{"d-1", "d-2"} {
		r := validRequest()
		r.id = id
		if w := b.serve(r.http(context.Background())); w.Code != http.StatusNoContent {
			t.Errorf("%s: %d %q, want 204", id, w.Code, w.Body)
		}
	}
}

// TestClaimDeliveryReleasesOnReplay: the function API refuses the replay and leaves its id
// free, and a store failure on the signature is a 503, not a duplicate.
func TestClaimDeliveryReleasesOnReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v := &verify.Verifier{Secret: vecSecret}
	d, err := v.Verify(validRequest().header(), []byte(vecBody), vecTime)
	if err != nil || d.Signature != vecSig {
		t.Fatalf("Verify: %+v, %v; want the vector's signature in the Delivery", d, err)
	}
	if err := v.ClaimDelivery(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := v.SettleDelivery(ctx, d, true); err != nil {
		t.Fatal(err)
	}
	replay := d
	replay.ID = "d-2"
	err = v.ClaimDelivery(ctx, replay)
	if !errors.Is(err, verify.ErrReplay) || errors.Is(err, verify.ErrDuplicate) || verify.StatusOf(err) != http.StatusConflict {
		t.Fatalf("replay: %v (status %d), want 409 ErrReplay", err, verify.StatusOf(err))
	}
	if err := v.Claim(ctx, "d-2"); err != nil {
		t.Errorf("the replay's id stayed held: %v", err)
	}

	broken := &verify.Verifier{Secret: vecSecret, Store: &secondClaimFails{}}
	if err := broken.ClaimDelivery(ctx, d); !errors.Is(err, verify.ErrStore) || verify.StatusOf(err) != http.StatusServiceUnavailable {
		t.Errorf("store failing on the signature: %v, want 503 ErrStore", err)
	}
}

// secondClaimFails accepts the id's claim and fails the signature's.
type secondClaimFails struct {
	mu     sync.Mutex
	claims int
}

func (s *secondClaimFails) Claim(context.Context, string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims++
	if s.claims == 2 {
		return errBackend
	}
	return nil
}

func (s *secondClaimFails) Settle(context.Context, string, bool) error { return nil }
