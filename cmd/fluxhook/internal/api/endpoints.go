package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/audit"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/send"
)

var netResolver = net.DefaultResolver

// Breakers reads circuit-breaker state, for an endpoint's health: the Redis gate's store
// (REDIS_URL). Without one the state lives inside each dispatcher and health says so.
type Breakers interface {
	Inspect(ctx context.Context, hashes []string) ([]gate.Snapshot, error)
}

// endpointView is an endpoint as the API shows it: never its secrets, and the values of
// headers that look like credentials masked.
type endpointView struct {
	ID                string            `json:"id"`
	URL               string            `json:"url"`
	Description       string            `json:"description"`
	Tenant            *string           `json:"tenant"`
	EventTypes        []string          `json:"event_types"`
	Scheme            string            `json:"scheme"`
	Enabled           bool              `json:"enabled"`
	DisabledAt        *time.Time        `json:"disabled_at"`
	DisabledReason    *string           `json:"disabled_reason"`
	RetryRPS          *int              `json:"retry_rps"`
	MaxConcurrency    *int              `json:"max_concurrency"`
	PermanentStatuses []int             `json:"permanent_statuses"`
	Headers           map[string]string `json:"headers"`
	Ordering          string            `json:"ordering"`
	OrderingFailure   string            `json:"ordering_failure"`
	Restricted        bool              `json:"restricted"`
	LastSuccessAt     *time.Time        `json:"last_success_at"`
	FailingSince      *time.Time        `json:"failing_since"`
	CreatedAt         time.Time         `json:"created_at"`
	UpdatedAt         time.Time         `json:"updated_at"`
}

// maskedValue stands for a credential-like header value: shown as set, never as it is.
const maskedValue = "********"

