package endpoints

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fluxora/fluxhook/stages/send"
)

// Schemes an endpoint signs with (the values of webhook_endpoints.scheme).
const (
	SchemeFluxora  = "fluxora"
	SchemeStandard = "standard"
)

// Orderings an endpoint delivers with (the values of webhook_endpoints.ordering, schema 6).
// OrderingNone is the default because order costs throughput: with OrderingStream a stream
// has one delivery in flight at a time, and a slow or failing event holds back the stream's
// later ones; only consumers that need each stream's events in order should pay for it.
const (
	OrderingNone   = "none"
	OrderingStream = "stream"
)

// What an ordered stream does when its head is dead-lettered (the values of
// webhook_endpoints.ordering_failure). OrderingFailureSkip, the default, keeps the stream
// flowing past the event (the dead letter says it was skipped), since a stream that stops
// delivers nothing until an operator acts. OrderingFailureStop is for consumers that must never
// see a stream's events out of order: the stream waits, parked behind its dead letter, until
// `fluxhook dlq replay` (the replayed event becomes its head) or `fluxhook dlq purge` (the
// stream moves on without it).
const (
	OrderingFailureSkip = "skip"
	OrderingFailureStop = "stop"
)

// Endpoint is one row of webhook_endpoints, its secrets opened.
type Endpoint struct {
	ID          string `json:"id"`
	URL         string `json:"url"`
	Description string `json:"description"`
	// Tenant is empty for an endpoint without one (it receives events without a tenant).
	Tenant string `json:"tenant,omitempty"`
	// EmptyTenant says the stored tenant is the empty string rather than NULL (written by
	// SQL): routing tells the two apart, so the dispatcher leaves its events to the routing
	// statement.
	EmptyTenant bool `json:"-"`
	// EventTypes filters events: exact names and "prefix.*" patterns; empty matches all.
	EventTypes []string `json:"event_types"`
	Scheme     string   `json:"scheme"`
	// Secret and PreviousSecret are never printed by the CLI's list and show (json:"-"):
	// only add and rotate-secret print a secret, once.
	Secret         string    `json:"-"`
	PreviousSecret string    `json:"-"`
	PreviousUntil  time.Time `json:"previous_secret_expires_at,omitzero"`
	Enabled        bool      `json:"enabled"`
	DisabledAt     time.Time `json:"disabled_at,omitzero"`
	DisabledReason string    `json:"disabled_reason"`
	// RetryRPS and MaxConcurrency override WEBHOOK_RETRY_RPS and
	// WEBHOOK_ENDPOINT_CONCURRENCY when positive.
	RetryRPS       int `json:"retry_rps,omitempty"`
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// PermanentStatuses overrides WEBHOOK_PERMANENT_STATUSES (schema 13): the answers
	// dead-lettered at once besides 410 Gone. nil (JSON null) is the dispatcher's setting; an
	// empty list ([]) dead-letters none but 410.
	PermanentStatuses []int `json:"permanent_statuses"`
	// Headers are the custom request headers, their values opened (sealed at rest with
	// WEBHOOK_ENCRYPTION_KEY, like the secrets). A value that does not open is empty, with
	// the endpoint's error saying why, so that its sealed text is never taken for the value.
	// The CLI masks values that look like credentials when it prints them.
	Headers map[string]string `json:"headers"`
	// Ordering is OrderingNone or OrderingStream (schema 6): with OrderingStream, each
	// stream_id's events reach the endpoint one at a time, in order. OrderingFailure is what
	// such a stream does when its head is dead-lettered: OrderingFailureSkip (go on) or
	// OrderingFailureStop (wait for a replay or a purge); it is kept, unused, while Ordering
	// is OrderingNone.
	Ordering        string `json:"ordering"`
	OrderingFailure string `json:"ordering_failure"`
	// Restricted says a tenant wrote the URL (through the management API, schema 18): the
	// dispatcher dials it as a producer's endpoint_url (public addresses, plus
	// WEBHOOK_ROW_URL_NETWORKS), never with the operator's loopback allowance or
	// WEBHOOK_ALLOWED_NETWORKS, so that a tenant cannot reach, and read through the API's
	// answers, the services of the dispatcher's host and network. An operator's write of the
	// URL (an admin key, the CLI) clears it.
	Restricted    bool      `json:"restricted"`
	LastSuccessAt time.Time `json:"last_success_at,omitzero"`
	FailingSince  time.Time `json:"failing_since,omitzero"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// Matches reports whether an event of eventType passes the endpoint's filter: no filter, an
// exact name, or a "prefix.*" pattern whose prefix (with its dot) starts the type. The
// routing statement (route.sql in stages/claim) applies the same rule in SQL; a test keeps
// the two in agreement.
func Matches(filter []string, eventType string) bool {
	if len(filter) == 0 {
		return true
	}
	for _, f := range filter {
		if f == "" {
			continue // a NULL entry, as scan reads it: matches nothing, as in route.sql
		}
		if prefix, ok := strings.CutSuffix(f, "*"); ok && strings.HasSuffix(prefix, ".") {
			if strings.HasPrefix(eventType, prefix) {
				return true
			}
		} else if f == eventType {
			return true
		}
	}
	return false
}

// ValidateFilter returns an error naming the first filter entry that is neither an exact event
// type nor a "prefix.*" pattern, or one past the bounds (MaxEventTypes entries of at most
// MaxEventType bytes, printable UTF-8).
func ValidateFilter(filter []string) error {
	if len(filter) > MaxEventTypes {
		return fmt.Errorf("%d entries; at most %d (a \"prefix.*\" pattern stands for many)", len(filter), MaxEventTypes)
	}
	for _, f := range filter {
		switch {
		case len(f) > MaxEventType:
			return fmt.Errorf("event type filter %.40q...: %d bytes; at most %d", f, len(f), MaxEventType)
		case !utf8.ValidString(f) || strings.ContainsFunc(f, func(r rune) bool { return r < ' ' || r == 0x7f }):
			return fmt.Errorf("event type filter %q: not printable UTF-8", f)
		case strings.TrimSpace(f) == "" || f != strings.TrimSpace(f):
			return fmt.Errorf("event type filter %q: empty or surrounded by spaces", f)
		case strings.Contains(f, "*") && (!strings.HasSuffix(f, ".*") || strings.Count(f, "*") > 1 || f == ".*"):
			return fmt.Errorf("event type filter %q: a pattern is a prefix ending in \".*\" (e.g. \"stream.*\"); \"*\" elsewhere is not supported", f)
		}
	}
	return nil
}

// reservedHeaders are the headers fluxhook sets itself: a custom header may not replace them,
// or an endpoint's configuration could forge or break the signature a consumer verifies.
var reservedHeaders = []string{
	"content-type", "content-length", "host", "user-agent", "transfer-encoding", "connection",
	"x-fluxora-delivery-id", "x-fluxora-timestamp", "x-fluxora-event", "x-fluxora-signature", "x-fluxora-attempt",
	"webhook-id", "webhook-timestamp", "webhook-signature",
}

// ValidateHeaders returns an error naming the first custom header that is reserved or not a
// valid HTTP header, or whose value starts like a sealed value ("enc:v1:", "enc:v2:"): stored
// in clear, without a key, it would be taken for one and fail to open. The error never repeats
// the value, which is often a credential.
func ValidateHeaders(h map[string]string) error {
	for k, v := range h {
		if err := checkHeader(k, v); err != nil {
			return err
		}
		if IsSealed(v) {
			return fmt.Errorf("header %q: the value starts with %q, which marks an encrypted value; give the value itself", k, v[:len(sealedPrefix)])
		}
	}
	return nil
}

// Sendable returns why the dispatcher cannot deliver to e as it is stored and opened, naming
// the field (an *InvalidError), or nil. The CLI and the API validate what they write, but SQL
// may write anything, and the dispatcher checks each endpoint with this as it loads it
// (`endpoints show` reports the same problem): a URL it refuses would fail every attempt; a
// reserved header name would replace a header fluxhook sets, its signature among them; a header
// HTTP cannot carry would fail every attempt for the retry schedule's days; and of two names
// that differ only in case one would replace the other at random.
func Sendable(e *Endpoint) error {
	if err := send.ValidateURL(e.URL); err != nil {
		return &InvalidError{Field: "url", Err: errors.New(strings.TrimPrefix(err.Error(), send.ErrInvalidURL.Error()+": "))}
	}
	if err := sendableHeaders(e.Headers); err != nil {
		return &InvalidError{Field: "headers", Err: err}
	}
	return nil
}

// sendableHeaders is Sendable's check of the custom headers, in the order of their names, so
// that the reason is the same at every load.
func sendableHeaders(h map[string]string) error {
	names := slices.Sorted(maps.Keys(h))
	for _, k := range names {
		if err := checkHeader(k, h[k]); err != nil {
			return err
		}
	}
	return sameNames(names)
}

// checkHeader refuses a reserved name, a name that is not an HTTP token, and a value with a
// control character other than tab (what net/http refuses to send).
func checkHeader(k, v string) error {
	if slices.Contains(reservedHeaders, strings.ToLower(k)) {
		return fmt.Errorf("header %q is reserved: fluxhook sets it itself", k)
	}
	if k == "" || strings.ContainsFunc(k, func(r rune) bool { return r <= ' ' || r >= 0x7f || strings.ContainsRune("\"(),/:;<=>?@[\\]{}", r) }) {
		return fmt.Errorf("header name %q is not a valid HTTP header name", k)
	}
	if strings.ContainsFunc(v, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
		return fmt.Errorf("header %q: the value has a control character", k)
	}
	return nil
}

// sameNames refuses two header names that differ only in case: HTTP names are
// case-insensitive, so one would silently replace the other when the request is built.
func sameNames(names []string) error {
	seen := make(map[string]string, len(names))
	for _, k := range names {
		lower := strings.ToLower(k)
		if other, dup := seen[lower]; dup {
			return fmt.Errorf("%q and %q are the same header (names are case-insensitive); keep one", other, k)
		}
		seen[lower] = k
	}
	return nil
}

// Header returns the custom headers in canonical form, ready to add to a request.
func (e *Endpoint) Header() http.Header {
	h := make(http.Header, len(e.Headers))
	for k, v := range e.Headers {
		h.Set(k, v)
	}
	return h
}

//go:embed queries/load.sql
var loadSQL string

//go:embed queries/load_ids.sql
var loadIDsSQL string

// Querier is what the functions here run their statements through: a pool, a connection or
// a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// LoadAll reads every endpoint, opening its secrets and header values with c. An endpoint
// with a value that cannot be opened (sealed with another key, or for another endpoint or
// field) is returned with its error at the same index of the errors rather than failing the
// others: the dispatcher dead-letters its deliveries with that reason.
func LoadAll(ctx context.Context, q Querier, c *Cipher) ([]Endpoint, []error, error) {
	rows, err := q.Query(ctx, loadSQL, "")
	if err != nil {
		return nil, nil, fmt.Errorf("reading webhook_endpoints: %w", err)
	}
	return collect(rows, c)
}

// LoadIDs reads the endpoints with these ids, as LoadAll does; an id with no endpoint is
// left out. The dispatcher uses it to read a batch's endpoints as committed now.
func LoadIDs(ctx context.Context, q Querier, c *Cipher, ids []string) ([]Endpoint, []error, error) {
	rows, err := q.Query(ctx, loadIDsSQL, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("reading webhook_endpoints: %w", err)
	}
	return collect(rows, c)
}

// Times an endpoint's timestamps stand for when SQL stored '-infinity' or 'infinity' in them,
// which time.Time cannot hold: a row scanned into one would fail the whole load, every other
// endpoint with it. They keep the order SQL gives the infinities: an endpoint created at
// '-infinity' receives every event, as route.sql reads it, and a grace until 'infinity' never
// ends. Not time.Time{}, which this package reads as NULL. page.sql orders by the same times.
var (
	beforeAll = time.Date(1, time.January, 1, 0, 0, 1, 0, time.UTC)
	afterAll  = time.Date(9999, time.December, 31, 23, 59, 59, 0, time.UTC)
)

// finite is t as a time.Time (see beforeAll), the zero time for NULL. A finite time outside
// [beforeAll, afterAll] is clamped too, as page.sql orders it: a cursor that is not the time a
// page is ordered by would page a row twice, or stop early.
func finite(t pgtype.Timestamptz) time.Time {
	switch {
	case !t.Valid:
		return time.Time{}
	case t.InfinityModifier == pgtype.Infinity || t.Time.After(afterAll):
		return afterAll
	case t.InfinityModifier == pgtype.NegativeInfinity || t.Time.Before(beforeAll):
		return beforeAll
	}
	return t.Time
}

// scan reads one row of load.sql. Whatever SQL stored that the schema allows reads without
// error: a failed scan ends the whole load, every endpoint with it.
func scan(row pgx.CollectableRow, c *Cipher) (Endpoint, error) {
	var e Endpoint
	var tenant, prev, disabledReason *string
	var prevUntil, disabledAt, lastSuccess, failingSince, createdAt, updatedAt pgtype.Timestamptz
	var retryRPS, maxConc *int32
	var headers []byte
	var permanent *[]int32
	var secret string
	var filter []pgtype.Text
	if err := row.Scan(&e.ID, &e.URL, &e.Description, &tenant, &filter, &e.Scheme, &secret, &prev, &prevUntil,
		&e.Enabled, &disabledAt, &disabledReason, &retryRPS, &maxConc, &headers, &lastSuccess, &failingSince,
		&createdAt, &updatedAt, &e.Ordering, &e.OrderingFailure, &permanent, &e.Restricted); err != nil {
		return e, fmt.Errorf("reading webhook_endpoints: %w", err)
	}
	deref := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	e.Tenant, e.DisabledReason = deref(tenant), deref(disabledReason)
	e.EmptyTenant = tenant != nil && *tenant == ""
	e.PreviousUntil, e.DisabledAt, e.LastSuccessAt, e.FailingSince = finite(prevUntil), finite(disabledAt), finite(lastSuccess), finite(failingSince)
	e.CreatedAt, e.UpdatedAt = finite(createdAt), finite(updatedAt)
	// A NULL entry of the filter matches no event type in route.sql (NULL = x is not true),
	// nor does "" in Matches, not even an empty one.
	e.EventTypes = make([]string, len(filter))
	for i, f := range filter {
		e.EventTypes[i] = f.String
	}
	if retryRPS != nil {
		e.RetryRPS = int(*retryRPS)
	}
	if maxConc != nil {
		e.MaxConcurrency = int(*maxConc)
	}
	if permanent != nil {
		e.PermanentStatuses = make([]int, 0, len(*permanent))
		for _, n := range *permanent {
			e.PermanentStatuses = append(e.PermanentStatuses, int(n))
		}
	}
	stored := map[string]string{}
	if err := json.Unmarshal(headers, &stored); err != nil {
		e.Headers = map[string]string{}
		return e, fmt.Errorf("endpoint %s: headers must be a JSON object of strings: %w", e.ID, err)
	}
	// Every header is opened, even after one fails, so that none keeps its stored form: a
	// value that does not open is left empty, never its sealed text, which is neither the
	// value nor anything a consumer should be sent.
	var headerErr error
	e.Headers = make(map[string]string, len(stored))
	for _, name := range slices.Sorted(maps.Keys(stored)) {
		plain, err := c.Open(stored[name], HeaderBinding(e.ID, name))
		if err != nil && headerErr == nil {
			headerErr = fmt.Errorf("endpoint %s: header %q: %w", e.ID, name, err)
		}
		e.Headers[name] = plain
	}
	var err error
	if e.Secret, err = c.Open(secret, SecretBinding(e.ID)); err != nil {
		return e, fmt.Errorf("endpoint %s: secret: %w", e.ID, err)
	}
	if prev != nil {
		if e.PreviousSecret, err = c.Open(*prev, PreviousSecretBinding(e.ID)); err != nil {
			return e, fmt.Errorf("endpoint %s: previous secret: %w", e.ID, err)
		}
	}
	return e, headerErr
}

// collect scans every row, keeping endpoints whose secret could not be opened (with their
// error at the same index of errs) so that one bad row cannot hide the others.
func collect(rows pgx.Rows, c *Cipher) ([]Endpoint, []error, error) {
	defer rows.Close()
	var out []Endpoint
	var errs []error
	for rows.Next() {
		e, err := scan(rows, c)
		out = append(out, e)
		errs = append(errs, err)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading webhook_endpoints: %w", err)
	}
	return out, errs, nil
}

// SensitiveHeader says whether a custom header's value looks like a credential (Authorization,
// a token, an API key): the CLI and the API show such a value masked, never as it is.
func SensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	if n == "authorization" || n == "proxy-authorization" || n == "cookie" {
		return true
	}
	for _, part := range []string{"token", "secret", "key", "auth", "password", "signature", "session"} {
		if strings.Contains(n, part) {
			return true
		}
	}
	return false
}
