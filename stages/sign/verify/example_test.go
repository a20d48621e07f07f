package verify_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// A consumer puts the middleware in front of its webhook handler, which then only sees
// verified, first-time deliveries. Here the request is the signed test vector of testdata/signatures.json, sent
// twice, then once with a tampered body.
func ExampleVerifier_Middleware() {
	v := &verify.Verifier{
		Secret: "topsecret", // the dispatcher's WEBHOOK_SECRET
		Previous: []verify.Previous{
			{Secret: "oldsecret", Until: time.Date(2024, 3, 10, 0, 0, 0, 0, time.UTC)}, // end of the rotation
		},
		Now: func() time.Time { return time.Unix(1710000000, 0) }, // the vector's time; leave nil in real code
	}
	if err := v.Validate(); err != nil {
		panic(err)
	}
	hook := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := verify.FromContext(r.Context())
		body, _ := io.ReadAll(r.Body) // the body is still there for the handler
		fmt.Printf("handling %s %s: %s\n", d.Event, d.ID, body)
		w.WriteHeader(http.StatusNoContent) // a 2xx: the id is remembered
	}))

	send := func(body string) {
		req := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(body))
		req.Header.Set("x-fluxora-delivery-id", "evt_1")
		req.Header.Set("x-fluxora-timestamp", "1710000000")
		req.Header.Set("x-fluxora-event", "stream.updated")
		req.Header.Set("x-fluxora-signature", "925006549b879c8d9e91c10a153254fb4b6e2241820a1b072e28aa2fa8caeb79")
		w := httptest.NewRecorder()
		hook.ServeHTTP(w, req)
		fmt.Println(strings.TrimSpace(fmt.Sprintf("answered %d %s", w.Code, w.Body)))
	}
	send(`{"event":"stream.updated"}`)
	send(`{"event":"stream.updated"}`)
	send(`{"event":"stream.deleted"}`)
	// Output:
	// handling stream.updated evt_1: {"event":"stream.updated"}
	// answered 204
	// answered 409 verify: delivery id already received: "evt_1"
	// answered 401 sign: signature mismatch
}

// Without net/http's handler chain (a queue consumer, another framework), Verify runs the
// stateless checks on a body already read, and Claim and Settle the duplicate check.
func ExampleVerifier_Verify() {
	v := &verify.Verifier{Secret: "s"}
	header := http.Header{}
	header.Set("x-fluxora-delivery-id", "evt_2")
	header.Set("x-fluxora-timestamp", "1710000000")
	header.Set("x-fluxora-signature", "dc505f7c9b093137f0cefdcac425ed49f2ae97ee574217feb261c05855a6e876")

	d, err := v.Verify(header, []byte(`{}`), time.Unix(1710000000, 0))
	fmt.Println(d.ID, err)

	_, err = v.Verify(header, []byte(`{}`), time.Unix(1710000000+301, 0))
	fmt.Println(verify.StatusOf(err), err)
	// Output:
	// evt_2 <nil>
	// 401 sign: timestamp outside tolerance: x-fluxora-timestamp 1710000000 is 301s from now, more than 300s
}