func viewOf(e endpoints.Endpoint) endpointView {
	v := endpointView{ID: e.ID, URL: e.URL, Description: e.Description, EventTypes: e.EventTypes, Scheme: e.Scheme,
		Enabled: e.Enabled, PermanentStatuses: e.PermanentStatuses, Headers: maps.Clone(e.Headers),
		Ordering: e.Ordering, OrderingFailure: e.OrderingFailure, Restricted: e.Restricted, CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt,
		DisabledAt: timePtr(e.DisabledAt), LastSuccessAt: timePtr(e.LastSuccessAt), FailingSince: timePtr(e.FailingSince)}
	if e.Tenant != "" || e.EmptyTenant {
		t := e.Tenant
		v.Tenant = &t
	}
	if e.DisabledReason != "" {
		r := e.DisabledReason
		v.DisabledReason = &r
	}
	if e.RetryRPS > 0 {
		n := e.RetryRPS
		v.RetryRPS = &n
	}
	if e.MaxConcurrency > 0 {
		n := e.MaxConcurrency
		v.MaxConcurrency = &n
	}
	if v.Headers == nil {
		v.Headers = map[string]string{}
	}
	for k := range v.Headers {
		if endpoints.SensitiveHeader(k) {
			v.Headers[k] = maskedValue
		}
	}
	if v.EventTypes == nil {
		v.EventTypes = []string{}
	}
	return v
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// endpointWithSecret is the answer to a create or a rotation: the only time the secret is shown.
type endpointWithSecret struct {
	endpointView
	Secret string `json:"secret"`
}

// endpointInput is the body of a create and of an update: in an update, absent fields are
// left as they are.
type endpointInput struct {
	URL         *string `json:"url"`
	Description *string `json:"description"`
	// Tenant tells null (no tenant) from absent, in a create and in an update alike.
	Tenant            nullable[string]   `json:"tenant"`
	EventTypes        *[]string          `json:"event_types"`
	Scheme            *string            `json:"scheme"`
	Secret            *string            `json:"secret"`
	Enabled           *bool              `json:"enabled"`
	RetryRPS          *int               `json:"retry_rps"`
	MaxConcurrency    *int               `json:"max_concurrency"`
	PermanentStatuses *[]int             `json:"permanent_statuses"`
	Headers           *map[string]string `json:"headers"`
	Ordering          *string            `json:"ordering"`
	OrderingFailure   *string            `json:"ordering_failure"`
}

// nullable is a JSON member that tells absent (Set false) from null (Set, Value nil), where the
// two mean different things: in an update, an absent tenant is kept and a null one removed.
type nullable[T any] struct {
	Set   bool
	Value *T
}

// UnmarshalJSON is called for null too (encoding/json hands null to an Unmarshaler), which is
// what tells it from absent.
func (n *nullable[T]) UnmarshalJSON(b []byte) error {
	n.Set = true
	if string(b) == "null" {
		n.Value = nil
		return nil
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	n.Value = &v
	return nil
}

// storeError turns an endpoints store error into the API's: invalid input names its field,
// not found is 404, anything else is internal.
func storeError(err error, id string) error {
	var inv *endpoints.InvalidError
	var pending *endpoints.PendingError
	var quota *endpoints.QuotaError
	switch {
	case errors.As(err, &inv):
		return errInvalid(inv.Field, "%s", inv.Error())
	case errors.As(err, &quota):
		return errConflict("%v", quota)
	case errors.Is(err, endpoints.ErrNotFound):
		return errNotFound("endpoint", id)
	case errors.As(err, &pending):
		return errConflict("endpoint %s has %d deliveries pending; nothing was removed: pass ?pending=dead-letter or ?pending=drop", id, pending.Pending)
	}
	return err
}

// checkURL refuses, at create or update time, a URL the dispatchers could never deliver to:
// malformed, with credentials, or leading only to addresses its network policy does not
// allow, its host name resolved as the dial would. The policy is the one the dispatchers
// will dial the endpoint under: the operator's (WEBHOOK_ALLOWED_NETWORKS, loopback URLs) for
// an unrestricted endpoint, a producer's (public addresses, WEBHOOK_ROW_URL_NETWORKS) for a
// restricted one, whose refusal says what a tenant can do: use a public address (the settings
// are not theirs to change).
func (s *Server) checkURL(ctx context.Context, raw string, restricted bool) error {
	if err := send.ValidateURL(raw); err != nil {
		return errInvalid("url", "url: %v", err)
	}
	networks := s.cfg.AllowedNetworks
	if restricted {
		networks = s.cfg.RowURLNetworks
	}
	u, _ := url.Parse(raw)
	host := u.Hostname()
	// A tenant's refusal is the same whether the name resolved to an address it may not use or
	// did not resolve at all, and carries neither the address nor the resolver's error (which
	// names the dispatcher's DNS server): told apart, a tenant could list which internal names
	// exist.
	refused := func(err error) error {
		if restricted {
			return errInvalid("url", "url: the host %s does not lead to a public address; an endpoint's URL must lead to a public address "+
				"(a DNS name not published yet: create the endpoint once it is)", host)
		}
		return errInvalid("url", "url: %v", err)
	}
	if err := send.CheckURL(raw, networks, restricted); err != nil {
		return refused(err)
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if _, err := netip.ParseAddr(host); err == nil || name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return nil // judged by CheckURL without a lookup, as the dial will be (RFC 6761 names are loopback)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := s.cfg.Resolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		if restricted {
			return refused(err)
		}
		return errInvalid("url", "url: the host %s does not resolve (%v); create the endpoint once its DNS name exists", host, err)
	}
	if err := send.CheckResolved(addrs, networks, restricted); err != nil {
		return refused(err)
	}
	return nil
}

func (s *Server) listEndpoints(q *request) error {
	limit, err := q.limit()
	if err != nil {
		return err
	}
	pq := endpoints.PageQuery{Scope: q.scope(), Tenant: q.tenantParam(), Limit: limit + 1}
	switch v := q.r.URL.Query().Get("enabled"); v {
	case "":
	case "true", "false":
		b := v == "true"
		pq.Enabled = &b
	default:
		return errInvalid("enabled", "enabled: must be true or false, not %q", v)
	}
	var c struct {
		Created time.Time `json:"c"`
		ID      string    `json:"i"`
	}
	if ok, err := q.cursor(&c); err != nil {
		return err
	} else if ok {
		pq.AfterCreated, pq.AfterID = c.Created, c.ID
	}
	list, err := endpoints.Page(q.ctx, q.s.cfg.Pool, q.s.cfg.Cipher, pq)
	if err != nil {
		if errors.Is(err, endpoints.ErrNotFound) {
			return errBadCursor
		}
		return err
	}
	writeJSON(q.w, http.StatusOK, pageOf(list, limit, viewOf, func(last endpoints.Endpoint) *string {
		c.Created, c.ID = last.CreatedAt, last.ID
		return encodeCursor(c)
	}))
	return nil
}

// withEndpoint runs fn in a transaction on the endpoint id, locked, if the caller's scope may
// see it (404 otherwise, as for a missing one): the reads and writes of one endpoint's route.
func (s *Server) withEndpoint(q *request, id string, fn func(tx pgx.Tx, e endpoints.Endpoint) error) error {
	return pgx.BeginFunc(q.ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		if err := endpoints.LockInScope(q.ctx, tx, id, q.scope()); err != nil {
			return storeError(err, id)
		}
		e, err := s.getScoped(q.ctx, tx, id, q.scope())
		if err != nil {
			return err
		}
		return fn(tx, e)
	})
}

