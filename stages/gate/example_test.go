package gate_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/memstore"
)

// A gate with a breaker that opens after two consecutive retryable failures. With REDIS_URL
// set, the store would be redisstore.Open(url, redisstore.Options{}) instead.
func ExampleNewBreakerGate() {
	g, err := gate.NewBreakerGate(memstore.New(memstore.Options{}), gate.Params{
		Threshold:    2,                // WEBHOOK_CIRCUIT_BREAKER_THRESHOLD
		Reset:        5 * time.Minute,  // WEBHOOK_CIRCUIT_BREAKER_RESET_MS
		RetryRPS:     10,               // WEBHOOK_RETRY_RPS
		RetryShare:   0.5,              // WEBHOOK_RETRY_SHARE: retries keep 5 of the 10 whatever the first attempts
		ProbeTimeout: 35 * time.Second, // the request timeout, plus time to settle
	}, gate.Hooks{
		OnTransition: func(from, to string) { fmt.Println("breaker:", from, "->", to) },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	ep := &delivery.Endpoint{URL: "https://consumer.example/hook", Hash: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}

	// Two attempts fail with 503; settle reports them.
	failed := []*delivery.Delivery{
		{ID: 1, Attempt: 1, Endpoint: ep, Outcome: delivery.Outcome{Kind: delivery.Retry, Status: 503}},
		{ID: 2, Attempt: 1, Endpoint: ep, Outcome: delivery.Outcome{Kind: delivery.Retry, Status: 503}},
	}
	g.Record(ctx, failed)

	// The next claimed batch is held back until the reset time, without a request.
	batch := []*delivery.Delivery{{ID: 3, Attempt: 2, Endpoint: ep}}
	g.Check(ctx, batch)
	fmt.Println(batch[0].Outcome.Kind, batch[0].Outcome.Reason, batch[0].Outcome.Delay.Round(time.Second))
	// Output:
	// breaker: closed -> open
	// defer circuit breaker open 5m0s
}
