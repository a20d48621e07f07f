package api

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/deadletters"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/stages/send"
)

//go:embed openapi.json
var openAPIDocument []byte

// OpenAPI returns the API's OpenAPI 3.1 document, the contract its tests hold the code to.
func OpenAPI() []byte { return openAPIDocument }

// Config is what the API needs.
type Config struct {
	// Pool is the database the API reads and writes.
	Pool *pgxpool.Pool
	// Cipher seals and opens endpoint secrets (WEBHOOK_ENCRYPTION_KEY); a Cipher without a
	// key stores them in clear, as the CLI does.
	Cipher *endpoints.Cipher
	// Logger receives one line per request and every internal error.
	Logger *zap.Logger
	// AllowedNetworks is WEBHOOK_ALLOWED_NETWORKS as the dispatchers have it: an endpoint URL
	// an admin key writes is refused when it leads only outside it.
	AllowedNetworks []netip.Prefix
	// RowURLNetworks is WEBHOOK_ROW_URL_NETWORKS as the dispatchers have it: an endpoint URL a
	// tenant (a tenant key, a portal session) writes may lead only to public addresses and
	// these, as a producer's endpoint_url, since the dispatchers dial it so (a restricted
	// endpoint) and the API shows the tenant what came back.
	RowURLNetworks []netip.Prefix
	// Resolver looks endpoint host names up when they are created, to refuse a name whose
	// every address the dispatcher would refuse; nil is the system's resolver.
	Resolver send.Resolver
	// RedisURL is the shared gate's Redis (REDIS_URL), for the breakers in GET /v1/status;
	// empty when the gate is in-process.
	RedisURL string
	// Breakers reads circuit state for an endpoint's health (the Redis gate's store); nil
	// when the gate is in-process, and health says "unknown".
	Breakers Breakers
	// Portal serves the portal's page under /portal/ (package portal); nil serves none.
	Portal http.Handler
	// PortalSessionTTL is how long a portal link works unless its request says otherwise
	// (default DefaultPortalSessionTTL).
	PortalSessionTTL time.Duration
	// PublicURL is the base URL users reach this server at, for portal links (default: the
	// request's host, over http unless the request came over TLS).
	PublicURL string
	// DefaultURL is the dispatchers' WEBHOOK_URL, when known, so that deliveries to it show
	// its origin; empty (fluxhook api alone) shows them without one.
	DefaultURL string
	// Now is the clock, for tests; nil is time.Now.
	Now func() time.Time
	// JanitorInterval is how often RunJanitor's work runs (default DefaultJanitorInterval).
	JanitorInterval time.Duration
}

// DefaultJanitorInterval is how often the janitor deletes expired portal sessions: a session
// lives a day at most, so an expired one waits at most this long, refused all along.
const DefaultJanitorInterval = 10 * time.Minute

// Server serves the API.
type Server struct {
	cfg    Config
	mux    *http.ServeMux
	routes []Route

	// jobs run the recoveries the API starts, past the request that started them, until
	// Close cancels them (a cancelled recovery stays resumable).
	jobs       sync.WaitGroup
	jobsCtx    context.Context
	cancelJobs context.CancelFunc
}

// Route is one operation of the API, as registered: the method and pattern net/http routes
// by, and whether it needs an admin key. Routes lists them so that a test can walk every one.
type Route struct {
	Method  string
	Pattern string
	// Admin routes need an admin key; AdminOrPortal ones also take an operator's portal
	// session (every tenant, never a tenant's).
	Admin         bool
	AdminOrPortal bool
	handle        func(*request) error
}

// maxBody bounds a request's body: the largest is an endpoint with its headers.
const maxBody = 1 << 20

