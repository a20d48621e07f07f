package receiver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/receiver"
)

// The test vector of testdata/signatures.json, verified at its own timestamp.
const (
	vectorSecret    = "topsecret"
	vectorTimestamp = 1710000000
	vectorBody      = `{"event":"stream.updated"}`
	vectorSignature = "925006549b879c8d9e91c10a153254fb4b6e2241820a1b072e28aa2fa8caeb79"
)

var vectorTime = time.Unix(vectorTimestamp, 0)

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

// request builds a request signed with the vector's secret; edit mutates it before sending.
type request struct {
	id, ts, sig, event, attempt string
	body                        string
}

func validRequest() request {
	return request{
		id:      "d-1",
		ts:      strconv.Itoa(vectorTimestamp),
		sig:     vectorSignature,
		event:   "stream.updated",
		attempt: "1",
		body:    vectorBody,
	}
}

// signed returns r with ts replaced and signed with secret.
func (r request) signed(secret string, ts int64) request {
	r.ts = strconv.FormatInt(ts, 10)
	r.sig = receiver.Signature(secret, ts, []byte(r.body))
	return r
}

func (r request) http(ctx context.Context) *http.Request {
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(r.body))
	req.Header.Set("Content-Type", "application/json")
	for name, value := range map[string]string{
		receiver.HeaderDeliveryID: r.id,
		receiver.HeaderTimestamp:  r.ts,
		receiver.HeaderSignature:  r.sig,
		receiver.HeaderEvent:      r.event,
		receiver.HeaderAttempt:    r.attempt,
	} {
		if value != "" {
			req.Header.Set(name, value)
		}
	}
	return req
}

func serve(rc *receiver.Receiver, r request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	rc.ServeHTTP(w, r.http(context.Background()))
	return w
}

func TestSignatureVectors(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		secret string
		ts     int64
		body   string
		want   string
	}{
		{vectorSecret, vectorTimestamp, vectorBody, vectorSignature},
		{"s", 1710000000, "{}", "dc505f7c9b093137f0cefdcac425ed49f2ae97ee574217feb261c05855a6e876"},
	} {
		if got := receiver.Signature(v.secret, v.ts, []byte(v.body)); got != v.want {
			t.Errorf("Signature(%q, %d, %q) = %s, want %s", v.secret, v.ts, v.body, got, v.want)
		}
	}
	// The body is signed byte for byte: a trailing newline changes the signature.
	if receiver.Signature(vectorSecret, vectorTimestamp, []byte(vectorBody+"\n")) == vectorSignature {
		t.Errorf("a trailing newline did not change the signature")
	}
}

func TestReferenceVectorIsAccepted(t *testing.T) {
	t.Parallel()
	var got []receiver.Delivery
	rc := &receiver.Receiver{
		Secrets:    []string{vectorSecret},
		Now:        fixedClock(vectorTime),
		OnDelivery: func(d receiver.Delivery) { got = append(got, d) },
	}
	w := serve(rc, validRequest())
	if w.Code != http.StatusNoContent {
		t.Fatalf("status = %d (%s), want 204", w.Code, w.Body)
	}
	if len(got) != 1 {
		t.Fatalf("OnDelivery called %d times, want 1", len(got))
	}
	d := got[0]
	if d.ID != "d-1" || d.Event != "stream.updated" || d.Timestamp != vectorTimestamp || d.Attempt != 1 ||
		d.Secret != 0 || string(d.Body) != vectorBody || !d.ReceivedAt.Equal(vectorTime) || d.Status != 204 ||
		d.Header.Get("Content-Type") != "application/json" {
		t.Errorf("Delivery = %+v", d)
	}
}

