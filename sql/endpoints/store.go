package endpoints

import (
	"context"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

// The store's statements, one file each, so that every query fluxhook runs on
// webhook_endpoints can be read (and explained) as SQL.
var (
	//go:embed queries/insert.sql
	insertSQL string
	//go:embed queries/state.sql
	stateSQL string
	//go:embed queries/update.sql
	updateTemplate string
	//go:embed queries/disable.sql
	disableSQL string
	//go:embed queries/enable.sql
	enableSQL string
	//go:embed queries/rotate.sql
	rotateSQL string
	//go:embed queries/describe.sql
	describeSQL string
	//go:embed queries/remove.sql
	removeTemplate string
	//go:embed queries/secrets.sql
	secretsSQL string
	//go:embed queries/reseal.sql
	resealSQL string
	//go:embed queries/dead_letter.sql
	deadLetterTemplate string
)

// The statements that dead-letter an endpoint's pending deliveries (a tenant change, a removal
// with PendingDeadLetter) share dead_letter.sql's CTEs, so that both settle them as one text.
var (
	updateSQL = withDeadLetter("update.sql", updateTemplate)
	removeSQL = withDeadLetter("remove.sql", removeTemplate)
)

// withDeadLetter expands the statement text (named name) as a text/template in which
// dead_letter.sql's templates are defined: settled_columns, and dead_letter with its reason
// written as an SQL string literal. It runs once, at start; a template error panics, since
// the statements are part of the binary and every test that loads the package meets it.
func withDeadLetter(name, text string) string {
	shared := template.New("dead_letter.sql").Funcs(template.FuncMap{"literal": sqlLiteral})
	template.Must(shared.Parse(deadLetterTemplate))
	t := template.Must(shared.New(name).Parse(text))
	var b strings.Builder
	if err := t.Execute(&b, nil); err != nil {
		panic(fmt.Sprintf("endpoints: expanding %s: %v", name, err))
	}
	return b.String()
}

// sqlLiteral quotes s as an SQL string literal, for the reasons dead_letter.sql writes into
// its rows: a constant of the statement, not a bind parameter, as the statements had it.
func sqlLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// ErrNotFound is matched (errors.Is) by the error for an id that names no endpoint, including
// an id that is not a UUID at all: to the caller both are an endpoint that does not exist.
var ErrNotFound = errors.New("endpoint not found")

// notFoundError is ErrNotFound with the id, and for a malformed id what an id looks like.
type notFoundError struct {
	id        string
	malformed bool
}

func (e *notFoundError) Error() string {
	if e.malformed {
		id := e.id
		if len(id) > 64 {
			id = id[:64] + "…"
		}
		return fmt.Sprintf("endpoint %q not found: endpoint ids are UUIDs (like 0b6f3c1e-9a4d-4c52-8f0e-3d2a1b4c5d6e)", id)
	}
	return "endpoint " + e.id + " not found"
}

func (e *notFoundError) Is(target error) bool { return target == ErrNotFound }

// parseID returns id in the form id::text has (lower case), so that an id typed in upper
// case, as some tools print UUIDs, finds its endpoint. Anything but the 8-4-4-4-12 hex form is
// not found: rejecting it here, rather than letting the ::uuid cast fail, gives the caller
// ErrNotFound and not a database error.
func parseID(id string) (string, error) {
	key, ok := fluxsql.CanonicalUUID(id)
	if !ok {
		return "", &notFoundError{id: id, malformed: true}
	}
	return key, nil
}

// newID returns a random (version 4) UUID in the form id::text has. Add makes the id itself,
// rather than leaving it to the column's default, because the sealed values are bound to it.
func newID() string {
	b := randomBytes(16)
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// New is an endpoint to add. Only URL is required; the zero value of every other field is the
// usual choice.
type New struct {
	// URL is where deliveries go: https, or http for a loopback host; no user or password.
	URL string
	// Description is free text for people.
	Description string
	// Tenant restricts the endpoint to its tenant's events; "" receives only events without
	// a tenant.
	Tenant string
	// EventTypes filters events (exact names and "prefix.*" patterns, see Matches); empty
	// receives every event.
	EventTypes []string
	// Scheme is SchemeFluxora (the default, for "") or SchemeStandard.
	Scheme string
	// Secret is the signing secret; "" has one generated (see GenerateSecret). A Standard
	// secret must be "whsec_" followed by base64.
	Secret string
	// Disabled adds the endpoint without routing anything to it yet. It is a negative so
	// that the zero value, enabled, is the common case.
	Disabled bool
	// RetryRPS and MaxConcurrency override the dispatcher's defaults when positive.
	RetryRPS       int
	MaxConcurrency int
	// PermanentStatuses overrides the dispatcher's WEBHOOK_PERMANENT_STATUSES: the answers
	// (HTTP statuses from 300 to 599) dead-lettered at once besides 410 Gone. nil keeps the
	// dispatcher's setting; an empty, non-nil list dead-letters none but 410.
	PermanentStatuses []int
	// Headers are extra request headers; the signature and transport headers are reserved.
	Headers map[string]string
	// Ordering is OrderingNone or OrderingStream; "" is OrderingNone, so that an endpoint
	// orders its deliveries only when asked to (order costs throughput, see OrderingNone).
	Ordering string
	// OrderingFailure is OrderingFailureSkip or OrderingFailureStop; "" is
	// OrderingFailureSkip. It may be set with OrderingNone: it then waits, unused, for the
	// endpoint to be ordered.
	OrderingFailure string
	// Restricted holds the endpoint to a producer's network policy (see Endpoint.Restricted):
	// set it when a tenant gave the URL. The zero value is an operator's endpoint.
	Restricted bool
	// TenantQuota, when positive, refuses the endpoint (QuotaError) if its tenant already has
	// that many: the management API sets MaxTenantEndpoints for a tenant's own callers.
	// Counted under a lock on the tenant's name held until the caller's transaction ends, so
	// that concurrent adds in transactions (AddAudited) cannot pass it together.
	TenantQuota int
}

// Add validates n and inserts it, with its secret and header values sealed by c (in clear
// when c has no key). The returned endpoint holds the secret in plain text: the caller shows
// it once, since nothing prints it afterwards. A validation error matches ErrInvalid and
// names the field.
func Add(ctx context.Context, q Querier, c *Cipher, n New) (Endpoint, error) {
	if n.Scheme == "" {
		n.Scheme = SchemeFluxora
	}
	if n.EventTypes == nil {
		n.EventTypes = []string{}
	}
	if n.Headers == nil {
		n.Headers = map[string]string{}
	}
	if n.Ordering == "" {
		n.Ordering = OrderingNone
	}
	if n.OrderingFailure == "" {
		n.OrderingFailure = OrderingFailureSkip
	}
	err := errors.Join(validateURL(n.URL), validateDescription(n.Description), validateScheme(n.Scheme), validateTenant(n.Tenant),
		validateFilter(n.EventTypes), validateLimit("retry_rps", n.RetryRPS),
		validateLimit("max_concurrency", n.MaxConcurrency), validateHeaders(n.Headers), validateNewHeaders(n.Headers, nil),
		validateOrdering(n.Ordering), validateOrderingFailure(n.OrderingFailure),
		validatePermanentStatuses(n.PermanentStatuses))
	if err != nil {
		return Endpoint{}, firstError(err)
	}
	secret := n.Secret
	if secret == "" {
		if secret, err = GenerateSecret(n.Scheme); err != nil {
			return Endpoint{}, err
		}
	} else if err := ValidateSecret(n.Scheme, secret); err != nil {
		return Endpoint{}, err
	}
	if n.TenantQuota > 0 && n.Tenant != "" {
		if err := checkQuota(ctx, q, n.Tenant, n.TenantQuota); err != nil {
			return Endpoint{}, err
		}
	}
	// The id is made here rather than by the column's default: every sealed value is bound to
	// it, so it must be known before the row is written.
	id := newID()
	sealedHeaders := make(map[string]string, len(n.Headers))
	for name, v := range n.Headers {
		sealedHeaders[name] = c.Seal(v, HeaderBinding(id, name))
	}
	headers, err := json.Marshal(sealedHeaders)
	if err != nil {
		return Endpoint{}, fmt.Errorf("encoding headers: %w", err)
	}
	rows, err := q.Query(ctx, insertSQL, n.URL, n.Description, nullString(n.Tenant), n.EventTypes, n.Scheme,
		c.Seal(secret, SecretBinding(id)), !n.Disabled, nullInt(n.RetryRPS), nullInt(n.MaxConcurrency), string(headers),
		n.Ordering, n.OrderingFailure, id, nullStatuses(n.PermanentStatuses), n.Restricted)
	if err != nil {
		return Endpoint{}, fmt.Errorf("adding endpoint: %w", err)
	}
	list, errs, err := collect(rows, c)
	switch {
	case err != nil:
		return Endpoint{}, fmt.Errorf("adding endpoint: %w", err)
	case len(list) != 1:
		return Endpoint{}, fmt.Errorf("adding endpoint: the insert returned %d rows", len(list))
	case errs[0] != nil:
		return list[0], errs[0]
	}
	return list[0], nil
}

// checkQuota returns a QuotaError if tenant has limit endpoints or more, after taking a
// transaction-level advisory lock on the tenant's name: two adds for one tenant count in turn.
func checkQuota(ctx context.Context, q Querier, tenant string, limit int) error {
	// The lock first, in a statement of its own: the count's snapshot must be taken once the
	// lock is held, or it could miss an add that committed while this one waited.
	if _, err := q.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('fluxhook endpoint quota ' || $1, 0))`, tenant); err != nil {
		return fmt.Errorf("locking the endpoint quota of tenant %s: %w", tenant, err)
	}
	var n int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE tenant = $1`, tenant).Scan(&n); err != nil {
		return fmt.Errorf("counting the endpoints of tenant %s: %w", tenant, err)
	}
	if n >= limit {
		return &QuotaError{Tenant: tenant, Limit: limit}
	}
	return nil
}

