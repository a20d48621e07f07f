package receiver_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/receiver"
)

// A receiver checking the requests it gets, here one signed like the test vector of testdata/signatures.json
// and then the same delivery again.
func ExampleReceiver() {
	rc := &receiver.Receiver{
		Secrets: []string{"topsecret"},
		Now:     func() time.Time { return time.Unix(1710000000, 0) }, // the vector's time
		OnDelivery: func(d receiver.Delivery) {
			fmt.Printf("delivery %s: %s %s\n", d.ID, d.Event, d.Body)
		},
		OnReject: func(r receiver.Rejection) {
			fmt.Printf("rejected %s: %d %s\n", r.DeliveryID, r.Status, r.Reason)
		},
	}
	srv := httptest.NewServer(rc)
	defer srv.Close()

	send := func(body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set("x-fluxora-delivery-id", "evt_1")
		req.Header.Set("x-fluxora-timestamp", "1710000000")
		req.Header.Set("x-fluxora-event", "stream.updated")
		req.Header.Set("x-fluxora-signature", receiver.Signature("topsecret", 1710000000, []byte(body)))
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	send(`{"event":"stream.updated"}`)
	send(`{"event":"stream.updated"}`)
	// Output:
	// delivery evt_1: stream.updated {"event":"stream.updated"}
	// 204
	// rejected evt_1: 409 verify: delivery id already received: "evt_1"
	// 409
}
