// Package events reads what became of the events producers enqueued: the events themselves,
// their deliveries to each destination with every attempt, and an endpoint's deliveries, from
// the delivery log (webhook_delivery_log), the queue (webhook_outbox) and the dead letters.
// It is the management API's read side of the pipeline; it writes nothing.
//
// An event is one delivery id: what the producer enqueued, and the id consumers see. Its rows
// are the producer's own row (pending in the queue until it is routed or attempted, then in
// the log), the delivery rows routing made for each endpoint it matched, the retries of
// either, and the rows of replays, all carrying the event's type, stream, tenant, payload and
// enqueued_at. Reads by id go through delivery_id; an endpoint's deliveries walk the log's
// (endpoint_id, processed_at) index back from the cursor and stop after a page; the event
// listing reads the log by time (its block-range index on processed_at) in windows that widen
// until a page is full, so that a page of recent rows reads only recent rows.
//
// Every statement takes the caller's scope: a tenant's rows only, in its WHERE clause.
package events

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

var (
	//go:embed queries/rows.sql
	rowsSQL string
	//go:embed queries/list.sql
	listSQL string
	//go:embed queries/endpoint.sql
	endpointSQL string
)

// Querier runs the listings' statements: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Batcher runs the reads of one event and of an endpoint's deliveries: a pool, a connection
// or a transaction (whose later statements then keep the generic plans, see queryGeneric).
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// genericPlanSQL makes the statements after it, to the end of their transaction, use their
// prepared statement's generic plan.
const genericPlanSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`

// queryGeneric runs sql with its prepared statement's generic plan from its first execution,
// and collects its rows with scan. PostgreSQL plans a prepared statement's first five
// executions on each connection for their parameters (a custom plan), then keeps the generic
// plan when it costs no more. The reads of one event and of an endpoint's deliveries reach
// every partition of the delivery log: a custom plan costs 1–3 ms of CPU to plan, about three
// times what its execution costs, and the generic plan prunes the partitions when it starts
// and seeks the same indexes. The setting is sent with the statement, one round trip (a batch
// is one implicit transaction, which the setting lasts for), so that no other statement of
// the connection is planned otherwise.
func queryGeneric[T any](ctx context.Context, b Batcher, scan func(pgx.CollectableRow) (T, error), sql string, args ...any) ([]T, error) {
	batch := &pgx.Batch{}
	batch.Queue(genericPlanSQL)
	batch.Queue(sql, args...)
	br := b.SendBatch(ctx, batch)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	rs, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	out, err := pgx.CollectRows(rs, scan)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return out, err
}

// Scope is whose events a caller may see: nil is every tenant's (an admin key), otherwise only
// that tenant's. Events without a tenant belong to no tenant key.
type Scope = *string

// ErrNotFound is the error for a delivery id with no row in the caller's scope: one that does
// not exist, is not a UUID, was dropped by retention, or is another tenant's.
var ErrNotFound = errors.New("event not found")

// Event is what the producer enqueued.
type Event struct {
	DeliveryID string
	EventType  string
	StreamID   *string
	Tenant     *string
	EnqueuedAt time.Time
}

// Destination states.
const (
	StatePending      = "pending"       // its first attempt (or the first after a replay) waits
	StateRetrying     = "retrying"      // an attempt failed and the next waits
	StateDelivered    = "delivered"     // its last attempt succeeded
	StateDeadLettered = "dead_lettered" // it gave up; a replay would start it again
)

// Attempt outcomes and endpoint delivery statuses (besides pending).
const (
	OutcomeDelivered    = "delivered"
	OutcomeFailed       = "failed" // and retried
	OutcomeDeadLettered = "dead_lettered"
)

// Detail is one event with its deliveries, as Get reads it.
type Detail struct {
	Event
	// RoutedAt is when the event was fanned out to the managed endpoints; nil while it waits
	// to be routed and for an event never routed (no endpoint existed, or it named its own URL).
	RoutedAt *time.Time
	// Payload is the event's body (only when Get was asked for it).
	Payload json.RawMessage
	// Destinations are where the event went, in the order they were first written.
	Destinations []Destination
}

// Destination is where one event was sent: a managed endpoint, the URL the producer named on
// the row (endpoint_url), or the dispatchers' WEBHOOK_URL (neither).
type Destination struct {
	// EndpointID is the managed endpoint; nil for a URL.
	EndpointID *string
	// URL is the row's endpoint_url, in full (it may hold a token: callers show its origin);
	// nil for a managed endpoint and for WEBHOOK_URL.
	URL *string
	// State is StatePending, StateRetrying, StateDelivered or StateDeadLettered.
	State string
	// Attempts are the settled attempts, oldest first, across replays.
	Attempts []Attempt
	// NextAttemptAt is when the pending attempt is due (in the past while it waits for a
	// dispatcher or is being made); nil unless pending or retrying.
	NextAttemptAt *time.Time
	// DeadLetter is the destination's last dead letter, when its state is dead-lettered and
	// the dead letter was not purged.
	DeadLetter *DeadLetter
	first      int64
}

// Attempt is one settled attempt.
type Attempt struct {
	Attempt         int
	ProcessedAt     time.Time
	DurationMS      *int
	StatusCode      *int
	Error           *string
	ResponseExcerpt *string
	// Outcome is OutcomeDelivered, OutcomeFailed (retried) or OutcomeDeadLettered.
	Outcome string
}

// DeadLetter is the dead letter a delivery left.
type DeadLetter struct {
	ID         int64
	Reason     string
	FailedAt   time.Time
	ReplayedAt *time.Time
}

// delivered is the success rule every reader of the log shares (the endpoint health's hourly
// counts too): a 2xx, or a 409 the dispatcher settled delivered (the consumer had the event),
// which has no error, where a 409 retried or dead-lettered has one.
func delivered(status *int, errText *string) bool {
	return status != nil && (*status >= 200 && *status <= 299 || *status == 409 && errText == nil)
}

// row is one row of rows.sql.
type row struct {
	src                     string
	id                      int64
	attempt                 int
	endpointID, endpointURL *string
	routedAt, dueAt         *time.Time
	parked                  bool
	processedAt             *time.Time
	statusCode              *int
	errText                 *string
	durationMS              *int
	excerpt                 *string
	eventType               string
	streamID, tenant        *string
	enqueuedAt              time.Time
	payload                 *string
	routing                 bool
}

// key names a row's destination: its endpoint, its own URL, or WEBHOOK_URL ("").
func (r row) key() string {
	switch {
	case r.endpointID != nil:
		return "ep:" + *r.endpointID
	case r.endpointURL != nil:
		return "url:" + *r.endpointURL
	}
	return ""
}

// Get reads the event deliveryID in scope with its destinations, each with every attempt, and
// its payload when payload is set. ErrNotFound when the scope sees no row of it.
//
// Two kinds of row are the event's, not a delivery's, and are left out of the destinations:
// its routing row in the log (the producer's row settled by routing, saying how many endpoints
// matched: no endpoint, and routed_at equal to processed_at, both that statement's now()), and
// its row waiting in the queue to be routed (attempt 1, no endpoint, no URL, not routed, while
// some endpoint exists: routing decides where it goes).
//
// One statement (rows.sql) reads the rows and the dead letters, so both come from one
// snapshot: a settle between two reads could show a dead letter without the attempt that
// made it.
func Get(ctx context.Context, q Batcher, deliveryID string, scope Scope, payload bool) (Detail, error) {
	if !ValidID(deliveryID) {
		return Detail{}, ErrNotFound
	}
	var dead []deadLetterRow
	rows, err := queryGeneric(ctx, q, func(r pgx.CollectableRow) (row, error) {
		var x row
		var deadJSON []byte
		err := r.Scan(&x.src, &x.id, &x.attempt, &x.endpointID, &x.endpointURL, &x.routedAt, &x.dueAt, &x.parked,
			&x.processedAt, &x.statusCode, &x.errText, &x.durationMS, &x.excerpt, &x.eventType, &x.streamID,
			&x.tenant, &x.enqueuedAt, &x.payload, &x.routing, &deadJSON)
		if err == nil && deadJSON != nil && dead == nil {
			dead = []deadLetterRow{}
			err = json.Unmarshal(deadJSON, &dead)
		}
		return x, err
	}, rowsSQL, deliveryID, scope, payload)
	if err != nil {
		return Detail{}, fmt.Errorf("reading event %s: %w", deliveryID, err)
	}
	if len(rows) == 0 {
		return Detail{}, ErrNotFound
	}
	return assemble(strings.ToLower(deliveryID), rows, dead), nil
}

// deadLetterRow is one of the dead letters rows.sql returns, as JSON.
type deadLetterRow struct {
	DeadLetter
	outboxID                *int64
	endpointID, endpointURL *string
}

// UnmarshalJSON reads one element of rows.sql's array of dead letters.
func (d *deadLetterRow) UnmarshalJSON(b []byte) error {
	var v struct {
		ID          int64      `json:"id"`
		OutboxID    *int64     `json:"outbox_id"`
		EndpointID  *string    `json:"endpoint_id"`
		EndpointURL *string    `json:"endpoint_url"`
		Reason      string     `json:"reason"`
		FailedAt    time.Time  `json:"failed_at"`
		ReplayedAt  *time.Time `json:"replayed_at"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*d = deadLetterRow{DeadLetter: DeadLetter{ID: v.ID, Reason: v.Reason, FailedAt: v.FailedAt, ReplayedAt: v.ReplayedAt},
		outboxID: v.OutboxID, endpointID: v.EndpointID, endpointURL: v.EndpointURL}
	return nil
}