// firstError returns the first of a joined set of validation errors: reporting one at a time,
// each naming its field, reads better on a command line than a list.
func firstError(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		if errs := j.Unwrap(); len(errs) > 0 {
			return errs[0]
		}
	}
	return err
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// nullStatuses is a permanent-statuses list as update.sql and insert.sql take it: nil is
// NULL (the dispatcher's setting), an empty list '{}' (none but 410), and the statuses are
// stored sorted, without repeats.
func nullStatuses(list []int) []int32 {
	if list == nil {
		return nil
	}
	out := make([]int32, 0, len(list))
	for _, n := range list {
		out = append(out, int32(n))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func nullInt(n int) *int32 {
	if n == 0 {
		return nil
	}
	v := int32(n)
	return &v
}

// Get returns the endpoint with that id, its secrets opened with c. When a secret does not
// open (ErrNoKey, or sealed with another key), the error comes with the endpoint's other
// fields filled in. An unknown or malformed id gives an error matching ErrNotFound.
func Get(ctx context.Context, q Querier, c *Cipher, id string) (Endpoint, error) {
	key, err := parseID(id)
	if err != nil {
		return Endpoint{}, err
	}
	rows, err := q.Query(ctx, loadSQL, key)
	if err != nil {
		return Endpoint{}, fmt.Errorf("reading endpoint %s: %w", key, err)
	}
	list, errs, err := collect(rows, c)
	switch {
	case err != nil:
		return Endpoint{}, err
	case len(list) == 0:
		return Endpoint{}, &notFoundError{id: key}
	}
	return list[0], errs[0]
}

// List returns every endpoint, oldest first, for display. A secret that does not open with c
// is left empty instead of failing the listing, because listing must work for an operator
// who does not hold the key (nothing displayed needs the secret). Use LoadAll where the
// secrets matter: it says, per endpoint, why one does not open.
func List(ctx context.Context, q Querier, c *Cipher) ([]Endpoint, error) {
	list, _, err := LoadAll(ctx, q, c)
	if err != nil {
		return nil, err
	}
	if list == nil {
		list = []Endpoint{}
	}
	return list, nil
}

// Details is an endpoint as `fluxhook endpoints show` reports it: the row, without its
// secrets (Endpoint never marshals them), plus what an operator needs to know about them and
// about the deliveries waiting for it.
type Details struct {
	Endpoint
	// SecretEncrypted reports whether every stored secret of the row (the current one and a
	// previous one) is sealed. False means at least one is readable by anyone who can read
	// the table: set WEBHOOK_ENCRYPTION_KEY and run Reencrypt.
	SecretEncrypted bool `json:"secret_encrypted"`
	// PreviousSecretInGrace reports whether a rotated-out secret still signs (Standard sends
	// both signatures) until PreviousUntil. A previous secret without an expiry (set by SQL)
	// is not in its grace: the dispatcher signs only with one whose expiry is ahead.
	PreviousSecretInGrace bool `json:"previous_secret_in_grace"`
	// PendingDeliveries counts this endpoint's unprocessed outbox rows, the ones Remove asks
	// about.
	PendingDeliveries int64 `json:"pending_deliveries"`
	// StoppedStreams counts this endpoint's ordered streams stopped at a dead letter
	// (ordering_failure 'stop'): each delivers nothing more until that dead letter is
	// replayed or purged. Their parked heads are among PendingDeliveries.
	StoppedStreams int64 `json:"stopped_streams"`
	// LoadError says why the dispatcher cannot use the row (a secret that does not open with
	// the key given, headers that are not strings, what Sendable refuses in a row written by
	// SQL); empty when it can.
	LoadError string `json:"load_error,omitempty"`
}

// Describe returns the endpoint with that id and its Details. Unlike Get it does not fail
// when a secret does not open with c: it reports that in LoadError, which is the kind of
// problem one looks an endpoint up to find.
func Describe(ctx context.Context, q Querier, c *Cipher, id string) (Details, error) {
	e, err := Get(ctx, q, c, id)
	var d Details
	switch {
	case errors.Is(err, ErrNotFound):
		return d, err
	case err != nil && e.ID == "":
		return d, err
	case err != nil:
		d.LoadError = err.Error()
	default:
		if err := Sendable(&e); err != nil {
			d.LoadError = err.Error()
		}
	}
	d.Endpoint = e
	var secret string
	var previous *string
	err = q.QueryRow(ctx, describeSQL, e.ID).Scan(&secret, &previous, &d.PreviousSecretInGrace, &d.PendingDeliveries, &d.StoppedStreams)
	if errors.Is(err, pgx.ErrNoRows) {
		// Removed between the two reads.
		return Details{}, &notFoundError{id: e.ID}
	}
	if err != nil {
		return Details{}, fmt.Errorf("reading endpoint %s: %w", e.ID, err)
	}
	d.SecretEncrypted = IsSealed(secret) && (previous == nil || IsSealed(*previous))
	return d, nil
}

// Patch is a change to an endpoint's configuration: nil fields are left as they are. The
// secret is changed by RotateSecret, except along with a scheme change (see Update).
type Patch struct {
	URL         *string
	Description *string
	// Tenant "" removes the tenant (the endpoint then receives events without one).
	Tenant *string
	// EventTypes empty receives every event.
	EventTypes *[]string
	// RetryRPS and MaxConcurrency 0 restore the dispatcher's default.
	RetryRPS       *int
	MaxConcurrency *int
	// PermanentStatuses replaces the endpoint's permanent statuses (see New): pointing at nil
	// restores the dispatcher's WEBHOOK_PERMANENT_STATUSES, at an empty list dead-letters none
	// but 410.
	PermanentStatuses *[]int
	// Headers replaces every custom header (an empty map removes them all), or, with
	// MergeHeaders, is added to the current ones, replacing those of the same name
	// (case-insensitively).
	Headers      *map[string]string
	MergeHeaders bool
	// Scheme changes the signature scheme. A change replaces the secret (with Secret, or a
	// generated one) and drops any previous secret: a consumer switching schemes changes its
	// verification anyway, and the new secret is then guaranteed to be in the new scheme's
	// form. Setting the scheme the endpoint already has changes nothing.
	Scheme *string
	// Secret is the new secret for a scheme change; "" or nil generates one. It is refused
	// without a scheme change: rotate with RotateSecret, which keeps the old one in its grace.
	Secret *string
	// Ordering and OrderingFailure change how the endpoint's streams are delivered (see
	// New); "" is refused rather than taken as the default, since a patch sets what it is
	// given. Neither releases a stream already stopped at a dead letter (its row stays
	// parked): replay or purge that dead letter.
	Ordering        *string
	OrderingFailure *string
	// Restricted sets who vouches for the URL (see Endpoint.Restricted): true when a tenant
	// writes it, false when the operator does. nil keeps it, so that a caller that forgets it
	// never lifts a restriction; whoever writes URL should set it too.
	Restricted *bool
	// HeaderMask, when not empty, is a header value that means "keep this header's current
	// value": the mask the API shows credential-like values as, so that a client that sends
	// back the headers it read does not store the mask in place of the credential. A header
	// given the mask that the endpoint does not have is refused.
	HeaderMask string
}

// empty reports whether p changes nothing.
func (p Patch) empty() bool {
	return p.URL == nil && p.Description == nil && p.Tenant == nil && p.EventTypes == nil && p.RetryRPS == nil &&
		p.MaxConcurrency == nil && p.Headers == nil && p.Scheme == nil && p.Secret == nil && p.Ordering == nil &&
		p.OrderingFailure == nil && p.PermanentStatuses == nil && p.Restricted == nil
}

// validate checks every field p sets on its own; what depends on the current row (merged
// headers, a secret against the scheme) is checked by Update once it has read the row.
func (p Patch) validate() error {
	var errs []error
	if p.URL != nil {
		errs = append(errs, validateURL(*p.URL))
	}
	if p.Description != nil {
		errs = append(errs, validateDescription(*p.Description))
	}
	if p.Tenant != nil {
		errs = append(errs, validateTenant(*p.Tenant))
	}
	if p.EventTypes != nil {
		errs = append(errs, validateFilter(*p.EventTypes))
	}
	if p.RetryRPS != nil {
		errs = append(errs, validateLimit("retry_rps", *p.RetryRPS))
	}
	if p.MaxConcurrency != nil {
		errs = append(errs, validateLimit("max_concurrency", *p.MaxConcurrency))
	}
	if p.PermanentStatuses != nil {
		errs = append(errs, validatePermanentStatuses(*p.PermanentStatuses))
	}
	if p.Scheme != nil {
		errs = append(errs, validateScheme(*p.Scheme))
	}
	if p.Secret != nil && p.Scheme == nil {
		errs = append(errs, errSecretWithoutScheme)
	}
	if p.Ordering != nil {
		errs = append(errs, validateOrdering(*p.Ordering))
	}
	if p.OrderingFailure != nil {
		errs = append(errs, validateOrderingFailure(*p.OrderingFailure))
	}
	if err := errors.Join(errs...); err != nil {
		return firstError(err)
	}
	return nil
}

// errSecretWithoutScheme keeps rotation in one place, RotateSecret, where the old secret
// gets its grace; Update replacing it outright would break consumers mid-rotation.
var errSecretWithoutScheme = invalid("secret", "changes only with a scheme change; to replace the secret, rotate it (rotate-secret), which keeps the old one valid for a grace period")

// state is what state.sql reads: the fields an Update or a rotation decides from, which then
// guard its write.
type state struct {
	scheme  string
	headers []byte
	// secret is the current secret as stored, which a rotation re-seals as the previous one.
	secret string
	tenant *string
}

func readState(ctx context.Context, q Querier, id string) (state, error) {
	var s state
	err := q.QueryRow(ctx, stateSQL, id).Scan(&s.scheme, &s.headers, &s.secret, &s.tenant)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, &notFoundError{id: id}
	}
	if err != nil {
		return s, fmt.Errorf("reading endpoint %s: %w", id, err)
	}
	return s, nil
}

// casAttempts bounds the read-decide-write loops of Update, RotateSecret and Reencrypt: each
// retry means someone changed what the decision was based on meanwhile, which an operator's
// command meets once in a blue moon; a loop that keeps losing reports it rather than spinning.
const casAttempts = 5

// Updated is what Update did besides writing the patch.
type Updated struct {
	// NewSecret is the new secret in plain text when the patch changed the scheme (the
	// caller shows it once, as after Add), "" otherwise.
	NewSecret string
	// DeadLettered counts the pending deliveries a tenant change moved to the dead-letter
	// table (reason TenantChangedReason): they were routed under the old tenant, and an
	// event never goes to an endpoint of another tenant.
	DeadLettered int64
}

// TenantChangedReason is the dead-letter reason of the deliveries pending for an endpoint
// when its tenant was changed.
const TenantChangedReason = "endpoint tenant changed"

// Update applies p to the endpoint with that id, validating it as Add does, in one statement:
// a tenant change dead-letters the deliveries pending for the endpoint at the same time (see
// Updated). An empty patch changes nothing and only checks that the endpoint exists.
func Update(ctx context.Context, q Querier, c *Cipher, id string, p Patch) (Updated, error) {
	key, err := parseID(id)
	if err != nil {
		return Updated{}, err
	}
	if err := p.validate(); err != nil {
		return Updated{}, err
	}
	for range casAttempts {
		s, err := readState(ctx, q, key)
		if err != nil || p.empty() {
			return Updated{}, err
		}
		w, err := p.write(key, s, c)
		if err != nil {
			return Updated{}, err
		}
		var got string
		var dead int64
		err = q.QueryRow(ctx, updateSQL, key, w.set, s.scheme, string(s.headers), w.url, w.description, w.tenant,
			w.eventTypes, w.retryRPS, w.maxConcurrency, w.headers, w.scheme, w.sealed, w.ordering, w.orderingFailure, w.permanentStatuses,
			w.restricted).Scan(&got, &dead)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // its scheme or headers changed (or it was removed) since the read: decide again
		}
		if err != nil {
			return Updated{}, fmt.Errorf("updating endpoint %s: %w", key, err)
		}
		return Updated{NewSecret: w.secret, DeadLettered: dead}, nil
	}
	return Updated{}, fmt.Errorf("updating endpoint %s: it kept changing while being updated; try again", key)
}