// TestCheckOrder sends requests that fail several checks at once: the answer must be the
// first failing check's, in the original receiver's order.
func TestCheckOrder(t *testing.T) {
	t.Parallel()
	const tol = 300
	now := vectorTime
	big := strings.Repeat("x", receiver.DefaultMaxBody+1)
	exact := `"` + strings.Repeat("x", receiver.DefaultMaxBody-2) + `"`

	for _, tc := range []struct {
		name    string
		secrets []string
		edit    func(r request) request
		status  int
		reason  string
	}{
		{
			name: "no secret", secrets: []string{}, status: 500, reason: "secret",
			edit: func(r request) request { r.id, r.ts, r.sig, r.body = "", "x", "", big; return r },
		},
		{
			name: "only empty secrets", secrets: []string{"", ""}, status: 500, reason: "secret",
			edit: func(r request) request { return r },
		},
		{
			name: "missing delivery id first", status: 401, reason: receiver.HeaderDeliveryID,
			edit: func(r request) request { r.id, r.ts, r.sig, r.body = "", "", "", big; return r },
		},
		{
			name: "missing timestamp", status: 401, reason: receiver.HeaderTimestamp,
			edit: func(r request) request { r.ts, r.sig, r.body = "", "", big; return r },
		},
		{
			name: "missing signature", status: 401, reason: receiver.HeaderSignature,
			edit: func(r request) request { r.sig, r.ts, r.body = "", "abc", big; return r },
		},
		{
			name: "body too large before timestamp syntax", status: 413, reason: "larger",
			edit: func(r request) request { r.ts, r.sig, r.body = "abc", "bad", big; return r },
		},
		{
			name: "body of exactly the limit", status: 204,
			edit: func(r request) request { r.body = exact; return r.signed(vectorSecret, vectorTimestamp) },
		},
		{name: "timestamp not a number", status: 400, reason: "positive integer", edit: withTS("abc")},
		{name: "timestamp negative", status: 400, reason: "positive integer", edit: withTS("-1710000000")},
		{name: "timestamp zero", status: 400, reason: "positive integer", edit: withTS("0")},
		{name: "timestamp with plus sign", status: 400, reason: "positive integer", edit: withTS("+1710000000")},
		{name: "timestamp with space", status: 400, reason: "positive integer", edit: withTS(" 1710000000")},
		{name: "timestamp fractional", status: 400, reason: "positive integer", edit: withTS("1710000000.5")},
		{name: "timestamp overflows", status: 400, reason: "positive integer", edit: withTS("99999999999999999999")},
		{name: "timestamp too old, before signature", status: 401, reason: "tolerance", edit: withTS(strconv.Itoa(vectorTimestamp - tol - 1))},
		{name: "timestamp too new, before signature", status: 401, reason: "tolerance", edit: withTS(strconv.Itoa(vectorTimestamp + tol + 1))},
		{name: "timestamp far in the future", status: 401, reason: "tolerance", edit: withTS("9223372036854775807")},
		{
			name: "timestamp exactly tolerance old", status: 204,
			edit: func(r request) request { return r.signed(vectorSecret, vectorTimestamp-tol) },
		},
		{
			name: "timestamp exactly tolerance ahead", status: 204,
			edit: func(r request) request { return r.signed(vectorSecret, vectorTimestamp+tol) },
		},
		{
			name: "signature wrong", status: 401, reason: "signature",
			edit: func(r request) request { r.sig = strings.Repeat("0", 64); return r },
		},
		{
			name: "signature of another timestamp", status: 401, reason: "signature",
			edit: func(r request) request { s := r.signed(vectorSecret, vectorTimestamp-1).sig; r.sig = s; return r },
		},
		{
			name: "signature of another secret", status: 401, reason: "signature",
			edit: func(r request) request { return r.signed("other", vectorTimestamp) },
		},
		{
			name: "body changed", status: 401, reason: "signature",
			edit: func(r request) request { r.body += "\n"; return r },
		},
		{
			name: "signature upper case with spaces", status: 204,
			edit: func(r request) request { r.sig = "  " + strings.ToUpper(vectorSignature) + "\t"; return r },
		},
		{
			name: "previous secret", secrets: []string{"new", vectorSecret}, status: 204,
			edit: func(r request) request { return r },
		},
		{
			name: "current secret with a previous one set", secrets: []string{vectorSecret, "old"}, status: 204,
			edit: func(r request) request { return r },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			secrets := tc.secrets
			if secrets == nil {
				secrets = []string{vectorSecret}
			}
			var rejections []receiver.Rejection
			rc := &receiver.Receiver{
				Secrets:  secrets,
				Now:      fixedClock(now),
				OnReject: func(r receiver.Rejection) { rejections = append(rejections, r) },
			}
			w := serve(rc, tc.edit(validRequest()))
			if w.Code != tc.status {
				t.Fatalf("status = %d (%q), want %d", w.Code, w.Body, tc.status)
			}
			if tc.status >= 300 {
				if !strings.Contains(w.Body.String(), tc.reason) {
					t.Errorf("body = %q, want it to mention %q", w.Body, tc.reason)
				}
				if len(rejections) != 1 || rejections[0].Status != tc.status || !strings.Contains(rejections[0].Reason, tc.reason) {
					t.Errorf("OnReject got %+v", rejections)
				}
			}
		})
	}
}