// New returns the API's handler.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Resolver == nil {
		cfg.Resolver = defaultResolver{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux()}
	s.jobsCtx, s.cancelJobs = context.WithCancel(context.Background())
	s.mux.HandleFunc("GET /v1/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openAPIDocument)
	})
	if cfg.Portal != nil {
		s.mux.Handle("GET /portal/", cfg.Portal)
		s.mux.Handle("GET /portal", http.RedirectHandler("/portal/", http.StatusMovedPermanently))
	}
	for _, rt := range s.table() {
		s.routes = append(s.routes, rt)
		s.mux.Handle(rt.Method+" "+rt.Pattern, s.wrap(rt))
	}
	// Anything else under /v1 is a JSON 404 (or 405), not net/http's text page.
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, errorBody{&apiError{Code: "not_found",
			Message: fmt.Sprintf("no route %s %s; GET /v1/openapi.json lists the routes", r.Method, r.URL.Path)}})
	})
	return s
}

// background runs fn in a goroutine that Close cancels and waits for.
func (s *Server) background(fn func(ctx context.Context)) {
	s.jobs.Add(1)
	go func() {
		defer s.jobs.Done()
		fn(s.jobsCtx)
	}()
}

// ResumeRecoveries takes over, in the background, the recoveries a process that died left
// running: call it once the server serves. Several API processes may: each job is taken by one.
func (s *Server) ResumeRecoveries() {
	s.background(func(ctx context.Context) {
		done, err := deadletters.ResumeStale(ctx, s.cfg.Pool, recoveryStaleAfter)
		for _, r := range done {
			s.cfg.Logger.Info("resumed recovery", zap.String("recovery_id", r.ID), zap.String("state", r.State))
		}
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("resuming recoveries failed", zap.Error(err))
		}
	})
}

