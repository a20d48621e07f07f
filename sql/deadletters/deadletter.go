package deadletters

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

// The statements, one file each (see queries/), so that every query run on the dead letters
// can be read and explained as SQL.
var (
	//go:embed queries/*.sql
	queryFS embed.FS
	//go:embed queries/get.sql
	getSQL string
	//go:embed queries/by_delivery.sql
	byDeliverySQL string
	//go:embed queries/target.sql
	targetSQL string
	//go:embed queries/replay.sql
	replaySQL string
	//go:embed queries/key_joined.sql
	keyJoinedSQL string
	//go:embed queries/wait_streams.sql
	waitStreamsSQL string
)

// templates are the statements written for the shape of their filter: list.sql, lock.sql and
// purge.sql, with filter.sql's conditions. Parsed once, at start; an error panics, since the
// files are part of the binary and every test of the package meets it.
var templates = template.Must(template.ParseFS(queryFS, "queries/filter.sql", "queries/list.sql",
	"queries/lock.sql", "queries/purge.sql"))

// rendered caches each statement by its shape: a handful of texts, each rendered once.
var rendered sync.Map // renderKey -> string

type renderKey struct {
	name  string
	shape shape
}

// shape says which parts a templated statement has: the filter's fields that are set, and
// what else the statement takes. It is the data of the templates, and comparable, so that it
// keys the cache.
type shape struct {
	Scope, Tenant, EndpointID, DeliveryID, EventType, Reason bool
	Within, Since, Until, ReplayedOnly, NotReplayed          bool
	After, Limit, Payload                                    bool
	// ByRef: lock.sql and purge.sql select by ids and delivery ids, not by the filter.
	ByRef bool
	// PurgeReplayedOnly: purge.sql keeps only rows already replayed (PurgeOptions).
	PurgeReplayedOnly bool
}

// render returns the text of the named template for s.
func render(name string, s shape) string {
	k := renderKey{name, s}
	if text, ok := rendered.Load(k); ok {
		return text.(string)
	}
	var b strings.Builder
	if err := templates.ExecuteTemplate(&b, name, s); err != nil {
		panic(fmt.Sprintf("deadletters: rendering %s: %v", name, err))
	}
	rendered.Store(k, b.String())
	return b.String()
}

// Querier is what the read functions run their statements through: a pool, a connection or
// a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// ErrNotFound is matched (errors.Is) by the error for a dead letter, delivery id or recovery
// that does not exist in the caller's scope: another tenant's is not found either, so that
// the two cannot be told apart.
var ErrNotFound = errors.New("not found")

// NotFoundError names the row ids and delivery ids that found nothing. It matches ErrNotFound.
type NotFoundError struct {
	IDs         []int64
	DeliveryIDs []string
	// Recovery is a recovery job's id, when that is what was not found.
	Recovery string
}

// Error names what was not found, as the CLI prints it: "dead letter 7 not found; no dead
// letter has delivery id …".
func (e *NotFoundError) Error() string {
	if e.Recovery != "" {
		return "recovery " + e.Recovery + " not found"
	}
	var parts []string
	if len(e.IDs) > 0 {
		parts = append(parts, fmt.Sprintf("dead letter %s not found", JoinIDs(e.IDs)))
	}
	if len(e.DeliveryIDs) > 0 {
		parts = append(parts, fmt.Sprintf("no dead letter has delivery id %s", strings.Join(e.DeliveryIDs, ", ")))
	}
	return strings.Join(parts, "; ")
}

// Is makes every NotFoundError match ErrNotFound.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// ErrInvalid is matched by the error for an argument refused before anything was read or
// written: a malformed id, a contradictory filter. The API answers it with 422.
var ErrInvalid = errors.New("invalid argument")

// InvalidError is an argument refused before anything was read or written. Field names it in
// the snake_case of the API's JSON.
type InvalidError struct {
	Field string
	Err   error
}

// Error names the field and the reason.
func (e *InvalidError) Error() string { return e.Field + ": " + e.Err.Error() }

// Unwrap returns the reason.
func (e *InvalidError) Unwrap() error { return e.Err }

// Is makes every InvalidError match ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Err: fmt.Errorf(format, args...)}
}

// CanonicalUUID is sql.CanonicalUUID, kept here for the callers of this package.
func CanonicalUUID(s string) (string, bool) { return fluxsql.CanonicalUUID(s) }