func (d deadLetterRow) key() string {
	return row{endpointID: d.endpointID, endpointURL: d.endpointURL}.key()
}

// assemble groups an event's rows (ordered by processed_at, pending last, then id) by
// destination and decides each one's state.
func assemble(deliveryID string, rows []row, dead []deadLetterRow) Detail {
	first := rows[0]
	for _, r := range rows {
		if r.id < first.id {
			first = r
		}
	}
	d := Detail{Event: Event{DeliveryID: deliveryID, EventType: first.eventType, StreamID: first.streamID,
		Tenant: first.tenant, EnqueuedAt: first.enqueuedAt}}
	if first.payload != nil {
		d.Payload = json.RawMessage(*first.payload)
	}
	byKey := map[string]*Destination{}
	pending := map[string]row{}
	var order []string
	for _, r := range rows {
		if r.routedAt != nil && (d.RoutedAt == nil || r.routedAt.Before(*d.RoutedAt)) {
			d.RoutedAt = r.routedAt
		}
		isRouting := r.src == "log" && r.endpointID == nil && r.routedAt != nil && r.processedAt != nil && r.routedAt.Equal(*r.processedAt)
		awaitsRouting := r.src == "queue" && r.endpointID == nil && r.endpointURL == nil && r.routedAt == nil &&
			r.attempt == 1 && r.routing
		if isRouting || awaitsRouting {
			continue
		}
		k := r.key()
		dst, ok := byKey[k]
		if !ok {
			dst = &Destination{EndpointID: r.endpointID, first: r.id}
			if r.endpointID == nil {
				dst.URL = r.endpointURL
			}
			byKey[k] = dst
			order = append(order, k)
		}
		dst.first = min(dst.first, r.id)
		if r.src == "queue" {
			if p, ok := pending[k]; !ok || r.id > p.id {
				pending[k] = r
			}
			continue
		}
		a := Attempt{Attempt: r.attempt, ProcessedAt: *r.processedAt, DurationMS: r.durationMS, StatusCode: r.statusCode,
			Error: r.errText, ResponseExcerpt: r.excerpt, Outcome: OutcomeFailed}
		switch {
		case delivered(r.statusCode, r.errText):
			a.Outcome = OutcomeDelivered
		case deadLetterAt(dead, k, *r.processedAt) != nil:
			a.Outcome = OutcomeDeadLettered
		}
		dst.Attempts = append(dst.Attempts, a)
	}
	for _, k := range order {
		dst := byKey[k]
		p, isPending := pending[k]
		switch {
		case isPending && p.parked:
			// The attempt that stopped its stream left the row in the queue, with its outcome,
			// and a dead letter naming the row.
			dst.State = StateDeadLettered
			for i := len(dead) - 1; i >= 0; i-- {
				if dl := dead[i]; dl.outboxID != nil && *dl.outboxID == p.id {
					dst.Attempts = append(dst.Attempts, Attempt{Attempt: p.attempt, ProcessedAt: dl.FailedAt,
						DurationMS: p.durationMS, StatusCode: p.statusCode, Error: p.errText, Outcome: OutcomeDeadLettered})
					break
				}
			}
		case isPending:
			dst.State, dst.NextAttemptAt = StatePending, p.dueAt
			if p.attempt > 1 {
				dst.State = StateRetrying
			}
		case len(dst.Attempts) > 0 && dst.Attempts[len(dst.Attempts)-1].Outcome == OutcomeDelivered:
			dst.State = StateDelivered
		default:
			// Settled, and not delivered: only a dead letter settles a failure without a row
			// to retry it (or an endpoint removed with its pending deliveries dropped).
			dst.State = StateDeadLettered
		}
		if dst.State == StateDeadLettered {
			for i := len(dead) - 1; i >= 0; i-- {
				if dead[i].key() == k {
					dl := dead[i].DeadLetter
					dst.DeadLetter = &dl
					break
				}
			}
		}
		d.Destinations = append(d.Destinations, *dst)
	}
	return d
}