// write is a Patch turned into update.sql's arguments.
type write struct {
	// set names the columns written; the other fields are ignored.
	set            []string
	url            string
	description    string
	tenant         *string
	eventTypes     []string
	retryRPS       *int32
	maxConcurrency *int32
	// permanentStatuses is nil for NULL (the dispatcher's setting).
	permanentStatuses []int32
	headers           *string
	scheme            string
	// sealed is the new secret as stored, nil to keep the secret; secret is it in plain text.
	sealed          *string
	secret          string
	ordering        string
	orderingFailure string
	restricted      bool
}

// write computes what p writes to endpoint id over the state s it was decided on: merged
// headers, and the new secret of a scheme change, sealed by c for id.
func (p Patch) write(id string, s state, c *Cipher) (write, error) {
	var w write
	if p.URL != nil {
		w.set, w.url = append(w.set, "url"), *p.URL
	}
	if p.Description != nil {
		w.set, w.description = append(w.set, "description"), *p.Description
	}
	if p.Tenant != nil {
		w.set, w.tenant = append(w.set, "tenant"), nullString(*p.Tenant)
		if err := p.checkMove(s, w.tenant); err != nil {
			return w, err
		}
	}
	if p.EventTypes != nil {
		w.set, w.eventTypes = append(w.set, "event_types"), *p.EventTypes
		if w.eventTypes == nil {
			w.eventTypes = []string{}
		}
	}
	if p.RetryRPS != nil {
		w.set, w.retryRPS = append(w.set, "retry_rps"), nullInt(*p.RetryRPS)
	}
	if p.MaxConcurrency != nil {
		w.set, w.maxConcurrency = append(w.set, "max_concurrency"), nullInt(*p.MaxConcurrency)
	}
	if p.PermanentStatuses != nil {
		w.set, w.permanentStatuses = append(w.set, "permanent_statuses"), nullStatuses(*p.PermanentStatuses)
	}
	if p.Ordering != nil {
		w.set, w.ordering = append(w.set, "ordering"), *p.Ordering
	}
	if p.OrderingFailure != nil {
		w.set, w.orderingFailure = append(w.set, "ordering_failure"), *p.OrderingFailure
	}
	if p.Restricted != nil {
		w.set, w.restricted = append(w.set, "restricted"), *p.Restricted
	}
	if p.Headers != nil {
		if err := validateHeaders(*p.Headers); err != nil {
			return w, err
		}
		var had map[string]string
		_ = json.Unmarshal(s.headers, &had) // not an object: no header is kept, all are new
		if err := validateNewHeaders(*p.Headers, had); err != nil {
			return w, err
		}
		// h holds the headers as stored: the ones kept by a merge as they are (a sealed value
		// needs no key to be kept, and stays bound to its name), those in clear sealed now
		// that there is a key, and the new ones sealed.
		h := map[string]string{}
		kept, err := p.keptHeaders(id, s, c)
		if err != nil {
			return w, err
		}
		if p.MergeHeaders {
			if err := json.Unmarshal(s.headers, &h); err != nil {
				return w, invalid("headers", "the stored headers are not a JSON object of strings (%v); replace them all instead of adding to them", err)
			}
			for name := range *p.Headers {
				maps.DeleteFunc(h, func(k, _ string) bool { return strings.EqualFold(k, name) })
			}
			names := make(map[string]string, len(h)+len(*p.Headers))
			for name := range h {
				names[name] = ""
			}
			for name := range *p.Headers {
				names[name] = ""
			}
			if err := validateHeaders(names); err != nil {
				return w, err
			}
			for name, v := range h {
				if !IsSealed(v) {
					h[name] = c.Seal(v, HeaderBinding(id, name))
				}
			}
		}
		for name, v := range *p.Headers {
			if stored, ok := kept[name]; ok {
				h[name] = stored
				continue
			}
			h[name] = c.Seal(v, HeaderBinding(id, name))
		}
		// Every header the endpoint will have counts against MaxHeaderBytes, those kept (by a
		// merge, or sent back masked) by their value, not by what the request said of them.
		if size := headerBytes(id, h, c); size > MaxHeaderBytes {
			return w, invalid("headers", "%d bytes of names and values with the headers kept; at most %d", size, MaxHeaderBytes)
		}
		b, err := json.Marshal(h)
		if err != nil {
			return w, fmt.Errorf("encoding headers: %w", err)
		}
		encoded := string(b)
		w.set, w.headers = append(w.set, "headers"), &encoded
	}
	if p.Scheme == nil || *p.Scheme == s.scheme {
		if p.Secret != nil {
			return w, errSecretWithoutScheme
		}
		return w, nil
	}
	w.set, w.scheme = append(w.set, "scheme"), *p.Scheme
	if p.Secret != nil && *p.Secret != "" {
		if err := ValidateSecret(w.scheme, *p.Secret); err != nil {
			return w, err
		}
		w.secret = *p.Secret
	} else {
		var err error
		if w.secret, err = GenerateSecret(w.scheme); err != nil {
			return w, err
		}
	}
	sealed := c.Seal(w.secret, SecretBinding(id))
	w.sealed = &sealed
	return w, nil
}