func TestPreviousSecretIsReported(t *testing.T) {
	t.Parallel()
	var got receiver.Delivery
	rc := &receiver.Receiver{
		Secrets:    []string{"new", vectorSecret},
		Now:        fixedClock(vectorTime),
		OnDelivery: func(d receiver.Delivery) { got = d },
	}
	if w := serve(rc, validRequest()); w.Code != 204 {
		t.Fatalf("status = %d", w.Code)
	}
	if got.Secret != 1 {
		t.Errorf("Delivery.Secret = %d, want 1 (the previous secret)", got.Secret)
	}
}

func TestDuplicateIsRefused(t *testing.T) {
	t.Parallel()
	rc := &receiver.Receiver{Secrets: []string{vectorSecret}, Now: fixedClock(vectorTime), Status: 200}
	if w := serve(rc, validRequest()); w.Code != 200 {
		t.Fatalf("first = %d (%s), want 200", w.Code, w.Body)
	}
	// A retry signed later, with the same delivery id: every earlier check passes.
	retry := validRequest().signed(vectorSecret, vectorTimestamp+10)
	retry.attempt = "2"
	if w := serve(rc, retry); w.Code != 409 || !strings.Contains(w.Body.String(), "d-1") {
		t.Fatalf("duplicate = %d (%q), want 409 naming the id", w.Code, w.Body)
	}
	// The duplicate check is the last one: a bad signature on a seen id is still a 401.
	bad := validRequest()
	bad.sig = strings.Repeat("0", 64)
	if w := serve(rc, bad); w.Code != 401 {
		t.Fatalf("bad signature on a seen id = %d, want 401", w.Code)
	}
	other := validRequest().signed(vectorSecret, vectorTimestamp+1)
	other.id = "d-2"
	if w := serve(rc, other); w.Code != 200 {
		t.Fatalf("another id = %d, want 200", w.Code)
	}
	// The first request resent as is under a new id is a replay: its signature is known.
	replay := validRequest()
	replay.id = "d-3"
	if w := serve(rc, replay); w.Code != 409 || !strings.Contains(w.Body.String(), "another delivery id") {
		t.Fatalf("replay under a new id = %d (%q), want 409 saying so", w.Code, w.Body)
	}
}

func TestFailureStatusDoesNotRemember(t *testing.T) {
	t.Parallel()
	var deliveries int
	rc := &receiver.Receiver{
		Secrets:    []string{vectorSecret},
		Now:        fixedClock(vectorTime),
		Status:     503,
		OnDelivery: func(receiver.Delivery) { deliveries++ },
	}
	for i := range 3 {
		if w := serve(rc, validRequest()); w.Code != 503 {
			t.Fatalf("attempt %d = %d, want 503 every time (retries are not duplicates)", i+1, w.Code)
		}
	}
	if deliveries != 3 {
		t.Errorf("OnDelivery called %d times, want 3", deliveries)
	}
}

func TestDedupSetIsBounded(t *testing.T) {
	t.Parallel()
	// Two keys per delivery (the id and the signature): the set holds two deliveries.
	rc := &receiver.Receiver{Secrets: []string{vectorSecret}, Now: fixedClock(vectorTime), DedupSize: 4}
	send := func(id string) int {
		r := validRequest().signed(vectorSecret, vectorTimestamp+int64(id[0]-'a')) // a signed request of its own
		r.id = id
		return serve(rc, r).Code
	}
	for _, id := range []string{"a", "b", "c"} {
		if code := send(id); code != 204 {
			t.Fatalf("%s = %d", id, code)
		}
	}
	if code := send("c"); code != 409 {
		t.Errorf("recent id c again = %d, want 409", code)
	}
	if code := send("a"); code != 204 {
		t.Errorf("evicted id a again = %d, want 204 (the set holds 2 deliveries)", code)
	}
	if code := send("b"); code != 204 {
		t.Errorf("evicted id b again = %d, want 204", code)
	}
}