// deadLetterAt is the dead letter of destination k written by the statement that settled an
// attempt at processedAt (its failed_at is that statement's now(), as the log row's
// processed_at is), or nil: the attempt was retried, not dead-lettered.
func deadLetterAt(dead []deadLetterRow, k string, processedAt time.Time) *deadLetterRow {
	for i := range dead {
		if dead[i].key() == k && dead[i].FailedAt.Equal(processedAt) {
			return &dead[i]
		}
	}
	return nil
}

// ValidID says whether id has a UUID's form, so that a malformed id is not found rather than
// a failed ::uuid cast.
func ValidID(id string) bool {
	_, ok := fluxsql.CanonicalUUID(id)
	return ok
}

// firstWindow is the width of a listing's first window back from its newest possible row;
// each next window is windowGrowth times wider, until the page is full or the window reaches
// the listing's start. A page of the last minutes reads the last minutes of the log, and a
// sparse filter costs a few more reads, each at most windowGrowth times the one before.
const (
	firstWindow  = time.Minute
	windowGrowth = 4
)

// windows calls query with window starts from ref-firstWindow back to since, widening, until
// it reports the page full.
func windows(since, ref time.Time, query func(from time.Time) (full bool, err error)) error {
	span := firstWindow
	for {
		from := ref.Add(-span)
		if !from.After(since) {
			from = since
		}
		full, err := query(from)
		if err != nil || full || from.Equal(since) {
			return err
		}
		span *= windowGrowth
	}
}