// RunJanitor deletes, in the background until Close, the portal sessions that have expired:
// at once, then every JanitorInterval. Every API process runs it (serve with API_ADDR, api):
// portal sessions exist only where the API is served, and a delete another process made first
// deletes nothing.
func (s *Server) RunJanitor() {
	interval := s.cfg.JanitorInterval
	if interval <= 0 {
		interval = DefaultJanitorInterval
	}
	s.background(func(ctx context.Context) {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.deleteExpiredSessions(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

// deleteExpiredSessions is one run of the janitor; a failure is logged and retried on the next.
func (s *Server) deleteExpiredSessions(ctx context.Context) {
	n, err := apikeys.DeleteExpiredSessions(ctx, s.cfg.Pool, 1000)
	var pgErr *pgconn.PgError
	switch {
	case err != nil && ctx.Err() != nil:
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		s.cfg.Logger.Warn("deleting expired portal sessions failed: the API's role may not delete them; grant it DELETE on webhook_api_keys (docs/install.md)",
			zap.Error(err))
	case err != nil:
		s.cfg.Logger.Warn("deleting expired portal sessions failed", zap.Error(err))
	case n > 0:
		s.cfg.Logger.Info("deleted expired portal sessions", zap.Int64("sessions", n))
	}
}

// Close stops the recoveries running in the background (they stay resumable) and the janitor,
// and waits for them; the HTTP server is the caller's to shut down first.
func (s *Server) Close() {
	s.cancelJobs()
	s.jobs.Wait()
}

// Routes lists the API's operations.
func (s *Server) Routes() []Route { return append([]Route(nil), s.routes...) }

// ServeHTTP serves one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// request is one call being served: the key that made it and helpers to read it.
type request struct {
	ctx context.Context
	w   http.ResponseWriter
	r   *http.Request
	key apikeys.Key
	s   *Server
}

// scope is the tenant the caller is limited to: nil for an admin key.
func (q *request) scope() *string { return q.key.Tenant }

// actor is how the audit trail names the caller.
func (q *request) actor() string { return q.key.Actor() }

// vouches reports whether the caller speaks for the operator: an admin key, not a portal
// session (a link in a browser, even an operator's). Only such a caller may give an endpoint a
// URL the operator's network policy judges; anyone else's URL makes the endpoint restricted.
func (q *request) vouches() bool { return q.key.Admin() && !q.key.Portal }

// wrap authenticates, bounds the body, and turns a handler's error into the API's JSON error.
func (s *Server) wrap(rt Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		reqID := newRequestID()
		w.Header().Set("X-Request-Id", reqID)
		q := &request{ctx: r.Context(), w: w, r: r, s: s}
		err := s.authenticate(q)
		if err == nil && rt.Admin && (!q.key.Admin() || q.key.Portal) {
			// A portal session, even an operator's, never manages keys or makes sessions: a
			// link left in a browser must not mint credentials that outlive it.
			err = errAdminOnly
		}
		if err == nil && rt.AdminOrPortal && !q.key.Admin() {
			err = errAdminOnly
		}
		if err == nil {
			err = checkParams(r, rt.Pattern)
		}
		if err == nil {
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
			err = rt.handle(q)
		}
		status := http.StatusOK
		if err != nil {
			ae, expected := asAPIError(err)
			if !expected {
				s.cfg.Logger.Error("api request failed", zap.String("request_id", reqID), zap.String("method", r.Method),
					zap.String("route", rt.Pattern), zap.Error(err))
			}
			status = ae.Status
			writeJSON(w, ae.Status, errorBody{ae})
		}
		s.cfg.Logger.Debug("api request", zap.String("request_id", reqID), zap.String("method", r.Method),
			zap.String("route", rt.Pattern), zap.Int("status", status), zap.String("key_id", q.key.ID),
			zap.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
	})
}

// checkParams refuses a request whose path values or query parameters hold what no parameter
// of the API takes and PostgreSQL cannot store or compare (a NUL byte, invalid UTF-8) or a
// control character: one check here for every route, answered 422 naming the parameter, so
// that no handler passes such text to a statement, which would fail it with a 500.
func checkParams(r *http.Request, pattern string) error {
	for rest := pattern; ; {
		_, after, ok := strings.Cut(rest, "{")
		if !ok {
			break
		}
		name, tail, _ := strings.Cut(after, "}")
		name = strings.TrimSuffix(name, "...")
		if !printableText(r.PathValue(name)) {
			return errInvalid(name, "%s: not printable UTF-8 text (it holds a control character, a NUL byte or invalid UTF-8)", name)
		}
		rest = tail
	}
	for name, values := range r.URL.Query() {
		for _, v := range values {
			if !printableText(v) || !printableText(name) {
				name := strings.ToValidUTF8(name, "?")
				return errInvalid(name, "%q: not printable UTF-8 text (it holds a control character, a NUL byte or invalid UTF-8)", name)
			}
		}
	}
	return nil
}

// printableText says whether s is valid UTF-8 without a control character.
func printableText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f })
}

func (s *Server) authenticate(q *request) error {
	token, ok := strings.CutPrefix(q.r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return errUnauthorized
	}
	k, err := apikeys.Authenticate(q.ctx, s.cfg.Pool, strings.TrimSpace(token))
	if errors.Is(err, apikeys.ErrInvalid) {
		return errUnauthorized
	}
	if err != nil {
		return err
	}
	q.key = k
	return nil
}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// decode reads the JSON body into v, refusing unknown fields (a typo'd field would otherwise
// be silently ignored) with the field named.
func (q *request) decode(v any) error {
	dec := json.NewDecoder(q.r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var ute *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &mbe):
			return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "too_large",
				Message: fmt.Sprintf("the request body is over %d bytes", maxBody)}
		case errors.As(err, &ute):
			return errInvalid(ute.Field, "%s: must be %s, not %s", ute.Field, jsonKind(ute.Type.Kind().String()), ute.Value)
		case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
			return errBadRequest("the body is not a JSON object: %v", err)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return errInvalid(field, "%s: no such field (GET /v1/openapi.json describes the body)", field)
		}
		return errBadRequest("reading the body: %v", err)
	}
	if dec.More() {
		return errBadRequest("the body holds more than one JSON value")
	}
	if field := nulField(reflect.ValueOf(v), ""); field != "" {
		return errInvalid(field, "%s: holds a NUL character (\\u0000), which no field takes", field)
	}
	return nil
}