// getScoped reads the endpoint id if the caller's scope may see it.
func (s *Server) getScoped(ctx context.Context, q pgx.Tx, id string, scope *string) (endpoints.Endpoint, error) {
	e, err := endpoints.Get(ctx, q, s.cfg.Cipher, id)
	if err != nil && e.ID == "" {
		return e, storeError(err, id)
	}
	if !endpoints.InScope(e, scope) {
		return endpoints.Endpoint{}, errNotFound("endpoint", id)
	}
	return e, nil
}

func (s *Server) getEndpoint(q *request) error {
	id := q.r.PathValue("id")
	return s.withEndpoint(q, id, func(tx pgx.Tx, e endpoints.Endpoint) error {
		writeJSON(q.w, http.StatusOK, viewOf(e))
		return nil
	})
}

func (s *Server) createEndpoint(q *request) error {
	var in endpointInput
	if err := q.decode(&in); err != nil {
		return err
	}
	if in.URL == nil || *in.URL == "" {
		return errInvalid("url", "url: required")
	}
	// A URL the caller does not vouch for as the operator is restricted: dialled, and checked
	// here, as a producer's endpoint_url.
	n := endpoints.New{URL: *in.URL, Description: deref(in.Description), Scheme: deref(in.Scheme), Secret: deref(in.Secret),
		Ordering: deref(in.Ordering), OrderingFailure: deref(in.OrderingFailure), Restricted: !q.vouches()}
	switch scope, tenant := q.scope(), in.Tenant.Value; {
	case scope != nil && tenant != nil && *tenant != *scope:
		return errInvalid("tenant", "tenant: a tenant key creates endpoints of its own tenant (%q) only; leave tenant out", *scope)
	case scope != nil:
		n.Tenant, n.TenantQuota = *scope, endpoints.MaxTenantEndpoints
	case tenant != nil:
		if *tenant == "" {
			return errInvalid("tenant", "tenant: omit it or use null for an endpoint without a tenant; the empty string is not a tenant")
		}
		n.Tenant = *tenant
	}
	if in.EventTypes != nil {
		n.EventTypes = *in.EventTypes
	}
	if in.Enabled != nil {
		n.Disabled = !*in.Enabled
	}
	if in.RetryRPS != nil {
		n.RetryRPS = *in.RetryRPS
	}
	if in.MaxConcurrency != nil {
		n.MaxConcurrency = *in.MaxConcurrency
	}
	if in.PermanentStatuses != nil {
		n.PermanentStatuses = *in.PermanentStatuses
		if n.PermanentStatuses == nil {
			n.PermanentStatuses = []int{}
		}
	}
	if in.Headers != nil {
		n.Headers = *in.Headers
	}
	if err := s.checkURL(q.ctx, n.URL, n.Restricted); err != nil {
		return err
	}
	added, err := endpoints.AddAudited(q.ctx, s.cfg.Pool, s.cfg.Cipher, n, q.actor())
	if err != nil {
		return storeError(err, "")
	}
	writeJSON(q.w, http.StatusCreated, endpointWithSecret{endpointView: viewOf(added), Secret: added.Secret})
	return nil
}