// JoinIDs writes row ids as messages name them: "5, 9, 12".
func JoinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ", ")
}

// DeadLetter is one webhook_dead_letter row, every column. The JSON names are an interface
// (the CLI's --json and the API): delivery_id is the id logs, metrics and the consumer see;
// id is the row's number, which nothing outside this table knows. endpoint_id is null unless
// the row is a managed endpoint's delivery; tenant is the event's tenant, null for none;
// order_key is the event's place in its stream for an ordered endpoint's delivery (what a
// replay keeps, so that it leads the stream again), null for an unordered one.
//
// EndpointURL is the per-row URL, with any password in it replaced by "xxxxx": a URL with
// credentials is dead-lettered for having them, and they must not be shown. Payload is set
// only where asked for (Get, ByDelivery, Filter.IncludePayload).
type DeadLetter struct {
	ID          int64      `json:"id"`
	OutboxID    *int64     `json:"outbox_id"`
	DeliveryID  string     `json:"delivery_id"`
	EndpointID  *string    `json:"endpoint_id"`
	StreamID    *string    `json:"stream_id"`
	EventType   string     `json:"event_type"`
	EndpointURL *string    `json:"endpoint_url"`
	Attempts    int32      `json:"attempts"`
	LastStatus  *int32     `json:"last_status"`
	LastError   *string    `json:"last_error"`
	Reason      string     `json:"reason"`
	EnqueuedAt  time.Time  `json:"enqueued_at"`
	FailedAt    time.Time  `json:"failed_at"`
	ReplayedAt  *time.Time `json:"replayed_at"`
	Tenant      *string    `json:"tenant"`
	OrderKey    *int64     `json:"order_key"`
	// LastResponseExcerpt is the start of the consumer's last answer (schema 15): read with
	// the payload (Get, ByDelivery), nil in a list and when the dead letter kept none.
	LastResponseExcerpt *string         `json:"last_response_excerpt,omitempty"`
	Payload             json.RawMessage `json:"payload,omitempty"`
}

// Cursor is where a page of List ended: the failed_at and id of its last row. The next page
// starts below it in List's order, so pages neither repeat nor skip rows while dead letters
// keep arriving (they arrive above) or are purged.
type Cursor struct {
	FailedAt time.Time
	ID       int64
}

// Cursor returns the cursor that continues a listing after d.
func (d DeadLetter) Cursor() Cursor { return Cursor{FailedAt: d.FailedAt, ID: d.ID} }

// IsZero reports whether c is no cursor: the first page.
func (c Cursor) IsZero() bool { return c.ID == 0 && c.FailedAt.IsZero() }

// String returns c as a token for a URL's query ("<failed_at in Unix microseconds>_<id>"):
// exact, since PostgreSQL keeps microseconds. Clients should treat it as opaque.
func (c Cursor) String() string {
	return strconv.FormatInt(c.FailedAt.UnixMicro(), 10) + "_" + strconv.FormatInt(c.ID, 10)
}

// MarshalText writes String, so that a cursor is a JSON string.
func (c Cursor) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (c *Cursor) UnmarshalText(b []byte) error {
	p, err := ParseCursor(string(b))
	if err != nil {
		return err
	}
	*c = p
	return nil
}