// checkMove refuses a move to another tenant (to is the new tenant, nil for none) that would
// carry a credential header's value (SensitiveHeader) over from the endpoint's tenant: kept
// unchanged, merged, or kept through HeaderMask. The new tenant may point the URL at its own
// server, and the dispatcher would send it the old tenant's credential there. The audit trail
// and the pending deliveries are kept apart on a move (see update.sql); the headers, given
// anew in the same change, are too.
func (p Patch) checkMove(s state, to *string) error {
	if (s.tenant == nil) == (to == nil) && (s.tenant == nil || *s.tenant == *to) {
		return nil
	}
	var stored map[string]string
	_ = json.Unmarshal(s.headers, &stored)
	var carried []string
	for name := range stored {
		if !SensitiveHeader(name) {
			continue
		}
		replaced := p.Headers != nil && !p.MergeHeaders
		if replaced {
			for given, v := range *p.Headers {
				if strings.EqualFold(given, name) && p.HeaderMask != "" && v == p.HeaderMask {
					replaced = false
				}
			}
		}
		if !replaced {
			carried = append(carried, name)
		}
	}
	if len(carried) == 0 {
		return nil
	}
	slices.Sort(carried)
	return invalid("headers", "moving the endpoint to another tenant would hand it the current tenant's credential headers (%s); "+
		"give the headers anew in the same change, replacing them all (the API: \"headers\", {} for none; the CLI: --clear-headers)", strings.Join(carried, ", "))
}