// ListQuery selects a page of events.
type ListQuery struct {
	// Scope limits the page to the caller's tenant; Tenant filters by one (an admin's choice).
	Scope, Tenant *string
	// EventType and StreamID, when set, keep those events only.
	EventType, StreamID *string
	// Since (required) and Until (zero: none) bound enqueued_at, Until exclusive.
	Since, Until time.Time
	// AfterEnqueuedAt and AfterID are the last event of the previous page (zero: the first).
	AfterEnqueuedAt time.Time
	AfterID         string
	// Limit is the most events returned.
	Limit int
	// Now is where the first window ends when neither Until nor a cursor does.
	Now time.Time
}

// List returns events newest first (enqueued_at, then delivery id, descending: a stable
// order, so that a cursor never repeats or skips one), each once however many rows it has.
//
// Which row stands for an event: none in particular. An event is its delivery id, and every
// one of its rows carries its type, stream, tenant and enqueued_at, so the listing keeps one
// row per (enqueued_at, delivery id), whichever it meets first. A rule naming one row would
// list some events twice or not at all: the producer's row is pending in the queue, then the
// routing row or the first WEBHOOK_URL attempt in the log, but a replay of a WEBHOOK_URL dead
// letter inserts a second first attempt without an endpoint, the API's test event has an
// endpoint from the start, and retention may drop a partition holding an event's first rows
// while a later one still holds its retries. (Get takes the payload from the row with the
// smallest id, the producer's own while it is kept: every later row is inserted after it.)
//
// The log is read by time in windows back from the newest event the page may hold: a window
// from t holds every event enqueued since t (its rows were all settled after it), so when it
// has Limit of them they are the page; otherwise the next, wider window is read.
func List(ctx context.Context, q Querier, lq ListQuery) ([]Event, error) {
	if lq.AfterID != "" && !ValidID(lq.AfterID) {
		return nil, ErrNotFound
	}
	var after, afterID any
	ref := lq.Now
	if !lq.Until.IsZero() && lq.Until.Before(ref) {
		ref = lq.Until
	}
	if !lq.AfterEnqueuedAt.IsZero() {
		after, afterID = lq.AfterEnqueuedAt, lq.AfterID
		if lq.AfterEnqueuedAt.Before(ref) {
			ref = lq.AfterEnqueuedAt
		}
	}
	var until any
	if !lq.Until.IsZero() {
		until = lq.Until
	}
	var out []Event
	err := windows(lq.Since, ref, func(from time.Time) (bool, error) {
		rs, _ := q.Query(ctx, listSQL, lq.Scope, lq.Tenant, lq.EventType, lq.StreamID, from, until, after, afterID, lq.Limit)
		var err error
		out, err = pgx.CollectRows(rs, func(r pgx.CollectableRow) (Event, error) {
			var e Event
			return e, r.Scan(&e.DeliveryID, &e.EventType, &e.StreamID, &e.Tenant, &e.EnqueuedAt)
		})
		return len(out) >= lq.Limit, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	return out, nil
}

// Delivery is one row of an endpoint's deliveries: a settled attempt or a pending one.
type Delivery struct {
	// ID is the row's id, the page's tiebreak.
	ID         int64
	DeliveryID string
	EventType  string
	Attempt    int
	// Status is OutcomeDelivered, OutcomeFailed, OutcomeDeadLettered or StatePending.
	Status string
	// At orders the list: ProcessedAt, or DueAt while pending.
	At          time.Time
	ProcessedAt *time.Time
	DueAt       *time.Time
	StatusCode  *int
	Error       *string
	DurationMS  *int
	EnqueuedAt  time.Time
}

// EndpointQuery selects a page of an endpoint's deliveries.
type EndpointQuery struct {
	// EndpointID is the endpoint: a page is empty unless it exists in Scope.
	EndpointID string
	// Scope limits the rows to the caller's tenant.
	Scope *string
	// Status and EventType, when set, keep those rows only.
	Status, EventType *string
	// Since (required) and Until (zero: none) bound the rows' time (Delivery.At); without
	// Until, rows due later (retries waiting) are in the page too.
	Since, Until time.Time
	// AfterAt and AfterID are the last row of the previous page (zero: the first).
	AfterAt time.Time
	AfterID int64
	// Limit is the most rows returned.
	Limit int
}

// EndpointDeliveries returns an endpoint's rows newest first (their time, then id: a stable
// order, so that a cursor never repeats or skips a row that stays where it is), in one
// statement that walks the endpoint's index on the log back from the cursor and stops after
// a page (endpoint.sql).
func EndpointDeliveries(ctx context.Context, q Batcher, eq EndpointQuery) ([]Delivery, error) {
	var after, afterID, until any
	if !eq.Until.IsZero() {
		until = eq.Until
	}
	if !eq.AfterAt.IsZero() {
		after, afterID = eq.AfterAt, eq.AfterID
	}
	out, err := queryGeneric(ctx, q, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		return d, r.Scan(&d.ID, &d.DeliveryID, &d.EventType, &d.Attempt, &d.Status, &d.At, &d.ProcessedAt, &d.DueAt,
			&d.StatusCode, &d.Error, &d.DurationMS, &d.EnqueuedAt)
	}, endpointSQL, eq.EndpointID, eq.Scope, eq.Status, eq.EventType, eq.Since, until, after, afterID, eq.Limit)
	if err != nil {
		return nil, fmt.Errorf("listing the deliveries of endpoint %s: %w", eq.EndpointID, err)
	}
	return out, nil
}
