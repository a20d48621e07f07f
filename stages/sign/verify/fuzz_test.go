package verify_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/sign"
	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// FuzzVerify feeds arbitrary headers, bodies and clocks to the checks, which face the open
// internet in a consumer. Beyond not panicking: every rejection is an *Error with the status
// of exactly one check; nothing is accepted that the wire format's definition rejects; and the
// middleware, which reads the body itself, answers exactly as Verify does.
func FuzzVerify(f *testing.F) {
	for _, v := range loadVectors(f) {
		ts, _ := strconv.ParseInt(v.Timestamp, 10, 64)
		f.Add("d-1", v.Timestamp, v.Signature, []byte(v.Body), v.Secret, ts)
		f.Add("d-1", v.Timestamp, " "+strings.ToUpper(v.Signature)+"\t", []byte(v.Body), v.Secret, ts+300)
		f.Add("d-1", v.Timestamp, v.Signature, []byte(v.Body), v.Secret, ts-301)
	}
	f.Add("", "", "", []byte(nil), "", int64(0))
	f.Add(" ", "-1", "zz", []byte("{}"), "s", int64(-1<<63))
	f.Add("x", "9223372036854775807", "00", []byte("{}"), "s", int64(1<<62))
	f.Add("x", "1710000000", vecSig, []byte(strings.Repeat("x", 1<<10+1)), vecSecret, int64(vecTS))

	const maxBody = 1 << 10
	statuses := map[error]int{
		verify.ErrNoSecret: 500, verify.ErrMissingHeader: 401, verify.ErrBodyTooLarge: 413,
		verify.ErrInvalidTimestamp: 400, verify.ErrTimestampOutOfTolerance: 401, verify.ErrSignatureMismatch: 401,
	}
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte, secret string, nowUnix int64) {
		now := time.Unix(nowUnix, 0)
		newVerifier := func() *verify.Verifier {
			return &verify.Verifier{
				Secret:   secret,
				Previous: []verify.Previous{{Secret: "previous", Until: now.Add(time.Second)}},
				MaxBody:  maxBody,
				Now:      fixedClock(now),
			}
		}
		h := http.Header{sign.HeaderDeliveryID: {id}, sign.HeaderTimestamp: {ts}, sign.HeaderSignature: {sig}}

		d, err := newVerifier().Verify(h, body, now)
		want := http.StatusNoContent
		if err != nil {
			e, ok := errors.AsType[*verify.Error](err)
			if !ok {
				t.Fatalf("error %#v is not an *Error", err)
			}
			matched := 0
			for sentinel, status := range statuses {
				if errors.Is(err, sentinel) {
					matched++
					if e.Status != status {
						t.Fatalf("%v answered %d, want %d", err, e.Status, status)
					}
				}
			}
			if matched != 1 {
				t.Fatalf("error %q matches %d of the check errors, want exactly one", err, matched)
			}
			want = e.Status
		} else {
			n, perr := strconv.ParseInt(ts, 10, 64)
			switch {
			case perr != nil || n <= 0 || ts[0] == '+':
				t.Fatalf("accepted timestamp %q", ts)
			case nowUnix-n > 300 || n-nowUnix > 300:
				t.Fatalf("accepted timestamp %d at %d", n, nowUnix)
			case strings.TrimSpace(id) == "" || len(body) > maxBody:
				t.Fatalf("accepted id %q, %d-byte body", id, len(body))
			}
			used := []string{secret, "previous"}[d.Secret]
			if used == "" || strings.ToLower(strings.TrimSpace(sig)) != sign.FluxoraSignature([]byte(used), ts, body) {
				t.Fatalf("accepted signature %q as secret %d", sig, d.Secret)
			}
			if d.ID != id || string(d.Body) != string(body) || d.Timestamp.Unix() != n {
				t.Fatalf("Delivery %+v does not reflect the request", d)
			}
		}

		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/", strings.NewReader(string(body)))
		req.Header = h
		w := httptest.NewRecorder()
		newVerifier().Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		})).ServeHTTP(w, req)
		if w.Code != want {
			t.Fatalf("middleware answered %d (%q), Verify %d (%v)", w.Code, w.Body, want, err)
		}
	})
}