// keptHeaders returns, by name, the values as stored of the headers p gives the mask
// (HeaderMask): the endpoint's current values, which the mask stands for. A value stored under
// the same name is kept as it is (sealed now if it is in clear and c has a key); one stored
// under the name in another case is opened and sealed again for the new name, since a sealed
// value is bound to its name. A masked header the endpoint does not have is refused: storing
// the mask would replace a credential with eight asterisks.
func (p Patch) keptHeaders(id string, s state, c *Cipher) (map[string]string, error) {
	if p.HeaderMask == "" || p.Headers == nil {
		return nil, nil
	}
	var stored map[string]string
	kept := map[string]string{}
	for name, v := range *p.Headers {
		if v != p.HeaderMask {
			continue
		}
		if stored == nil {
			if err := json.Unmarshal(s.headers, &stored); err != nil {
				return nil, invalid("headers", "the stored headers are not a JSON object of strings (%v); give every value itself", err)
			}
		}
		if v, ok := stored[name]; ok {
			if !IsSealed(v) {
				v = c.Seal(v, HeaderBinding(id, name))
			}
			kept[name] = v
			continue
		}
		found := false
		for other, v := range stored {
			if !strings.EqualFold(other, name) {
				continue
			}
			plain, err := c.Open(v, HeaderBinding(id, other))
			if err != nil {
				return nil, invalid("headers", "header %q: its current value (under %q) does not open to be kept under the new name (%v); give the value itself", name, other, err)
			}
			kept[name], found = c.Seal(plain, HeaderBinding(id, name)), true
			break
		}
		if !found {
			return nil, invalid("headers", "header %q: %q stands for a value the endpoint has, and it has no such header; give the value itself", name, p.HeaderMask)
		}
	}
	return kept, nil
}

