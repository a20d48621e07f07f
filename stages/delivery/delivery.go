// Package delivery holds the one value every stage passes along: a claimed outbox row and,
// once a stage has decided, its outcome.
//
// It is deliberately a plain data package with no behaviour of its own, so that the stages
// can depend on it without depending on each other.
package delivery

import (
	"net/http"
	"net/url"
	"time"
)

// Delivery is one claimed outbox row on its way from claim to settle.
type Delivery struct {
	// ID is the outbox row's primary key; retries are new rows with new IDs.
	ID int64
	// DeliveryID is stable across every attempt and replay of one event.
	DeliveryID string
	StreamID   string
	EventType  string
	// Payload is the exact body sent on every attempt: the stored jsonb, compacted once.
	Payload []byte
	// Attempt is 1 for the first try.
	Attempt    int
	EnqueuedAt time.Time
	// DueAt is the row's created_at: when this attempt became due.
	DueAt time.Time
	// EndpointURL is the row's own endpoint_url; empty means the configured default.
	EndpointURL string
	// EndpointID is the managed endpoint (webhook_endpoints) this delivery goes to; empty for
	// an event row and for rows sent to EndpointURL or the configured default.
	EndpointID string
	// Tenant is the event's tenant, empty for none: it reaches only its tenant's endpoints.
	Tenant string
	// EmptyTenant says the row's tenant is the empty string rather than NULL. Routing tells
	// the two apart, as SQL does (an endpoint without a tenant takes only events without one),
	// so such an event is never routed in memory.
	EmptyTenant bool
	// Routed says the event was already fanned out to its endpoints (routed_at is set), so
	// this row is the default consumer's delivery, never routed again.
	Routed bool
	// Invalid, when set, is why the claim found the row can never be sent (its dead-letter
	// reason); the dispatcher dead-letters it without an attempt.
	Invalid string
	// Oversize, when set, is why the payload may not be sent (over WEBHOOK_MAX_PAYLOAD_BYTES,
	// found by the claim): its dead-letter reason. Payload is then nil when the body was too
	// large to read at all. Unlike Invalid, it does not keep an event from being routed: each
	// of its deliveries is dead-lettered by its own endpoint's rules (an ordered stream that
	// stops on a failure stops).
	Oversize string
	// LeaseToken is the token of the claim that leased the row. Settle writes the row's
	// outcome only while the row still carries it (and this instance's id): a holder whose
	// lease ran out and whose row another claim took has its outcome refused (Outcome.Stale).
	LeaseToken int64
	// OrderKey is the row's place in its stream when its consumer orders streams (schema 6):
	// its event's id (an event replayed into a stream it had no place in: its new row's id),
	// kept by every retry and replay. 0: unordered.
	OrderKey int64
	// SendBy is the latest moment an attempt may start: just before the row's lease ends
	// (by the wall clock); zero means no limit. A dispatcher that was paused past it (a
	// stop-the-world pause, SIGSTOP, a suspended VM, a starved CPU) releases the row instead
	// of sending it: another instance may already have claimed and sent it, and the settle
	// would be refused anyway.
	SendBy time.Time
	// DeferredBy is the reason of the gate's deferral this attempt comes back from (the row's
	// deferred_reason, as the claim read it), "" for none. The rate limiter promises a retry
	// that comes back from its deferral and is refused again a place of its own ahead of the
	// endpoint's queue, not its end: it already waited its turn there (see package gate).
	DeferredBy string
	// StopStream: the row is ordered and its consumer stops the stream, rather than skipping
	// the event, when it is dead-lettered (ordering_failure 'stop').
	StopStream bool

	// Endpoint is the validated target, set when the row is prepared. It is shared by every
	// row that goes to the same URL.
	Endpoint *Endpoint
	// Header holds the signed request headers, set by the sign stage.
	Header http.Header

	// GateToken is set by the gate when this attempt holds something the gate must get back
	// with the outcome (the circuit breaker's half-open probe ownership); empty otherwise.
	GateToken string
	// ProbeEnded and NextProbe are set by the gate's Record on a row that held the half-open
	// probe and did not close the circuit, because the rows and claims held behind that probe
	// wait for its expiry, which only a success cuts short otherwise: NextProbe is how long
	// after the record the endpoint's next probe may go, the breaker's reset after a
	// retryable failure (which re-opened the circuit), 0 when the probe was given back (a
	// permanent answer, or no request).
	ProbeEnded bool
	NextProbe  time.Duration
	// RecheckIn is set by the gate's Check on a row it deferred behind a half-open probe
	// that another attempt holds, when shorter than the row's Delay: the breaker's reset.
	// That probe may be another instance's, and only the instance that records its end
	// learns of it, so the claims hold the endpoint for RecheckIn at most, not for the
	// probe's whole remaining time, and then let the gate decide on its due rows afresh:
	// another instance's recovery reaches this one within a reset. (A gate that can be read,
	// gate.Inspector, tells the claims sooner: they read the breaker before each claim.) The
	// row itself keeps its Delay (the probe's end brings it forward). 0: the claims may hold
	// for the Delay.
	RecheckIn time.Duration

	// Anchor, when set, says this delivery has no row of its own: its event was routed in
	// memory and the event's row, still leased, holds it (see Anchor).
	Anchor *Anchor

	// Outcome is set by whichever stage finishes with the row.
	Outcome Outcome
}

