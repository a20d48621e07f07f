package gate

import (
	"context"

	"github.com/fluxora/fluxhook/stages/delivery"
)

// Gate is what the dispatcher asks before attempting rows and tells after settling them.
type Gate interface {
	// Check decides for every row of batch. A row that may be attempted now keeps
	// Outcome.Kind == delivery.Undecided; a held row gets Outcome{Kind: delivery.Defer,
	// Delay: wait, Reason: why}. Check never fails: a gate that cannot reach its store allows
	// the delivery (fail open), because delivering is what never loses an event.
	Check(ctx context.Context, batch []*delivery.Delivery)
	// Record reports the outcomes of a settled batch (best effort).
	Record(ctx context.Context, batch []*delivery.Delivery)
}

// Inspector is implemented by a gate whose breaker state can be read (BreakerGate). The
// dispatcher reads it while its claims hold an endpoint behind a half-open probe, which may be
// another instance's: only the instance that records a probe's end learns of it otherwise.
type Inspector interface {
	// Inspect returns the breaker state of the endpoints named by hashes, in order, or an
	// error when the state could not be read (the caller keeps what it knew).
	Inspect(ctx context.Context, hashes []string) ([]Snapshot, error)
}

// AllowAll is the gate with no breaker and no rate limit: every row is attempted.
type AllowAll struct{}

// Check allows every row.
func (AllowAll) Check(context.Context, []*delivery.Delivery) {}

// Record ignores outcomes.
func (AllowAll) Record(context.Context, []*delivery.Delivery) {}

// Func adapts a function to a Gate whose Record does nothing; tests use it to hold rows back.
type Func func(ctx context.Context, batch []*delivery.Delivery)

// Check calls f.
func (f Func) Check(ctx context.Context, batch []*delivery.Delivery) { f(ctx, batch) }

// Record ignores outcomes.
func (Func) Record(context.Context, []*delivery.Delivery) {}