// headerBytes is the size of the headers stored (as h holds them) for endpoint id, names and
// values: each value opened, or as stored (longer) when it does not open with c.
func headerBytes(id string, h map[string]string, c *Cipher) int {
	size := 0
	for name, v := range h {
		if plain, err := c.Open(v, HeaderBinding(id, name)); err == nil {
			v = plain
		}
		size += len(name) + len(v)
	}
	return size
}

// DefaultDisabledReason is stored by Disable when no reason is given, so that list and show
// never leave a disabled endpoint unexplained.
const DefaultDisabledReason = "disabled by an operator"

// Disable stops routing events to the endpoint, keeping its configuration. The dispatcher
// dead-letters the deliveries already pending for it (reason "endpoint disabled: " and
// reason) when it sees the change, so that they can be replayed once it is enabled again.
// reason is shown by list and show; "" stores DefaultDisabledReason.
func Disable(ctx context.Context, q Querier, id, reason string) error {
	if reason == "" {
		reason = DefaultDisabledReason
	}
	if len(reason) > MaxDisabledReason {
		return invalid("reason", "%d bytes; at most %d", len(reason), MaxDisabledReason)
	}
	if err := validText("reason", reason, true); err != nil {
		return err
	}
	return updateOne(ctx, q, disableSQL, "disabling", id, reason)
}

// Enable routes events to the endpoint again and clears its disabled reason and failure
// streak (failing_since).
func Enable(ctx context.Context, q Querier, id string) error {
	return updateOne(ctx, q, enableSQL, "enabling", id)
}

// updateOne runs a single-row statement that returns the id it wrote, turning "no row" into
// not found.
func updateOne(ctx context.Context, q Querier, sql, verb, id string, args ...any) error {
	key, err := parseID(id)
	if err != nil {
		return err
	}
	var got string
	err = q.QueryRow(ctx, sql, append([]any{key}, args...)...).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return &notFoundError{id: key}
	}
	if err != nil {
		return fmt.Errorf("%s endpoint %s: %w", verb, key, err)
	}
	return nil
}

// DefaultGrace is how long a rotated-out secret keeps signing when RotateSecret is given no
// grace: a day covers a consumer deploying its new secret on its own schedule.
const DefaultGrace = 24 * time.Hour

// NoGrace, as RotateSecret's grace, drops the current secret at once: for a secret that
// leaked, where every signature it still makes is a forgery risk.
const NoGrace time.Duration = -1

