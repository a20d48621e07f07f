package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/api"
	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/portal"
	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

var (
	docOnce   sync.Once
	docRouter routers.Router
	docErr    error
)

// contract loads openapi.json once, validated, and a router over it: every call the tests make
// is checked against it, request and response.
func contract(t testing.TB) routers.Router {
	t.Helper()
	docOnce.Do(func() {
		loader := openapi3.NewLoader()
		doc, err := loader.LoadFromData(api.OpenAPI())
		if err != nil {
			docErr = fmt.Errorf("openapi.json does not load: %w", err)
			return
		}
		if err := doc.Validate(loader.Context); err != nil {
			docErr = fmt.Errorf("openapi.json is not a valid OpenAPI document: %w", err)
			return
		}
		doc.Servers = nil // match any host: the test server's port changes
		docRouter, docErr = legacy.NewRouter(doc)
	})
	if docErr != nil {
		t.Fatal(docErr)
	}
	return docRouter
}

// fakeResolver answers host names from a table, without DNS: tests never send traffic beyond
// loopback, and a name can "resolve" to a private address to test the refusal.
type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("lookup %s: no such host", host)
}

// defaultURL is the WEBHOOK_URL the tests' API knows, with a token in its query that no answer
// may show.
const defaultURL = "https://default.example.com/hooks?token=operator-secret"

// harness is one API over its own database.
type harness struct {
	t     testing.TB
	db    *sqltest.DB
	srv   *httptest.Server
	api   *api.Server
	admin string
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	db := sqltest.NewMigrated(t)
	c, err := endpoints.NewCipher("", "")
	if err != nil {
		t.Fatal(err)
	}
	// The API runs as a role with exactly the grants docs/install.md gives it, so that every
	// test also tests the page; fixtures are written with db.Pool, as the schema owner.
	a := api.New(api.Config{Pool: sqltest.ConnectAs(t, db, documentedAPIRole(t, db)), Cipher: c, Portal: portal.Handler(portal.Options{}), DefaultURL: defaultURL, Resolver: fakeResolver{
		"hooks.example.com": {netip.MustParseAddr("93.184.215.14")},
		"internal.example":  {netip.MustParseAddr("10.0.0.5")},
	}})
	srv := httptest.NewServer(a)
	t.Cleanup(a.Close) // after the server closes: cleanups run last first
	t.Cleanup(srv.Close)
	h := &harness{t: t, db: db, srv: srv, api: a}
	h.admin = h.key(nil)
	return h
}

// key makes an API key through the store (the CLI's way), for tenant or, nil, admin.
func (h *harness) key(tenant *string) string {
	h.t.Helper()
	_, token, err := apikeys.Add(context.Background(), h.db.Pool, apikeys.New{Tenant: tenant, CreatedBy: "cli:test"})
	if err != nil {
		h.t.Fatal(err)
	}
	return token
}

func ptr[T any](v T) *T { return &v }

// response is one answer, decoded.
type response struct {
	Status int
	Body   map[string]any
	Raw    []byte
	Header http.Header
}

// call makes one request with key, validating the request and the response against the
// OpenAPI document: a route, field or status the document does not describe fails the test.
func (h *harness) call(key, method, path string, body any) response {
	h.t.Helper()
	var rd io.Reader
	var raw []byte
	if body != nil {
		var err error
		if s, ok := body.(string); ok {
			raw = []byte(s)
		} else if raw, err = json.Marshal(body); err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	route, params, err := contract(h.t).FindRoute(req)
	if err != nil {
		h.t.Fatalf("%s %s is not in openapi.json: %v", method, path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	// A request the test sends on purpose out of the contract (a bad body, an unknown field)
	// is still sent: the server must answer it within the contract.
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	if body != nil {
		req.Body = io.NopCloser(bytes.NewReader(raw))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	if reqErr != nil && resp.StatusCode < 400 {
		h.t.Fatalf("%s %s: the request breaks openapi.json (%v) yet was answered %d", method, path, reqErr, resp.StatusCode)
	}
	rv := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	rv.SetBodyBytes(out)
	if err := openapi3filter.ValidateResponse(context.Background(), rv); err != nil {
		h.t.Fatalf("%s %s: the %d response breaks openapi.json: %v\nbody: %s", method, path, resp.StatusCode, err, out)
	}
	r := response{Status: resp.StatusCode, Raw: out, Header: resp.Header}
	if len(out) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		_ = json.Unmarshal(out, &r.Body)
	}
	return r
}

// raw makes one request without the contract's checks, for a request no client built from the
// contract would send (a NUL byte, invalid UTF-8), returning the status and body: the answer
// is checked by the test itself.
func (h *harness) raw(key, method, path, body string) (int, string) {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// must is call that fails the test unless the status is want.
func (h *harness) must(want int, key, method, path string, body any) response {
	h.t.Helper()
	r := h.call(key, method, path, body)
	if r.Status != want {
		h.t.Fatalf("%s %s = %d; want %d\nbody: %s", method, path, r.Status, want, r.Raw)
	}
	return r
}

// errorCode is the error's code and field of an error answer.
func (r response) errorCode() (code, field string) {
	e, _ := r.Body["error"].(map[string]any)
	code, _ = e["code"].(string)
	field, _ = e["field"].(string)
	return code, field
}

// documentedAPIRole creates a role with the grants of docs/install.md's block for the
// management API (the first sql block after "**The management API**"), each "TO fluxhook_api".
func documentedAPIRole(t testing.TB, db *sqltest.DB) string {
	t.Helper()
	md, err := os.ReadFile("../../../../docs/install.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(md), "**The management API**")
	_, rest, ok2 := strings.Cut(rest, "```sql\n")
	block, _, ok3 := strings.Cut(rest, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/install.md has no sql block after **The management API**")
	}
	role := sqltest.NewRole(t, db)
	n := 0
	for _, stmt := range strings.Split(block, ";") {
		stmt = strings.Join(strings.Fields(stmt), " ")
		if stmt == "" {
			continue
		}
		if !strings.HasPrefix(stmt, "GRANT ") || !strings.HasSuffix(stmt, " TO fluxhook_api") {
			t.Fatalf("docs/install.md's API block holds %q; want only GRANT ... TO fluxhook_api", stmt)
		}
		if _, err := db.Pool.Exec(context.Background(), strings.TrimSuffix(stmt, "fluxhook_api")+role); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
		n++
	}
	if n < 4 {
		t.Fatalf("docs/install.md's API block has %d grants", n)
	}
	return role
}
