package sign_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/sign"
)

func ExampleSigner_Sign() {
	s, err := sign.New(sign.Config{Secret: "topsecret"})
	if err != nil {
		panic(err)
	}
	d := &delivery.Delivery{
		DeliveryID: "0b6f7d9e-1c1e-4c55-9d7e-2f3b6a1d0c42",
		EventType:  "stream.updated",
		Payload:    []byte(`{"event":"stream.updated"}`),
		Attempt:    1,
	}
	s.Sign(d, time.Unix(1710000000, 0))
	for _, name := range []string{"x-fluxora-delivery-id", "x-fluxora-timestamp", "x-fluxora-event", "x-fluxora-signature"} {
		fmt.Printf("%s: %s\n", name, d.Header.Get(name))
	}
	// Output:
	// x-fluxora-delivery-id: 0b6f7d9e-1c1e-4c55-9d7e-2f3b6a1d0c42
	// x-fluxora-timestamp: 1710000000
	// x-fluxora-event: stream.updated
	// x-fluxora-signature: 925006549b879c8d9e91c10a153254fb4b6e2241820a1b072e28aa2fa8caeb79
}

func ExampleVerifyFluxora() {
	// A consumer's handler, after reading the body (bounded to 256 KiB).
	h := http.Header{}
	h.Set("x-fluxora-delivery-id", "0b6f7d9e-1c1e-4c55-9d7e-2f3b6a1d0c42")
	h.Set("x-fluxora-timestamp", "1710000000")
	h.Set("x-fluxora-signature", "925006549b879c8d9e91c10a153254fb4b6e2241820a1b072e28aa2fa8caeb79")
	body := []byte(`{"event":"stream.updated"}`)
	now := time.Unix(1710000120, 0) // two minutes later

	// During a rotation, pass the current and the previous secret.
	err := sign.VerifyFluxora(h, body, now, sign.DefaultTolerance, []byte("new-secret"), []byte("topsecret"))
	fmt.Println("genuine:", err)

	err = sign.VerifyFluxora(h, []byte(`{"event":"stream.deleted"}`), now, sign.DefaultTolerance, []byte("topsecret"))
	fmt.Println("tampered:", err)
	// Output:
	// genuine: <nil>
	// tampered: sign: signature mismatch
}