// RotateSecret replaces the endpoint's secret with newSecret ("" generates one, as Add does)
// and returns the new secret in plain text, for the caller to show once. The current secret
// becomes the previous secret until grace from now (0 means DefaultGrace, NoGrace keeps
// none): Standard endpoints are signed with both meanwhile, and Fluxora consumers may accept
// both. A previous secret still in its grace is replaced: rotating twice within the grace
// leaves consumers that only know the oldest secret failing. Keeping the current secret for a
// grace opens it with c (it is re-sealed as the previous secret), so that needs the key that
// sealed it; NoGrace does not.
func RotateSecret(ctx context.Context, q Querier, c *Cipher, id, newSecret string, grace time.Duration) (string, error) {
	key, err := parseID(id)
	if err != nil {
		return "", err
	}
	var graceMicros *int64
	switch {
	case grace == 0:
		us := DefaultGrace.Microseconds()
		graceMicros = &us
	case grace > 0:
		us := grace.Microseconds()
		graceMicros = &us
	}
	for range casAttempts {
		s, err := readState(ctx, q, key)
		if err != nil {
			return "", err
		}
		secret := newSecret
		if secret == "" {
			if secret, err = GenerateSecret(s.scheme); err != nil {
				return "", err
			}
		} else if err := ValidateSecret(s.scheme, secret); err != nil {
			return "", err
		}
		// The current secret, kept for the grace, is re-sealed as the previous one: sealed
		// values are bound to their field, so that SQL cannot swap the two and have a
		// rotated-out secret sign again without an expiry.
		var previous *string
		if graceMicros != nil {
			plain, err := c.Open(s.secret, SecretBinding(key))
			if err != nil {
				return "", fmt.Errorf("rotating the secret of endpoint %s: the current secret cannot be kept for the grace: %w"+
					" (give the key that sealed it, or rotate with no grace)", key, err)
			}
			sealed := c.Seal(plain, PreviousSecretBinding(key))
			previous = &sealed
		}
		var got string
		err = q.QueryRow(ctx, rotateSQL, key, s.scheme, c.Seal(secret, SecretBinding(key)), graceMicros, previous, s.secret).
			Scan(&got)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // its scheme or secret changed (or it was removed) since the read: decide again
		}
		if err != nil {
			return "", fmt.Errorf("rotating the secret of endpoint %s: %w", key, err)
		}
		return secret, nil
	}
	return "", fmt.Errorf("rotating the secret of endpoint %s: it kept changing meanwhile; try again", key)
}

// PendingAction is what Remove does with the endpoint's pending deliveries.
type PendingAction string

const (
	// PendingRefuse (the default, also for "") removes nothing while deliveries are pending:
	// removing an endpoint must not lose events silently.
	PendingRefuse PendingAction = "refuse"
	// PendingDeadLetter moves them to webhook_dead_letter, reason "endpoint removed", where
	// they stay, for inspection, until purged.
	PendingDeadLetter PendingAction = "dead-letter"
	// PendingDrop deletes them: those events are lost for this endpoint.
	PendingDrop PendingAction = "drop"
)

// ParsePendingAction checks a PendingAction given as text ("" is PendingRefuse).
func ParsePendingAction(s string) (PendingAction, error) {
	switch a := PendingAction(s); a {
	case "":
		return PendingRefuse, nil
	case PendingRefuse, PendingDeadLetter, PendingDrop:
		return a, nil
	}
	return "", invalid("pending", "%q is not an action; use %q, %q or %q", s, PendingRefuse, PendingDeadLetter, PendingDrop)
}

// PendingError is Remove's refusal: the endpoint has deliveries pending and the action was
// PendingRefuse. Nothing was changed.
type PendingError struct {
	ID      string
	Pending int64
}

// Error says what is pending and that nothing changed; the CLI replaces it with its flags.
func (e *PendingError) Error() string {
	return fmt.Sprintf("endpoint %s has %d deliveries pending; nothing was removed: choose whether they are dead-lettered or dropped", e.ID, e.Pending)
}

// Removed is what Remove did with the pending deliveries. DeadLettered does not count the
// rows of ordered streams stopped at a dead letter: those are settled without a second dead
// letter, since theirs is in the table already.
type Removed struct {
	DeadLettered int64
	Dropped      int64
}

// Remove deletes the endpoint, doing with its pending deliveries (unprocessed outbox rows
// routed to it) what action says, in one statement. A delivery a dispatcher is attempting at
// that moment is settled here; the dispatcher's own settle of it then writes nothing. Events
// routed after the removal no longer match it; a delivery routed in the same instant, which
// this statement could not see, is dead-lettered by the dispatcher ("endpoint ... was
// removed"). Dead letters of a removed endpoint are kept: `dlq replay` skips them, since
// they would only fail again, unless --to-endpoint names another endpoint of their tenant.
func Remove(ctx context.Context, q Querier, id string, action PendingAction) (Removed, error) {
	key, err := parseID(id)
	if err != nil {
		return Removed{}, err
	}
	if action, err = ParsePendingAction(string(action)); err != nil {
		return Removed{}, err
	}
	var existed, removed bool
	var pending int64
	var r Removed
	err = q.QueryRow(ctx, removeSQL, key, string(action)).Scan(&existed, &pending, &r.DeadLettered, &r.Dropped, &removed)
	switch {
	case err != nil:
		return Removed{}, fmt.Errorf("removing endpoint %s: %w", key, err)
	case !existed:
		return Removed{}, &notFoundError{id: key}
	case !removed:
		return Removed{}, &PendingError{ID: key, Pending: pending}
	}
	return r, nil
}

// Resealed counts what Reseal rewrote.
type Resealed struct {
	// Endpoints is the number of rows rewritten.
	Endpoints int `json:"reencrypted"`
	// Secrets counts the secrets (current and previous) and Headers the header values that
	// were re-sealed, sealed from clear, or bound (from the legacy format).
	Secrets int `json:"secrets"`
	Headers int `json:"headers"`
}