// Anchor is an event routed to its endpoints in memory. Its row stays in the queue, leased by
// the claim that took it, as the one durable record of all its deliveries, until the first of
// them is settled: that settle replaces the row (the event to the delivery log, delivered
// deliveries to the log, every other delivery to a leased row of its own, see
// settle.SettleAnchored). The settling stage alone reads and writes it after routing.
type Anchor struct {
	// EventID and LeaseToken are the event row's id and its claim's token.
	EventID, LeaseToken int64
	// Endpoints are the ids of every endpoint the event goes to.
	Endpoints []string
	// Settled says the event row was replaced; Rows then holds the ids of the deliveries that
	// became rows, by endpoint id, leased with Token.
	Settled bool
	Rows    map[string]int64
	Token   int64
	// Lost says the event row could not be replaced (its lease ran out and another claim took
	// it, or the database failed): the event comes back whole after its lease, and outcomes
	// of its deliveries that come back later are not written either. Stale tells which.
	Lost, Stale bool
}

// Endpoint is a validated consumer URL. Values are created once per distinct URL and shared.
type Endpoint struct {
	// URL is the full URL, possibly with a query string; it is never logged.
	URL string
	// Parsed is URL parsed once when the endpoint was validated, so that no request parses
	// it again; nil means parse URL per request (endpoints built by hand in tests).
	Parsed *url.URL
	// Hash is the lower-case hex SHA-256 of URL: the name under which the endpoint appears in
	// logs, metrics and Redis keys.
	Hash string
	// Key is the value the claim statement excludes while the endpoint is saturated: the row's
	// endpoint_url, "" for the configured default, "ep:<id>" for a managed endpoint.
	Key string
	// Concurrency overrides the configured per-endpoint concurrency when positive (a managed
	// endpoint's max_concurrency).
	Concurrency int
	// RowURL says URL is a row's endpoint_url, written by a producer rather than configured
	// by the operator (send.Sender.Endpoint sets it), or a restricted managed endpoint's,
	// written by a tenant through the management API (the dispatcher sets it): the send stage
	// then dials it under the row-URL network policy (WEBHOOK_ROW_URL_NETWORKS), which lets no
	// loopback or private address through unless the operator allowed it, so that whoever may
	// insert into the outbox, or hold a tenant's API key, cannot make the dispatcher POST to
	// this machine's or the internal network's ports.
	RowURL bool
	// RetryRPS overrides the configured retry rate limit when positive (a managed endpoint's
	// retry_rps).
	RetryRPS int
	// PermanentStatuses overrides the sender's permanent statuses (WEBHOOK_PERMANENT_STATUSES)
	// when not nil (a managed endpoint's permanent_statuses): the answers dead-lettered at
	// once besides 410 Gone. An empty, non-nil list dead-letters none but 410.
	PermanentStatuses []int
	// Managed says this is a managed endpoint (webhook_endpoints), which takes only the events
	// of its tenant: Tenant, with EmptyTenant telling a tenant stored as the empty string from
	// none (NULL), as routing does. Endpoint values are built per load of the endpoints, so
	// the URL and the tenant here come from one version of the endpoint.
	Managed     bool
	Tenant      string
	EmptyTenant bool
}

// Origin is the URL's scheme, host and port ("https://hooks.example.com:8443"), or "" when
// the URL does not parse. Logs name a consumer by it: an operator sees which consumer a line is
// about, and never its path, query or credentials, where tokens live.
func (e *Endpoint) Origin() string {
	u := e.Parsed
	if u == nil {
		return URLOrigin(e.URL)
	}
	return origin(u)
}

