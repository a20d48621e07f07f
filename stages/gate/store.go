package gate

import (
	"context"
	"time"
)

// Store keeps the circuit breaker and rate-limit state of every endpoint and makes the
// decisions that need it atomically. It is batch-shaped so that a store shared across
// instances (Redis) costs one round trip per claimed batch and one per settled batch, however
// many rows and endpoints the batch holds; an implementation must make each endpoint's part of
// a call atomic (concurrent calls from any number of gates never interleave within one
// endpoint), because that is what makes a limit of 5 admit exactly 5.
//
// Every time a store compares or records comes from the store's own clock (Redis's TIME inside
// its scripts), never from the calling instance, so instances with skewed clocks agree.
//
// BreakerGate is the only intended caller; stores are separate so that the same gate logic runs
// on Redis (shared across instances and restarts) and in process (one instance, no Redis).
type Store interface {
	// Decide returns one EndpointDecision per check, in order. An error means no decision
	// was made for any endpoint (the gate fails open); an EndpointDecision with Err set
	// means that endpoint alone could not be decided.
	Decide(ctx context.Context, p Params, checks []EndpointCheck) ([]EndpointDecision, error)
	// Record applies the outcomes of one settled batch and returns the breaker transitions
	// they caused. It is best effort: the caller logs an error and carries on.
	Record(ctx context.Context, p Params, results []EndpointResult) ([]Transition, error)
	// Inspect reads the breaker state of the endpoints named by their hashes, for status
	// output and tests. It changes nothing.
	Inspect(ctx context.Context, hashes []string) ([]Snapshot, error)
}

// State is a circuit breaker's state. The strings are the values of the from_state and
// to_state labels of fluxora_webhook_circuit_breaker_transitions_total.
type State string

// The breaker states.
const (
	// Closed: attempts flow; consecutive retryable failures are counted.
	Closed State = "closed"
	// Open: every attempt is deferred until the reset time, with no HTTP request.
	Open State = "open"
	// HalfOpen: the reset time has passed; one probe at a time (across every instance) may
	// be attempted, and its outcome closes or re-opens the circuit.
	HalfOpen State = "half_open"
)

// Verdict is what the store decided for one row.
type Verdict uint8

// The verdicts. Allow and Probe mean "attempt now"; the others defer the row.
const (
	// Allow: attempt the row now.
	Allow Verdict = iota
	// Probe: attempt the row now as the half-open probe; the check's Token owns the probe
	// and must come back with the row's outcome.
	Probe
	// DeferOpen: the circuit is open; Delay is the time left until its reset.
	DeferOpen
	// DeferProbe: the circuit is half-open and another attempt holds the probe; Delay is
	// how long until that probe expires (Hooks.OnClosed tells when it succeeded sooner).
	DeferProbe
	// DeferRateLimit: a retry over the endpoint's rate limit; Delay is how long until the
	// slot the store handed it: when the window frees a place for it, or later, after the
	// slots of the retries deferred before it; for a retry that came back from such a
	// deferral (EndpointCheck.Returning), until the place promised to it.
	DeferRateLimit
)

// String names the verdict; it is also the deferral reason that settle records.
func (v Verdict) String() string {
	switch v {
	case Allow:
		return "allow"
	case Probe:
		return "probe"
	case DeferOpen:
		return "circuit breaker open"
	case DeferProbe:
		return "circuit breaker half-open: probe in flight"
	case DeferRateLimit:
		return "retry rate limit"
	default:
		return "unknown"
	}
}

// Deferred reports whether the verdict holds the row back.
func (v Verdict) Deferred() bool { return v >= DeferOpen }

// EndpointCheck is the part of one claimed batch that goes to one endpoint, in batch order.
type EndpointCheck struct {
	// Hash is the endpoint's delivery.Endpoint.Hash; the store never sees the URL.
	Hash string
	// Token is unique per check: it owns the probe if the store grants one, and it makes the
	// rate limiter's entries unique.
	Token string
	// Retry holds one entry per row: true when the row is a retry (attempt > 1), which the
	// rate limiter may refuse; first attempts are counted but never refused.
	Retry []bool
	// Returning holds one entry per row, or none (nil: no row is): true for a retry that comes
	// back from a rate-limit deferral (delivery.Delivery.DeferredBy). Refused again, it is
	// promised a place of its own ahead of the retries queued behind it, the next one the
	// window frees, rather than the end of the queue: it already waited its turn, and was
	// refused only because it came back a little earlier than the place it was handed freed
	// (the retry before it came back a little later than its own). Sent to the end, each such
	// miss cost a place of the rate. See the package documentation.
	Returning []bool
	// RetryRPS overrides Params.RetryRPS for this endpoint when positive (a managed
	// endpoint's retry_rps); its reserve follows from Params.RetryShare.
	RetryRPS int
}

