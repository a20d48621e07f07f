package outbox

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/fluxora/fluxhook/stages/send"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

//go:embed queries/enqueue.sql
var enqueueSQL string

//go:embed queries/enqueue_many.sql
var enqueueManySQL string

// Querier is the one method Enqueue needs, so that callers can pass their own pgx.Tx (the
// reason this package exists) as well as a *pgx.Conn or *pgxpool.Pool when there is no
// business write to pair the event with.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrInvalidEvent is wrapped by every validation error, so producers can tell a bug in the
// event they built (do not retry) from a database error (the transaction may be retried).
var ErrInvalidEvent = errors.New("outbox: invalid event")

// Event is one webhook to deliver. Only EventType and Payload are required; the zero value of
// every other field means the dispatcher's default.
type Event struct {
	// EventType is sent as the x-fluxora-event header, which is why it must be non-empty and
	// free of control characters.
	EventType string
	// Payload is the request body. json.RawMessage and []byte are stored as they are (they
	// must hold valid JSON), so producers that already have JSON do not pay for a round trip
	// through encoding/json; anything else, a string included, is passed to json.Marshal. Wrap
	// a string that already holds JSON in json.RawMessage, or it is sent as a JSON string.
	// PostgreSQL stores it as jsonb, so whitespace and key order are normalised once, at
	// enqueue; every delivery attempt then sends the same bytes.
	Payload any
	// StreamID groups events for the consumer's own bookkeeping and ordered delivery; "" stores
	// NULL. At most MaxStreamIDBytes.
	StreamID string
	// EndpointURL overrides the dispatcher's WEBHOOK_URL for this event; "" stores NULL, which
	// means WEBHOOK_URL. Enqueue refuses one the dispatcher can never call (no http(s) scheme or
	// host, credentials); its network policy (WEBHOOK_ROW_URL_NETWORKS: public addresses only
	// by default) is the dispatcher's, applied when it sends, and a URL it refuses ends in the
	// dead-letter table.
	EndpointURL string
	// Tenant scopes the event to one tenant (schema 5): it reaches only the managed endpoints
	// of that tenant, never another's, and not the default WEBHOOK_URL consumer. "" stores
	// NULL: an event without a tenant, for endpoints without one and for WEBHOOK_URL.
	Tenant string
	// DueAt delays the first attempt until an absolute time on the producer's clock. The zero
	// value means now on the database's clock, so that a producer with a skewed clock cannot
	// hold back or reorder events by accident.
	DueAt time.Time
	// Delay postpones the first attempt relative to DueAt, or, when DueAt is zero, relative to
	// the database's now(): use it for "in five minutes" so that only one clock is involved.
	Delay time.Duration
}

// Enqueued identifies the row Enqueue wrote. DeliveryID is what the consumer sees as
// x-fluxora-delivery-id on every attempt and replay, so it is the value to log or store next
// to the business record to correlate the two.
type Enqueued struct {
	ID         int64
	DeliveryID string
}

// Enqueue writes ev to the outbox through q, normally the caller's transaction, so that the
// event exists if and only if that transaction commits. The event is validated first; an
// invalid one returns an error wrapping ErrInvalidEvent without sending anything to the
// database, so the caller's transaction is not aborted by it.
func Enqueue(ctx context.Context, q Querier, ev Event) (Enqueued, error) {
	payload, err := validate(ev)
	if err != nil {
		return Enqueued{}, err
	}
	var out Enqueued
	err = q.QueryRow(ctx, enqueueSQL,
		ev.EventType, payload, ev.StreamID, ev.EndpointURL, dueAt(ev.DueAt), ev.Delay.Microseconds(), ev.Tenant,
	).Scan(&out.ID, &out.DeliveryID)
	if err != nil {
		return Enqueued{}, fmt.Errorf("outbox: enqueue %q: %w", ev.EventType, err)
	}
	return out, nil
}

// EnqueueMany writes evs in one statement and returns how many rows it inserted. It exists for
// producers that emit many events from one business change: one round trip instead of len(evs),
// and the dispatcher's wake-up trigger fires once rather than once per event. Every event is
// validated before the statement is sent; if any is invalid, none is written.
func EnqueueMany(ctx context.Context, q Querier, evs []Event) (int64, error) {
	if len(evs) == 0 {
		return 0, nil
	}
	var (
		types     = make([]string, len(evs))
		payloads  = make([]string, len(evs))
		streams   = make([]string, len(evs))
		endpoints = make([]string, len(evs))
		due       = make([]pgtype.Timestamptz, len(evs))
		delays    = make([]int64, len(evs))
		tenants   = make([]string, len(evs))
	)
	for i, ev := range evs {
		payload, err := validate(ev)
		if err != nil {
			return 0, fmt.Errorf("event %d: %w", i, err)
		}
		types[i], payloads[i], streams[i], endpoints[i] = ev.EventType, string(payload), ev.StreamID, ev.EndpointURL
		due[i], delays[i], tenants[i] = dueAt(ev.DueAt), ev.Delay.Microseconds(), ev.Tenant
	}
	var n int64
	if err := q.QueryRow(ctx, enqueueManySQL, types, payloads, streams, endpoints, due, delays, tenants).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: enqueue %d events: %w", len(evs), err)
	}
	return n, nil
}