// nulField is the JSON name of the first field of the decoded body v holding a string with a
// NUL character, or "": JSON can carry one (\u0000), PostgreSQL's text cannot, and every
// field of every body is stored or compared as text. (Invalid UTF-8 never gets this far: the
// decoder replaces it.) field is the name of the field v is.
func nulField(v reflect.Value, field string) string {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return nulField(v.Elem(), field)
		}
	case reflect.String:
		if strings.ContainsRune(v.String(), 0) {
			return cmp.Or(field, "body")
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if f := nulField(v.Index(i), field); f != "" {
				return f
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if f := cmp.Or(nulField(it.Key(), field), nulField(it.Value(), field)); f != "" {
				return f
			}
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			sf := t.Field(i)
			if !sf.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
			switch {
			case name == "-":
				continue
			case sf.Anonymous && name == "":
				name = field
			case name == "":
				// A wrapper's own fields (nullable's Value) go by the field it is.
				name = cmp.Or(field, sf.Name)
			}
			if f := nulField(v.Field(i), name); f != "" {
				return f
			}
		}
	}
	return ""
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "int", "int32", "int64":
		return "an integer"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	case "map", "struct", "ptr":
		return "an object"
	}
	return goKind
}

// page is a list response: the items and the cursor of the next page, null on the last.
type page[T any] struct {
	Data       []T     `json:"data"`
	NextCursor *string `json:"next_cursor"`
}

// pageOf is one page of a list read with one row more than limit: the first limit rows shown
// through view, and, when there was one more, the cursor next gives for the last row shown.
func pageOf[T, V any](list []T, limit int, view func(T) V, next func(last T) *string) page[V] {
	n := min(len(list), limit)
	out := page[V]{Data: make([]V, 0, n)}
	for _, x := range list[:n] {
		out.Data = append(out.Data, view(x))
	}
	if len(list) > limit {
		out.NextCursor = next(list[limit-1])
	}
	return out
}

// asIs is pageOf's view for rows shown as they were read.
func asIs[T any](x T) T { return x }

// errBadCursor answers a cursor the API did not give.
var errBadCursor = errInvalid("cursor", "cursor: not one this API gave; pass next_cursor from the previous page as it is")

// limit reads ?limit (1 to 500, default 50).
func (q *request) limit() (int, error) {
	v := q.r.URL.Query().Get("limit")
	if v == "" {
		return 50, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 500 {
		return 0, errInvalid("limit", "limit: must be an integer from 1 to 500, not %q", v)
	}
	return n, nil
}

// cursor is an opaque position in a list: the sort key of the last item shown, which the next
// page continues after. Opaque (base64 of JSON) so that clients pass it back rather than
// build one.
func encodeCursor(v any) *string {
	b, _ := json.Marshal(v)
	s := base64.RawURLEncoding.EncodeToString(b)
	return &s
}

func (q *request) cursor(v any) (bool, error) {
	c := q.r.URL.Query().Get("cursor")
	if c == "" {
		return false, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		return false, errBadCursor
	}
	return true, nil
}

// timeParam reads an RFC 3339 time from the query (zero when absent).
func (q *request) timeParam(name string) (time.Time, error) {
	v := q.r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, errInvalid(name, "%s: must be an RFC 3339 time such as 2026-12-07T10:00:00Z, not %q", name, v)
	}
	return t, nil
}

// tenantParam reads ?tenant, a filter only an admin key may use: a tenant key is always
// limited to its own tenant, and naming another gets nothing (404 semantics, not 403).
func (q *request) tenantParam() *string {
	v, ok := q.r.URL.Query()["tenant"]
	if !ok || len(v) == 0 {
		return nil
	}
	return &v[0]
}

type defaultResolver struct{}

func (defaultResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	return netResolver.LookupNetIP(ctx, network, host)
}