// For returns the parameters that apply to the endpoint of check c: p with c's own rate limit
// when it has one. Stores decide each endpoint with them.
func (p Params) For(c EndpointCheck) Params {
	if c.RetryRPS > 0 && p.RetryRPS > 0 {
		p.RetryRPS = c.RetryRPS
	}
	return p
}

// RowDecision is the store's answer for one row.
type RowDecision struct {
	Verdict Verdict
	// Delay is how long a deferred row waits; zero for Allow and Probe.
	Delay time.Duration
}

// EndpointDecision answers one EndpointCheck.
type EndpointDecision struct {
	// Rows has one decision per row of the check, in order.
	Rows []RowDecision
	// Transitions are the breaker state changes this decision made (open → half_open when
	// it granted the probe).
	Transitions []Transition
	// Err is set when this endpoint could not be decided; Rows is then empty.
	Err error
}

// Result is what an attempt tells the breaker.
type Result uint8

// The results. Only Success and Failure move a closed breaker; a probe's owner gives the
// probe back with any of them.
const (
	// Success: the consumer answered 2xx. It resets the consecutive-failure count and,
	// from the probe, closes the circuit.
	Success Result = iota + 1
	// Failure: a retryable failure (network error, timeout, 408, 425, 429, 500, 502, 503,
	// 504). It counts toward the threshold and, from the probe, re-opens the circuit.
	Failure
	// Neutral: the consumer answered with a permanent status (other 4xx, 3xx, ...). It
	// leaves the breaker alone, as the original dispatcher does (docs/design.md, "The gate"); a probe that gets it is given back.
	Neutral
	// NotAttempted: no request was completed (released for saturation or shutdown). It
	// only gives back a probe.
	NotAttempted
)

// RowResult is one settled row as the breaker sees it.
type RowResult struct {
	Result Result
	// Token is the row's delivery.Delivery.GateToken: the probe it holds, or "".
	Token string
}

// EndpointResult is the part of one settled batch that went to one endpoint.
type EndpointResult struct {
	Hash string
	Rows []RowResult
}

// Transition is one real change of a breaker's state.
type Transition struct {
	// Hash names the endpoint (delivery.Endpoint.Hash).
	Hash     string
	From, To State
}

// Snapshot is an endpoint's breaker state at one moment, by the store's clock.
type Snapshot struct {
	Hash  string
	State State
	// Failures is the count of consecutive retryable failures while closed.
	Failures int
	// OpenFor is how long an open circuit stays open; zero once the reset time has passed
	// (the next attempt will be the half-open probe).
	OpenFor time.Duration
	// ProbeHeld reports whether a half-open probe is in flight.
	ProbeHeld bool
	// OpenSince is when the circuit opened for the current spell (open and half-open, until
	// a probe's success closes it), by the store's clock: a failed probe re-opens the circuit
	// and restarts OpenFor, but not OpenSince. It is an absolute time rather than an age so
	// that it names the spell: two snapshots of one spell carry the same OpenSince, whoever
	// takes them and whenever. Zero while closed, and when the store does not know it (a
	// Redis key written by a fluxhook that did not record it: a spell that began before an
	// upgrade, or a value no script wrote).
	OpenSince time.Time
	// FailedProbes counts the probes that failed since OpenSince: each one re-opened the
	// circuit for another reset time. Zero while closed; a probe that was given back (not
	// attempted, or a permanent answer) does not count.
	FailedProbes int
	// At is the store's clock when the snapshot was taken, so that the age of OpenSince is
	// At.Sub(OpenSince) whatever the skew between the store's clock and the caller's.
	At time.Time
}

// StateTTL bounds how long a store keeps an endpoint's breaker state after its last change
// (beyond an open circuit's reset time): state is kept only for endpoints with trouble, and an
// endpoint nobody has called for a day starts again closed rather than leaving keys behind.
const StateTTL = 24 * time.Hour