func tenantOf(e endpoints.Endpoint) *string {
	if e.Tenant == "" && !e.EmptyTenant {
		return nil
	}
	t := e.Tenant
	return &t
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// change runs fn on the endpoint id in one transaction, in the caller's scope, recorded in the
// audit trail (endpoints.Audited), and returns the endpoint after.
func (s *Server) change(q *request, id, action string, fn func(tx pgx.Tx) error) (endpoints.Endpoint, error) {
	after, err := endpoints.Audited(q.ctx, s.cfg.Pool, s.cfg.Cipher, id, q.scope(), q.actor(), action, fn)
	return after, storeError(err, id)
}

func (s *Server) updateEndpoint(q *request) error {
	id := q.r.PathValue("id")
	var in endpointInput
	if err := q.decode(&in); err != nil {
		return err
	}
	if in.Enabled != nil {
		return errInvalid("enabled", "enabled: use POST /v1/endpoints/{id}/enable or /disable, which say why")
	}
	p := endpoints.Patch{URL: in.URL, Description: in.Description, EventTypes: in.EventTypes,
		RetryRPS: in.RetryRPS, MaxConcurrency: in.MaxConcurrency, PermanentStatuses: in.PermanentStatuses,
		Headers: in.Headers, Scheme: in.Scheme, Secret: in.Secret, Ordering: in.Ordering, OrderingFailure: in.OrderingFailure,
		// GET shows credential-like header values masked: sent back as they were read, they
		// keep the values they stand for.
		HeaderMask: maskedValue}
	if in.Tenant.Set {
		// As in a create, null is no tenant and "" is refused, not taken for one.
		switch tenant := in.Tenant.Value; {
		case q.scope() != nil:
			return errInvalid("tenant", "tenant: only an admin key moves an endpoint to another tenant")
		case tenant == nil:
			none := ""
			p.Tenant = &none
		case *tenant == "":
			return errInvalid("tenant", "tenant: use null to remove the endpoint's tenant; the empty string is not a tenant")
		default:
			p.Tenant = tenant
		}
	}
	if in.URL != nil {
		// Whoever writes the URL decides whether it is restricted: a tenant's is (even over an
		// operator's), an admin key's is not, even when it writes the URL the endpoint has,
		// which is how an operator vouches for a tenant's URL.
		restricted := !q.vouches()
		if err := s.checkURL(q.ctx, *in.URL, restricted); err != nil {
			return err
		}
		p.Restricted = &restricted
	}
	var newSecret string
	after, err := s.change(q, id, "endpoint.update", func(tx pgx.Tx) error {
		u, err := endpoints.Update(q.ctx, tx, s.cfg.Cipher, id, p)
		newSecret = u.NewSecret
		return err
	})
	if err != nil {
		return err
	}
	if newSecret != "" {
		writeJSON(q.w, http.StatusOK, endpointWithSecret{endpointView: viewOf(after), Secret: newSecret})
		return nil
	}
	writeJSON(q.w, http.StatusOK, viewOf(after))
	return nil
}

func (s *Server) deleteEndpoint(q *request) error {
	id := q.r.PathValue("id")
	action, err := endpoints.ParsePendingAction(q.r.URL.Query().Get("pending"))
	if err != nil {
		return errInvalid("pending", "pending: %v", strings.TrimPrefix(err.Error(), "pending: "))
	}
	removed, err := endpoints.RemoveAudited(q.ctx, s.cfg.Pool, s.cfg.Cipher, id, q.scope(), q.actor(), action)
	if err != nil {
		return storeError(err, id)
	}
	writeJSON(q.w, http.StatusOK, removedView{DeadLettered: removed.DeadLettered, Dropped: removed.Dropped})
	return nil
}

// removedView is what a delete did with the endpoint's pending deliveries.
type removedView struct {
	DeadLettered int64 `json:"dead_lettered"`
	Dropped      int64 `json:"dropped"`
}

func (s *Server) rotateSecret(q *request) error {
	id := q.r.PathValue("id")
	var in struct {
		Secret       *string `json:"secret"`
		GraceSeconds *int64  `json:"grace_seconds"`
	}
	if q.r.ContentLength != 0 {
		if err := q.decode(&in); err != nil {
			return err
		}
	}
	grace := time.Duration(0)
	if in.GraceSeconds != nil {
		switch g := *in.GraceSeconds; {
		case g < 0 || g > 30*24*3600:
			return errInvalid("grace_seconds", "grace_seconds: from 0 (the old secret stops at once) to 2592000 (30 days), not %d", g)
		case g == 0:
			grace = endpoints.NoGrace
		default:
			grace = time.Duration(g) * time.Second
		}
	}
	var secret string
	after, err := s.change(q, id, "endpoint.rotate_secret", func(tx pgx.Tx) error {
		var err error
		secret, err = endpoints.RotateSecret(q.ctx, tx, s.cfg.Cipher, id, deref(in.Secret), grace)
		return err
	})
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, endpointWithSecret{endpointView: viewOf(after), Secret: secret})
	return nil
}