// dueAt maps the zero time to NULL, which the queries replace with the database's now().
func dueAt(t time.Time) pgtype.Timestamptz {
	if t.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: t, Valid: true}
}

// MaxStreamIDBytes and MaxEndpointURLBytes are the outbox's limits on a row's stream_id and
// endpoint_url (schema 21's constraints webhook_outbox_stream_id_length and
// webhook_outbox_endpoint_url_length): the stream index, which ordered delivery reads, cannot
// hold longer keys.
const (
	MaxStreamIDBytes    = 256
	MaxEndpointURLBytes = 2048
)

// validate checks everything PostgreSQL or the dispatcher would reject later, and returns the
// payload as JSON text.
func validate(ev Event) ([]byte, error) {
	if ev.EventType == "" {
		return nil, fmt.Errorf("%w: EventType is empty", ErrInvalidEvent)
	}
	if i := strings.IndexFunc(ev.EventType, isControl); i >= 0 {
		return nil, fmt.Errorf("%w: EventType %q contains a control character at byte %d; it is sent as an HTTP header", ErrInvalidEvent, ev.EventType, i)
	}
	if strings.ContainsRune(ev.Tenant, 0) {
		return nil, fmt.Errorf("%w: Tenant contains a NUL byte, which PostgreSQL text cannot store", ErrInvalidEvent)
	}
	if strings.ContainsRune(ev.StreamID, 0) {
		return nil, fmt.Errorf("%w: StreamID contains a NUL byte, which PostgreSQL text cannot store", ErrInvalidEvent)
	}
	if strings.ContainsRune(ev.EndpointURL, 0) {
		return nil, fmt.Errorf("%w: EndpointURL contains a NUL byte, which PostgreSQL text cannot store", ErrInvalidEvent)
	}
	// The table's own limits (schema 21), said here with the field's name.
	if len(ev.StreamID) > MaxStreamIDBytes {
		return nil, fmt.Errorf("%w: StreamID is %d bytes, over the limit of %d; use a shorter id (a hash of a long one)",
			ErrInvalidEvent, len(ev.StreamID), MaxStreamIDBytes)
	}
	if len(ev.EndpointURL) > MaxEndpointURLBytes {
		return nil, fmt.Errorf("%w: EndpointURL is %d bytes, over the limit of %d", ErrInvalidEvent, len(ev.EndpointURL), MaxEndpointURLBytes)
	}
	if ev.EndpointURL != "" {
		// The dispatcher's own rules (scheme, host, credentials): a URL it can never call is
		// refused here rather than stored and dead-lettered. Its network policy is the
		// dispatcher's, applied when it sends.
		if err := send.ValidateURL(ev.EndpointURL); err != nil {
			return nil, fmt.Errorf("%w: EndpointURL: %v", ErrInvalidEvent, err)
		}
	}
	if ev.Delay < 0 {
		return nil, fmt.Errorf("%w: Delay %v is negative", ErrInvalidEvent, ev.Delay)
	}
	payload, err := encodePayload(ev.Payload)
	if err != nil {
		return nil, err
	}
	return payload, nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func encodePayload(p any) ([]byte, error) {
	var raw []byte
	switch v := p.(type) {
	case nil:
		return nil, fmt.Errorf("%w: Payload is nil; use json.RawMessage(`{}`) for an empty body", ErrInvalidEvent)
	case json.RawMessage:
		raw = v
	case []byte:
		raw = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("%w: Payload of type %T cannot be encoded as JSON: %w", ErrInvalidEvent, p, err)
		}
		raw = b
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("%w: Payload is not valid JSON: %q", ErrInvalidEvent, truncate(raw, 64))
	}
	if hasNULEscape(raw) {
		return nil, fmt.Errorf("%w: Payload contains \\u0000, which PostgreSQL jsonb cannot store", ErrInvalidEvent)
	}
	return raw, nil
}

// hasNULEscape reports whether a JSON string in raw decodes to a NUL character. The byte
// search keeps the common case cheap; only payloads that contain the escape's text are decoded
// (the text alone is not proof: `\\u0000` is a backslash followed by "u0000").
func hasNULEscape(raw []byte) bool {
	if !bytes.Contains(raw, []byte(`\u0000`)) {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if s, ok := tok.(string); ok && strings.ContainsRune(s, 0) {
			return true
		}
	}
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