func TestConcurrentDuplicatesAcceptOnce(t *testing.T) {
	t.Parallel()
	rc := &receiver.Receiver{Secrets: []string{vectorSecret}, Now: fixedClock(vectorTime)}
	codes := make([]int, 16)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Go(func() { codes[i] = serve(rc, validRequest()).Code })
	}
	wg.Wait()
	counts := map[int]int{}
	for _, c := range codes {
		counts[c]++
	}
	if counts[204] != 1 || counts[409] != len(codes)-1 {
		t.Errorf("status counts = %v, want one 204 and the rest 409", counts)
	}
}

func TestDelay(t *testing.T) {
	t.Parallel()
	const delay = 50 * time.Millisecond
	rc := &receiver.Receiver{Secrets: []string{vectorSecret}, Delay: delay, Status: 202}
	srv := httptest.NewServer(rc)
	defer srv.Close()

	r := validRequest().signed(vectorSecret, time.Now().Unix())
	req := r.http(context.Background())
	req.RequestURI = ""
	req.URL, _ = req.URL.Parse(srv.URL)
	start := time.Now()
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 202 {
		t.Fatalf("status = %d, want 202", resp.StatusCode)
	}
	if elapsed := time.Since(start); elapsed < delay {
		t.Errorf("answered after %v, want at least the delay %v", elapsed, delay)
	}
}

// TestAbandonedRequestIsNotRemembered: a client that gave up during the delay will retry,
// and its retry must not be refused as a duplicate.
func TestAbandonedRequestIsNotRemembered(t *testing.T) {
	t.Parallel()
	var abandoned int
	rc := &receiver.Receiver{
		Secrets: []string{vectorSecret},
		Now:     fixedClock(vectorTime),
		Delay:   time.Hour,
		OnDelivery: func(d receiver.Delivery) {
			if d.Abandoned {
				abandoned++
			}
		},
	}
	for i := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		w := httptest.NewRecorder()
		rc.ServeHTTP(w, validRequest().http(ctx)) // returns at once: the client is gone
		if w.Code != 204 {
			t.Fatalf("abandoned attempt %d = %d, want 204 (not a duplicate)", i+1, w.Code)
		}
	}
	if abandoned != 2 {
		t.Errorf("deliveries reported as abandoned: %d, want 2", abandoned)
	}
}

func withTS(ts string) func(request) request {
	return func(r request) request { r.ts = ts; r.sig = "bad"; return r }
}

func FuzzReceiver(f *testing.F) {
	f.Add("d-1", strconv.Itoa(vectorTimestamp), vectorSignature, []byte(vectorBody))
	f.Add("", "", "", []byte{})
	f.Add("x", "-1", "zz", []byte("{}"))
	f.Add("x", "1710000300", " "+strings.ToUpper(vectorSignature), []byte(vectorBody))
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		rc := &receiver.Receiver{Secrets: []string{vectorSecret}, Now: fixedClock(vectorTime), MaxBody: 1 << 10}
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(body)))
		req.Header[http.CanonicalHeaderKey(receiver.HeaderDeliveryID)] = []string{id}
		req.Header[http.CanonicalHeaderKey(receiver.HeaderTimestamp)] = []string{ts}
		req.Header[http.CanonicalHeaderKey(receiver.HeaderSignature)] = []string{sig}
		w := httptest.NewRecorder()
		rc.ServeHTTP(w, req)
		switch w.Code {
		case 204:
			n, err := strconv.ParseInt(ts, 10, 64)
			if err != nil || id == "" || len(body) > 1<<10 ||
				strings.ToLower(strings.TrimSpace(sig)) != receiver.Signature(vectorSecret, n, body) {
				t.Fatalf("accepted id=%q ts=%q sig=%q body=%q", id, ts, sig, body)
			}
		case 400, 401, 413:
		default:
			t.Fatalf("status %d", w.Code)
		}
	})
}

func TestIDOnlyHandlesSameSignatureUnderNewID(t *testing.T) {
	t.Parallel()
	rc := &receiver.Receiver{Secrets: []string{vectorSecret}, Now: fixedClock(vectorTime), IDOnly: true}
	for _, id := range []string{"d-1", "d-2"} {
		r := validRequest()
		r.id = id
		if w := serve(rc, r); w.Code != 204 {
			t.Errorf("%s = %d (%q), want 204: IDOnly does not remember signatures", id, w.Code, w.Body)
		}
	}
}