func (s *Server) disableEndpoint(q *request) error {
	id := q.r.PathValue("id")
	var in struct {
		Reason string `json:"reason"`
	}
	if q.r.ContentLength != 0 {
		if err := q.decode(&in); err != nil {
			return err
		}
	}
	after, err := s.change(q, id, "endpoint.disable", func(tx pgx.Tx) error {
		return endpoints.Disable(q.ctx, tx, id, in.Reason)
	})
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, viewOf(after))
	return nil
}

func (s *Server) enableEndpoint(q *request) error {
	id := q.r.PathValue("id")
	after, err := s.change(q, id, "endpoint.enable", func(tx pgx.Tx) error {
		return endpoints.Enable(q.ctx, tx, id)
	})
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, viewOf(after))
	return nil
}

// testEvent is the answer to "send a test event": the delivery to poll.
type testEvent struct {
	DeliveryID string `json:"delivery_id"`
	EventType  string `json:"event_type"`
	EndpointID string `json:"endpoint_id"`
}

func (s *Server) sendTestEvent(q *request) error {
	id := q.r.PathValue("id")
	var out testEvent
	err := s.withEndpoint(q, id, func(tx pgx.Tx, e endpoints.Endpoint) error {
		if !e.Enabled {
			return errConflict("endpoint %s is disabled; enable it before sending it a test event", id)
		}
		payload, _ := json.Marshal(map[string]any{"test": true, "endpoint_id": e.ID,
			"message": "a test event sent from fluxhook's management API"})
		// Addressed to this endpoint alone (endpoint_id, routed_at): routing does not fan it
		// out, and the dispatcher sends it whatever the endpoint's filter.
		if err := tx.QueryRow(q.ctx, `INSERT INTO webhook_outbox (event_type, payload, tenant, endpoint_id, routed_at)
			VALUES ($1, $2::jsonb, $3, $4::uuid, now()) RETURNING delivery_id::text`,
			endpoints.TestEventType, string(payload), tenantOf(e), e.ID).Scan(&out.DeliveryID); err != nil {
			return err
		}
		// A signed request sent on the caller's demand is recorded as a change is: who made the
		// endpoint's consumer receive what.
		return audit.Record(q.ctx, tx, audit.Change{Actor: q.actor(), Tenant: tenantOf(e), Action: "endpoint.test",
			ObjectType: "endpoint", ObjectID: e.ID, After: map[string]any{"delivery_id": out.DeliveryID, "event_type": endpoints.TestEventType}})
	})
	if err != nil {
		return err
	}
	out.EventType, out.EndpointID = endpoints.TestEventType, id
	q.w.Header().Set("Location", "/v1/deliveries/"+out.DeliveryID)
	writeJSON(q.w, http.StatusAccepted, out)
	return nil
}