// ParseCursor reads a token String wrote. Anything else is an InvalidError for "cursor".
func ParseCursor(s string) (Cursor, error) {
	micros, id, ok := strings.Cut(s, "_")
	us, err1 := strconv.ParseInt(micros, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil || n <= 0 {
		return Cursor{}, invalid("cursor", "%q is not a cursor this API returned", s)
	}
	return Cursor{FailedAt: time.UnixMicro(us).UTC(), ID: n}, nil
}

// Replayed filters dead letters on whether they were replayed. The zero value takes both.
type Replayed int

// The values of Filter.Replayed.
const (
	AnyReplayed  Replayed = iota // replayed or not
	ReplayedOnly                 // only those replayed at least once
	NotReplayed                  // only those never replayed
)

// Filter selects dead letters for List, and for Replay and Purge through Selection.Matching.
// Its zero value matches every row; fields combine with AND.
type Filter struct {
	// Tenant, when set, is the caller's tenant: only that tenant's rows, enforced in the SQL.
	// nil is every tenant, for an operator or an admin key.
	Tenant *string
	// EndpointID and DeliveryID are UUIDs (any case), "" for any.
	EndpointID string
	DeliveryID string
	// EventType matches exactly; "" for any.
	EventType string
	// ReasonContains matches reasons containing it, case-insensitive and literally (no
	// pattern); "" for any.
	ReasonContains string
	// Since and Until bound failed_at: at or after Since, before Until. Zero for no bound.
	Since, Until time.Time
	// FailedWithin keeps the rows that failed within that long of the database's clock (the
	// CLI's --since). Zero for no bound.
	FailedWithin time.Duration
	// Replayed keeps only replayed, or only never replayed, rows.
	Replayed Replayed
	// Limit is the most rows List returns; 0 is no limit, which an API should never use.
	// Ask for one more than a page to know whether there is another.
	Limit int
	// After continues a listing after a row (its Cursor); zero for the first page.
	After Cursor
	// IncludePayload has List read the payloads, which a list usually does not need.
	IncludePayload bool
}

// empty reports whether f selects rows by nothing but the caller's tenant: replaying or
// purging everything at once, which is never what was meant.
func (f *Filter) empty() bool {
	return f.EndpointID == "" && f.DeliveryID == "" && f.EventType == "" && f.ReasonContains == "" &&
		f.Since.IsZero() && f.Until.IsZero() && f.FailedWithin == 0 && f.Replayed == AnyReplayed
}

// conditions returns the shape and the named arguments of f's conditions (filter.sql), with
// scope as the caller's tenant (which f.Tenant then narrows), or an InvalidError.
func (f *Filter) conditions(scope *string) (shape, pgx.NamedArgs, error) {
	var s shape
	args := pgx.NamedArgs{}
	if scope != nil {
		s.Scope, args["scope"] = true, *scope
	}
	if f.Tenant != nil {
		s.Tenant, args["tenant"] = true, *f.Tenant
	}
	if f.EndpointID != "" {
		id, ok := CanonicalUUID(f.EndpointID)
		if !ok {
			return s, nil, invalid("endpoint_id", "%q is not a UUID", f.EndpointID)
		}
		s.EndpointID, args["endpoint_id"] = true, id
	}
	if f.DeliveryID != "" {
		id, ok := CanonicalUUID(f.DeliveryID)
		if !ok {
			return s, nil, invalid("delivery_id", "%q is not a UUID", f.DeliveryID)
		}
		s.DeliveryID, args["delivery_id"] = true, id
	}
	if f.EventType != "" {
		s.EventType, args["event_type"] = true, f.EventType
	}
	if f.ReasonContains != "" {
		s.Reason, args["reason"] = true, f.ReasonContains
	}
	if f.FailedWithin < 0 {
		return s, nil, invalid("failed_within", "must not be negative, got %s", f.FailedWithin)
	}
	if f.FailedWithin > 0 {
		s.Within, args["within_us"] = true, f.FailedWithin.Microseconds()
	}
	if !f.Since.IsZero() {
		s.Since, args["since"] = true, f.Since
	}
	if !f.Until.IsZero() {
		s.Until, args["until"] = true, f.Until
	}
	if s.Since && s.Until && !f.Since.Before(f.Until) {
		return s, nil, invalid("until", "must be after since (%s), got %s", f.Since.Format(time.RFC3339Nano), f.Until.Format(time.RFC3339Nano))
	}
	switch f.Replayed {
	case AnyReplayed:
	case ReplayedOnly:
		s.ReplayedOnly = true
	case NotReplayed:
		s.NotReplayed = true
	default:
		return s, nil, invalid("replayed", "unknown value %d", f.Replayed)
	}
	return s, args, nil
}

// List returns the dead letters f matches, newest first (by failed_at, then id), at most
// f.Limit, after f.After. A page's last row's Cursor gives the next page. Payloads only with
// f.IncludePayload. An empty result is an empty, non-nil slice, so that it marshals as [].
func List(ctx context.Context, q Querier, f Filter) ([]DeadLetter, error) {
	s, args, err := f.conditions(nil)
	if err != nil {
		return nil, err
	}
	// The caller's tenant is the scope: the same condition, under the name the indexes
	// are planned for.
	if s.Tenant {
		s.Tenant, s.Scope, args["scope"] = false, true, args["tenant"]
		delete(args, "tenant")
	}
	if f.Limit < 0 {
		return nil, invalid("limit", "must not be negative, got %d", f.Limit)
	}
	if f.Limit > 0 {
		s.Limit, args["limit"] = true, f.Limit
	}
	if !f.After.IsZero() {
		s.After, args["after_failed_at"], args["after_id"] = true, f.After.FailedAt, f.After.ID
	}
	s.Payload = f.IncludePayload
	rows, err := q.Query(ctx, render("list.sql", s), args)
	if err != nil {
		return nil, fmt.Errorf("listing dead letters: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) { return scan(r, s.Payload) })
	if err != nil {
		return nil, fmt.Errorf("listing dead letters: %w", err)
	}
	if list == nil {
		list = []DeadLetter{}
	}
	return list, nil
}

// Get returns the dead letter with row id id, with its payload. A row that does not exist,
// or is not of tenant when tenant is set, is a NotFoundError (ErrNotFound): the same error
// for both.
func Get(ctx context.Context, q Querier, id int64, tenant *string) (DeadLetter, error) {
	d, err := scan(q.QueryRow(ctx, getSQL, id, tenant), true)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetter{}, &NotFoundError{IDs: []int64{id}}
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("reading dead letter %d: %w", id, err)
	}
	return d, nil
}

// ByDelivery returns every dead letter of one event, by its delivery id, oldest first with
// payloads: one per endpoint it failed for, and one per time it failed again after a replay.
// None (or none of tenant, when set) is a NotFoundError.
func ByDelivery(ctx context.Context, q Querier, deliveryID string, tenant *string) ([]DeadLetter, error) {
	id, ok := CanonicalUUID(deliveryID)
	if !ok {
		return nil, &NotFoundError{DeliveryIDs: []string{deliveryID}}
	}
	rows, err := q.Query(ctx, byDeliverySQL, id, tenant)
	if err != nil {
		return nil, fmt.Errorf("reading delivery id %s: %w", id, err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) { return scan(r, true) })
	if err != nil {
		return nil, fmt.Errorf("reading delivery id %s: %w", id, err)
	}
	if len(list) == 0 {
		return nil, &NotFoundError{DeliveryIDs: []string{id}}
	}
	return list, nil
}

// scan reads the columns of list.sql, plus the payload for get.sql and by_delivery.sql.
func scan(row pgx.Row, withPayload bool) (DeadLetter, error) {
	var d DeadLetter
	dest := []any{&d.ID, &d.OutboxID, &d.DeliveryID, &d.EndpointID, &d.StreamID, &d.EventType, &d.EndpointURL,
		&d.Attempts, &d.LastStatus, &d.LastError, &d.Reason, &d.EnqueuedAt, &d.FailedAt, &d.ReplayedAt,
		&d.Tenant, &d.OrderKey}
	var payload string
	if withPayload {
		dest = append(dest, &d.LastResponseExcerpt, &payload)
	}
	if err := row.Scan(dest...); err != nil {
		return d, err
	}
	if d.EndpointURL != nil {
		redacted := redactPassword(*d.EndpointURL)
		d.EndpointURL = &redacted
	}
	if withPayload {
		d.Payload = json.RawMessage(payload)
	}
	d.EnqueuedAt, d.FailedAt = d.EnqueuedAt.UTC(), d.FailedAt.UTC()
	if d.ReplayedAt != nil {
		t := d.ReplayedAt.UTC()
		d.ReplayedAt = &t
	}
	return d, nil
}

// redacted replaces a password in a URL.
const redacted = "xxxxx"

// redactPassword replaces the password of u's user info with "xxxxx". A URL that does not
// parse (a password with an unescaped '/' or '#') has everything between the first ':' of its
// user info and the last '@' masked.
func redactPassword(u string) string {
	if parsed, err := url.Parse(u); err == nil {
		if parsed.User != nil {
			if _, has := parsed.User.Password(); has {
				parsed.User = url.UserPassword(parsed.User.Username(), redacted)
				return parsed.String()
			}
		}
		return u
	}
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return u
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		if colon := strings.Index(rest[:at], ":"); colon >= 0 {
			rest = rest[:colon+1] + redacted + rest[at:]
		}
	}
	return scheme + "://" + rest
}

// nonNil passes an empty list to PostgreSQL as an empty array rather than NULL, so that
// `= ANY` over it is false, not unknown.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