// URLOrigin is Endpoint.Origin for a URL that has no Endpoint (a row's endpoint_url refused
// before it got one).
func URLOrigin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return origin(u)
}

func origin(u *url.URL) string {
	if u.Scheme == "" || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// Admits reports whether d may be sent to e: always for an endpoint_url or the configured
// default, and for a managed endpoint only when d's event has the endpoint's tenant (both
// none, or equal). The send stage asks it where the request is built, so that no path
// (routing, a retry, a deferral, a replay) can carry an event to another tenant's URL,
// whatever a stale cache or a changed endpoint made of the row before.
func (e *Endpoint) Admits(d *Delivery) bool {
	return !e.Managed || d.Tenant == e.Tenant && d.EmptyTenant == e.EmptyTenant
}

// Kind is what settle does with a row.
type Kind uint8

// The outcomes a row can have. The zero value means "not decided yet".
const (
	// Undecided is the zero value: no stage has finished with the row.
	Undecided Kind = iota
	// Delivered: the consumer answered 2xx, or 409 to a delivery id it already had
	// (Outcome.AlreadyDelivered).
	Delivered
	// Retry: a retryable failure; settle schedules the next attempt or, when the schedule is
	// exhausted, dead-letters the event.
	Retry
	// Permanent: will never succeed (4xx other than the retryable ones, 3xx, an invalid row);
	// settle dead-letters it at once.
	Permanent
	// Defer: the gate held the row back; settle re-enqueues it due after Delay with the same
	// attempt number: no attempt is used.
	Defer
	// Release: the row was not attempted (its endpoint was saturated, or shutdown cancelled
	// it); settle shortens its lease so that it is claimed again after Delay.
	Release
)

// String names the kind for logs.
func (k Kind) String() string {
	switch k {
	case Delivered:
		return "delivered"
	case Retry:
		return "retry"
	case Permanent:
		return "permanent"
	case Defer:
		return "defer"
	case Release:
		return "release"
	default:
		return "undecided"
	}
}

// Outcome is the result of one attempt, or the reason there was none.
type Outcome struct {
	Kind Kind
	// Status is the HTTP status code, 0 when no response was received.
	Status int
	// Error describes a failed attempt (network error, status) for the outbox's error column.
	Error string
	// Reason is the dead-letter reason for Permanent outcomes that are not an HTTP status,
	// for example an invalid endpoint_url.
	Reason string
	// Detail is what the dispatcher's log adds to Reason and nothing stores: for a URL a
	// producer or a tenant wrote, the network policy's refusal whole (the address its host
	// resolved to, the setting that would allow it), which the dead letter a tenant reads
	// leaves out.
	Detail string
	// Duration is how long the HTTP attempt took.
	Duration time.Duration
	// Excerpt is the start of the consumer's response body, so that the delivery log (and a
	// dead letter) can show what the consumer answered, not only its status: at most
	// send.Config.ResponseExcerptBytes bytes, valid UTF-8 (invalid bytes replaced) and without
	// NUL, which PostgreSQL's text refuses. Excerpted says it was read: settle stores NULL
	// without it (no response, or excerpts off) and Excerpt, possibly empty, with it.
	Excerpt   string
	Excerpted bool
	// Delay is, for Retry, the minimum wait the consumer asked for with Retry-After (0 when
	// it did not); for Defer and Release, the wait before the row is due again.
	Delay time.Duration
	// Unsettled says settle could not write this outcome: the database refused both the
	// row's settlement and its dead letter (settle.Result.Unsettled), and the row comes back
	// after its lease. Kind still says what the attempt did, for the breaker; Reason says why
	// it could not be written.
	Unsettled bool
	// AlreadyDelivered says a Delivered outcome is the consumer's 409 Conflict to a delivery
	// id it had already accepted (send.Config.Conflict409Delivered), not a 2xx to this
	// attempt: typically an earlier attempt timed out on our side after the consumer stored
	// it. The event is delivered either way; the flag lets logs and counters tell the two apart.
	AlreadyDelivered bool
	// Stale says settle refused this outcome because the row's lease was no longer this
	// attempt's: it ran out and another claim took the row (or settled it). The current
	// holder's outcome is the one written; this one is counted and logged, never reported
	// to the breaker or the delivery metrics as if it had been.
	Stale bool
}