// health is an endpoint's delivery health: its lifecycle, its circuit, and the last day's
// outcomes by hour.
type health struct {
	EndpointID    string       `json:"endpoint_id"`
	Enabled       bool         `json:"enabled"`
	LastSuccessAt *time.Time   `json:"last_success_at"`
	FailingSince  *time.Time   `json:"failing_since"`
	Breaker       breakerState `json:"breaker"`
	Hours         []hourCount  `json:"hours"`
}

type breakerState struct {
	// State is closed, open, half_open, or unknown without a shared Redis gate.
	State    string `json:"state"`
	Failures int    `json:"consecutive_failures"`
}

type hourCount struct {
	Hour      time.Time `json:"hour"`
	Succeeded int64     `json:"succeeded"`
	Failed    int64     `json:"failed"`
}

// hoursSQL counts an endpoint's settled attempts per hour over the last 24 hours (25 buckets:
// the current, partial hour and the 24 before it), zeros included so that a chart needs no
// gap filling. The log's block-range index on processed_at limits the scan to the last day.
// $2 is the caller's scope: an endpoint moved between tenants keeps its log rows, and its new
// tenant must not count (read) its old tenant's deliveries, as every other read of the log.
const hoursSQL = `SELECT h.hour,
       count(l.*) FILTER (WHERE l.status_code BETWEEN 200 AND 299 OR (l.status_code = 409 AND l.error IS NULL)),
       count(l.*) FILTER (WHERE NOT (l.status_code BETWEEN 200 AND 299) OR l.status_code IS NULL)
FROM generate_series(date_trunc('hour', now()) - interval '24 hours', date_trunc('hour', now()), interval '1 hour') AS h(hour)
LEFT JOIN webhook_delivery_log l
       ON l.endpoint_id = $1::uuid AND ($2::text IS NULL OR l.tenant = $2) AND l.processed_at >= h.hour AND l.processed_at < h.hour + interval '1 hour'
      AND l.processed_at >= date_trunc('hour', now()) - interval '24 hours' AND l.attempt > 0
GROUP BY h.hour ORDER BY h.hour`

func (s *Server) endpointHealth(q *request) error {
	id := q.r.PathValue("id")
	var out health
	err := s.withEndpoint(q, id, func(tx pgx.Tx, e endpoints.Endpoint) error {
		out = health{EndpointID: e.ID, Enabled: e.Enabled, LastSuccessAt: timePtr(e.LastSuccessAt), FailingSince: timePtr(e.FailingSince),
			Breaker: breakerState{State: "unknown"}}
		rows, _ := tx.Query(q.ctx, hoursSQL, e.ID, q.scope())
		var err error
		out.Hours, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (hourCount, error) {
			var h hourCount
			return h, r.Scan(&h.Hour, &h.Succeeded, &h.Failed)
		})
		return err
	})
	if err != nil {
		return err
	}
	if s.cfg.Breakers != nil {
		// A managed endpoint's breaker is keyed by "ep:<id>" (send.ManagedEndpoint).
		sum := sha256.Sum256([]byte("ep:" + out.EndpointID))
		snaps, err := s.cfg.Breakers.Inspect(q.ctx, []string{hex.EncodeToString(sum[:])})
		if err != nil {
			return fmt.Errorf("reading the breaker of endpoint %s: %w", out.EndpointID, err)
		}
		if len(snaps) == 1 {
			out.Breaker = breakerState{State: string(snaps[0].State), Failures: snaps[0].Failures}
		}
	}
	writeJSON(q.w, http.StatusOK, out)
	return nil
}