// Reencrypt is Reseal counting only the endpoints rewritten.
func Reencrypt(ctx context.Context, q Querier, c *Cipher) (int, error) {
	r, err := Reseal(ctx, q, c)
	return r.Endpoints, err
}

// Reseal seals every secret (current and previous) and custom header value with c's current
// key, bound to its endpoint and field, and returns what it rewrote. It is the second half of
// a key rotation (set WEBHOOK_ENCRYPTION_KEY to the new key and WEBHOOK_ENCRYPTION_KEY_PREVIOUS
// to the old one, run this, then unset the previous key); it also seals values stored in
// clear, by SQL or before a key was set, and binds secrets sealed by an older fluxhook
// ("enc:v1:", which opened wherever they were copied). Values already sealed bound with the
// current key are left as they are, so running it again rewrites nothing. It needs a key:
// without one there is nothing to seal with. If any value does not open (sealed with a key c
// does not hold, or for another endpoint or field), nothing is written and the error names
// the endpoints: re-sealing a copied value would bind it where it was copied.
func Reseal(ctx context.Context, q Querier, c *Cipher) (Resealed, error) {
	var total Resealed
	if !c.HasKey() {
		return total, errors.New("WEBHOOK_ENCRYPTION_KEY is not set: there is no key to seal the secrets with")
	}
	// Opens only what the current key sealed bound: anything else needs re-sealing.
	current := &Cipher{current: c.current}
	stale := func(stored string, b Binding) bool {
		if !isBound(stored) {
			return true
		}
		_, err := current.Open(stored, b)
		return err != nil
	}
	// reseal returns the new stored form of a stale value.
	reseal := func(stored string, b Binding) (string, error) {
		plain, err := c.Open(stored, b)
		if err != nil {
			return "", err
		}
		return c.Seal(plain, b), nil
	}
	type stored struct {
		id       string
		secret   string
		previous *string
		headers  string
	}
	for range casAttempts {
		rows, err := q.Query(ctx, secretsSQL)
		if err != nil {
			return total, fmt.Errorf("reading secrets: %w", err)
		}
		all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stored, error) {
			var s stored
			return s, r.Scan(&s.id, &s.secret, &s.previous, &s.headers)
		})
		if err != nil {
			return total, fmt.Errorf("reading secrets: %w", err)
		}
		var ids, oldSecrets, oldHeaders, newSecrets, newHeaders []string
		var oldPrevious, newPrevious []*string
		counts := map[string]Resealed{}
		var problems []error
		for _, s := range all {
			var n Resealed
			secret := s.secret
			if stale(s.secret, SecretBinding(s.id)) {
				if secret, err = reseal(s.secret, SecretBinding(s.id)); err != nil {
					problems = append(problems, fmt.Errorf("endpoint %s: secret: %w", s.id, err))
					continue
				}
				n.Secrets++
			}
			previous := s.previous
			if s.previous != nil && stale(*s.previous, PreviousSecretBinding(s.id)) {
				sealed, err := reseal(*s.previous, PreviousSecretBinding(s.id))
				if err != nil {
					problems = append(problems, fmt.Errorf("endpoint %s: previous secret: %w", s.id, err))
					continue
				}
				previous = &sealed
				n.Secrets++
			}
			headers := map[string]string{}
			if err := json.Unmarshal([]byte(s.headers), &headers); err != nil {
				problems = append(problems, fmt.Errorf("endpoint %s: headers must be a JSON object of strings: %w", s.id, err))
				continue
			}
			var headerErr error
			for _, name := range slices.Sorted(maps.Keys(headers)) {
				if !stale(headers[name], HeaderBinding(s.id, name)) {
					continue
				}
				sealed, err := reseal(headers[name], HeaderBinding(s.id, name))
				if err != nil {
					headerErr = fmt.Errorf("endpoint %s: header %q: %w", s.id, name, err)
					break
				}
				headers[name] = sealed
				n.Headers++
			}
			if headerErr != nil {
				problems = append(problems, headerErr)
				continue
			}
			if n.Secrets == 0 && n.Headers == 0 {
				continue
			}
			encoded, err := json.Marshal(headers)
			if err != nil {
				return total, fmt.Errorf("encoding headers: %w", err)
			}
			n.Endpoints = 1
			counts[s.id] = n
			ids, oldSecrets, oldPrevious, oldHeaders = append(ids, s.id), append(oldSecrets, s.secret), append(oldPrevious, s.previous), append(oldHeaders, s.headers)
			newSecrets, newPrevious, newHeaders = append(newSecrets, secret), append(newPrevious, previous), append(newHeaders, string(encoded))
		}
		if len(problems) > 0 {
			what := "nothing was re-sealed"
			if total.Endpoints > 0 {
				what = fmt.Sprintf("stopped after re-sealing %d endpoints", total.Endpoints)
			}
			return total, fmt.Errorf("%s: %w", what, errors.Join(problems...))
		}
		if len(ids) == 0 {
			return total, nil
		}
		rows, err = q.Query(ctx, resealSQL, ids, oldSecrets, oldPrevious, oldHeaders, newSecrets, newPrevious, newHeaders)
		if err != nil {
			return total, fmt.Errorf("re-sealing secrets: %w", err)
		}
		written, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return total, fmt.Errorf("re-sealing secrets: %w", err)
		}
		for _, id := range written {
			n := counts[id]
			total.Endpoints, total.Secrets, total.Headers = total.Endpoints+n.Endpoints, total.Secrets+n.Secrets, total.Headers+n.Headers
		}
		if len(written) == len(ids) {
			return total, nil
		}
		// Some rows changed since the read (a rotation, an update): read them again.
	}
	return total, errors.New("re-sealing secrets: they kept changing meanwhile; run it again")
}
