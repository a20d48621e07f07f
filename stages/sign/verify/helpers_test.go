package verify_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/sign"
	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// The test vector (testdata/signatures.json) every request here starts from, verified at its own timestamp.
const (
	vecSecret = "topsecret"
	vecTS     = 1710000000
	vecBody   = `{"event":"stream.updated"}`
	vecSig    = "925006549b879c8d9e91c10a153254fb4b6e2241820a1b072e28aa2fa8caeb79"
)

var vecTime = time.Unix(vecTS, 0)

func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }

// request is a webhook request that a case breaks in one or more ways. An empty field is an
// absent header.
type request struct {
	id, ts, sig, event, attempt string
	body                        string
}

func validRequest() request {
	return request{id: "d-1", ts: strconv.Itoa(vecTS), sig: vecSig, event: "stream.updated", attempt: "1", body: vecBody}
}

// signed returns r re-signed with secret at ts.
func (r request) signed(secret string, ts int64) request {
	r.ts = strconv.FormatInt(ts, 10)
	r.sig = sign.FluxoraSignature([]byte(secret), r.ts, []byte(r.body))
	return r
}

func (r request) header() http.Header {
	h := http.Header{"Content-Type": {"application/json"}}
	for name, value := range map[string]string{
		sign.HeaderDeliveryID: r.id,
		sign.HeaderTimestamp:  r.ts,
		sign.HeaderSignature:  r.sig,
		sign.HeaderEvent:      r.event,
		sign.HeaderAttempt:    r.attempt,
	} {
		if value != "" {
			h[name] = []string{value}
		}
	}
	return h
}

func (r request) http(ctx context.Context) *http.Request {
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/hook", strings.NewReader(r.body))
	req.Header = r.header()
	return req
}

// outcome is what a path through the package answered: the status, and the error for a
// rejection.
type outcome struct {
	status int
	err    error  // from the function API
	body   string // from the middleware
}

// viaFunctions runs the plain function API the way its documentation says: Verify, Claim,
// then Settle as acknowledged.
func viaFunctions(v *verify.Verifier, r request) outcome {
	d, err := v.Verify(r.header(), []byte(r.body), v.Now())
	if err == nil {
		err = v.Claim(context.Background(), d.ID)
	}
	if err != nil {
		return outcome{status: verify.StatusOf(err), err: err}
	}
	if err := v.Settle(context.Background(), d.ID, true); err != nil {
		return outcome{status: verify.StatusOf(err), err: err}
	}
	return outcome{status: http.StatusNoContent}
}

// viaMiddleware serves r through Middleware in front of a handler answering 204.
func viaMiddleware(t *testing.T, v *verify.Verifier, r request) outcome {
	t.Helper()
	called := false
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		called = true
		w.WriteHeader(http.StatusNoContent)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r.http(context.Background()))
	if called != (w.Code == http.StatusNoContent) {
		t.Errorf("next called = %v with answer %d: next must run exactly for accepted requests", called, w.Code)
	}
	return outcome{status: w.Code, body: w.Body.String()}
}

// failingStore is a DedupStore whose backend is down.
type failingStore struct{ claim, settle error }

func (s failingStore) Claim(context.Context, string) error { return s.claim }
func (s failingStore) Settle(context.Context, string, bool) error {
	return s.settle
}

var errBackend = errors.New("backend unreachable")

// vectorsPath is the repository's shared vector file, computed apart from the Go code.
var vectorsPath = filepath.Join("..", "..", "..", "testdata", "signatures.json")

type fluxoraVector struct {
	Name           string `json:"name"`
	Secret         string `json:"secret"`
	PreviousSecret string `json:"previous_secret"`
	Timestamp      string `json:"timestamp"`
	Body           string `json:"body"`
	Signature      string `json:"signature"`
}

func loadVectors(tb testing.TB) []fluxoraVector {
	tb.Helper()
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		tb.Fatalf("read vectors: %v", err)
	}
	var v struct {
		Fluxora []fluxoraVector `json:"fluxora"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		tb.Fatalf("parse %s: %v", vectorsPath, err)
	}
	if len(v.Fluxora) == 0 {
		tb.Fatalf("%s holds no Fluxora vectors", vectorsPath)
	}
	return v.Fluxora
}

// unreadable is a body that fails, like a client hanging up mid-request; read reports
// whether anyone tried.
type unreadable struct{ read bool }

func (u *unreadable) Read([]byte) (int, error) { u.read = true; return 0, io.ErrUnexpectedEOF }
