package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/api"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// apiCall makes one request to a running API and decodes its JSON answer.
func apiCall(t *testing.T, addr, key, method, path, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+addr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if len(raw) > 0 && json.Unmarshal(raw, &out) != nil {
		t.Fatalf("%s %s answered %d with a body that is not a JSON object: %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// addKey runs `fluxhook api-keys add --json` and returns the key.
func addKey(t *testing.T, db *sqltest.DB, args ...string) (id, key string) {
	t.Helper()
	r := runCLIEnv(t, map[string]string{"DATABASE_URL": db.URL}, append([]string{"api-keys", "add", "--json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("api-keys add exited %d: %s", r.code, r.stderr)
	}
	var k struct{ ID, Key string }
	if err := json.Unmarshal([]byte(r.stdout), &k); err != nil || k.Key == "" {
		t.Fatalf("api-keys add --json printed %q (%v)", r.stdout, err)
	}
	return k.ID, k.Key
}

// TestAPICommandTakesTheCLIsKeys: `fluxhook api` serves the API alone, with keys made by
// `fluxhook api-keys add`; a key revoked by the CLI is refused at once; both changes are in
// the audit trail under the CLI's user.
func TestAPICommandTakesTheCLIsKeys(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	adminID, admin := addKey(t, db, "--admin", "--description", "ops")
	_, acme := addKey(t, db, "--tenant", "acme")
	p := startCommand(t, fluxhookBinary(t), "api", map[string]string{"DATABASE_URL": db.URL, "API_ADDR": "127.0.0.1:0"}, "api")
	addr := p.logField(15*time.Second, "serving the management API", "addr")

	if code, _ := apiCall(t, addr, "", "GET", "/v1/endpoints", ""); code != http.StatusUnauthorized {
		t.Fatalf("no key: %d; want 401", code)
	}
	if code, body := apiCall(t, addr, acme, "GET", "/v1/endpoints", ""); code != http.StatusOK || body["data"] == nil {
		t.Fatalf("the tenant key: %d %v", code, body)
	}
	if code, _ := apiCall(t, addr, acme, "GET", "/v1/api-keys", ""); code != http.StatusForbidden {
		t.Fatalf("the tenant key listing keys: %d; want 403", code)
	}
	if code, _ := apiCall(t, addr, "", "GET", "/v1/openapi.json", ""); code != http.StatusOK {
		t.Fatalf("the OpenAPI document: %d", code)
	}
	list := runCLIEnv(t, map[string]string{"DATABASE_URL": db.URL}, "api-keys", "list")
	if list.code != 0 || !strings.Contains(list.stdout, adminID) || strings.Contains(list.stdout, admin) {
		t.Fatalf("api-keys list (%d) shows the key or misses it:\n%s", list.code, list.stdout)
	}
	if r := runCLIEnv(t, map[string]string{"DATABASE_URL": db.URL}, "api-keys", "revoke", adminID); r.code != 0 {
		t.Fatalf("api-keys revoke exited %d: %s", r.code, r.stderr)
	}
	if code, _ := apiCall(t, addr, admin, "GET", "/v1/endpoints", ""); code != http.StatusUnauthorized {
		t.Fatalf("a revoked key: %d; want 401", code)
	}
	if got := queryStrings(t, db, `SELECT action || ' ' || actor FROM webhook_audit ORDER BY id`); len(got) != 3 ||
		!strings.HasPrefix(got[2], "api_key.revoke cli") {
		t.Fatalf("audit trail = %v; want two creations and the revocation, by the CLI", got)
	}
	if r := runCLIEnv(t, map[string]string{"DATABASE_URL": db.URL}, "api-keys", "revoke", "nope"); r.code != 1 {
		t.Fatalf("revoking an unknown key exited %d; want 1", r.code)
	}
	if r := runCLIEnv(t, map[string]string{"DATABASE_URL": db.URL}, "api"); r.code != 2 || !strings.Contains(r.stderr, "API_ADDR") {
		t.Fatalf("api without API_ADDR exited %d: %s", r.code, r.stderr)
	}
}

// TestServeWithAPIAddrSendsATestEvent: serve with API_ADDR serves the API beside the
// dispatcher; an endpoint created through it receives the signed webhook.test event that
// POST /v1/endpoints/{id}/test sends, whatever the endpoint's filter.
func TestServeWithAPIAddrSendsATestEvent(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	consumer := newHookConsumer(t, nil)
	_, admin := addKey(t, db, "--admin")
	env := serveEnv(db.URL, "")
	delete(env, "WEBHOOK_URL")
	delete(env, "WEBHOOK_SECRET")
	env["API_ADDR"] = "127.0.0.1:0"
	p := startServe(t, "serve", env)
	addr := p.logField(15*time.Second, "serving the management API", "addr")

	code, ep := apiCall(t, addr, admin, "POST", "/v1/endpoints",
		`{"url": "`+consumer.URL()+`", "secret": "`+serveSecret+`", "event_types": ["order.*"]}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %v", code, ep)
	}
	code, test := apiCall(t, addr, admin, "POST", "/v1/endpoints/"+ep["id"].(string)+"/test", "")
	if code != http.StatusAccepted {
		t.Fatalf("test event: %d %v", code, test)
	}
	p.waitFor(30*time.Second, "the test event to arrive", func() bool {
		for _, r := range consumer.requests() {
			if r.DeliveryID == test["delivery_id"] && r.Event == "webhook.test" && r.VerifyErr == nil {
				return true
			}
		}
		return false
	})
}

// TestCLIEndpointChangesAreAudited: the CLI's endpoint changes reach the same audit trail as
// the API's, under the operating-system user, never with a secret or a header value.
func TestCLIEndpointChangesAreAudited(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	env := map[string]string{"DATABASE_URL": db.URL}
	add := runCLIEnv(t, env, "endpoints", "add", "--url", "https://a.example/hooks", "--tenant", "acme",
		"--header", "X-Token=tok-secret-1", "--json")
	if add.code != 0 {
		t.Fatalf("endpoints add: %d %s", add.code, add.stderr)
	}
	var ep struct{ ID, Secret string }
	if err := json.Unmarshal([]byte(add.stdout), &ep); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"endpoints", "update", ep.ID, "--description", "orders"},
		{"endpoints", "rotate-secret", ep.ID, "--grace", "0"},
		{"endpoints", "disable", ep.ID},
		{"endpoints", "enable", ep.ID},
		{"endpoints", "remove", ep.ID},
	} {
		if r := runCLIEnv(t, env, args...); r.code != 0 {
			t.Fatalf("%v: %d %s", args, r.code, r.stderr)
		}
	}
	got := queryStrings(t, db, `SELECT action || ' ' || coalesce(tenant, '-') || ' ' || (actor LIKE 'cli%')::text FROM webhook_audit ORDER BY id`)
	want := []string{"endpoint.create acme true", "endpoint.update acme true", "endpoint.rotate_secret acme true",
		"endpoint.disable acme true", "endpoint.enable acme true", "endpoint.delete acme true"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("audit trail = %q; want %q", got, want)
	}
	leaks := queryInt(t, db, `SELECT count(*) FROM webhook_audit WHERE coalesce(before::text, '') || coalesce(after::text, '') LIKE '%' || $1 || '%'
		OR coalesce(before::text, '') || coalesce(after::text, '') LIKE '%tok-secret-1%'`, ep.Secret)
	if leaks != 0 {
		t.Fatalf("%d audit entries hold the secret or a header value", leaks)
	}
}

// docResolver resolves the host names docs/api.md's examples use, without DNS.
type docResolver struct{}

func (docResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host == "hooks.example.com" {
		return []netip.Addr{netip.MustParseAddr("93.184.215.14")}, nil
	}
	return nil, fmt.Errorf("lookup %s: no such host", host)
}

// statusRecorder keeps the statuses a handler answered, for TestAPIDocExamplesRun.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) { r.status = code; r.ResponseWriter.WriteHeader(code) }

// TestAPIDocExamplesRun runs every shell example of docs/api.md, in order, in one bash (with
// the fluxhook binary on PATH, curl and jq), against an API on a test database: each request
// must succeed but the one the page shows failing (422, a private address), so the page's
// examples cannot rot.
func TestAPIDocExamplesRun(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: .ci/services installs it", tool)
		}
	}
	db := sqltest.NewMigrated(t)
	cipher, _ := endpoints.NewCipher("", "")
	a := api.New(api.Config{Pool: db.Pool, Cipher: cipher, Resolver: docResolver{}})
	t.Cleanup(a.Close)
	var mu sync.Mutex
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: 200}
		a.ServeHTTP(rec, r)
		mu.Lock()
		calls = append(calls, fmt.Sprintf("%d %s %s", rec.status, r.Method, r.URL.Path))
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)

	md := readDoc(t, repoRoot(t), "docs/api.md")
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	for _, block := range strings.Split(md, "```sh\n")[1:] {
		code, _, _ := strings.Cut(block, "```")
		script.WriteString(code)
	}
	src := strings.Replace(script.String(), "export FLUXHOOK_API=http://127.0.0.1:8080", "export FLUXHOOK_API="+srv.URL, 1)
	if src == script.String() {
		t.Fatal("docs/api.md no longer sets FLUXHOOK_API=http://127.0.0.1:8080: update this test")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fluxhookBinary(t), filepath.Join(bin, "fluxhook")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", src)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + dir, "DATABASE_URL=" + db.URL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docs/api.md's examples failed: %v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	failed := 0
	for _, c := range calls {
		if !strings.HasPrefix(c, "2") {
			failed++
			if c != "422 POST /v1/endpoints" {
				t.Errorf("an example's request answered %s\n%s", c, out)
			}
		}
	}
	t.Logf("calls:\n%s", strings.Join(calls, "\n"))
	if failed != 1 || len(calls) < 10 {
		t.Fatalf("%d requests, %d failed; want every example to run and only the refused URL to fail:\n%s\n%s", len(calls), failed, strings.Join(calls, "\n"), out)
	}
}

// TestPortalFrameAncestorsAreOrigins: PORTAL_FRAME_ANCESTORS takes origins only, since each is
// joined into the portal's Content-Security-Policy: nothing that ends the directive (a ';'),
// widens it to every site, or is not an origin.
func TestPortalFrameAncestorsAreOrigins(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:5432/db"}
	for _, s := range settings {
		if _, ok := base[s.env]; !ok && s.def != "" {
			base[s.env] = s.def
		}
	}
	for _, ok := range []string{"https://app.example.com", "https://app.example.com:8443 http://localhost:3000", "'self'", "https://a.example/"} {
		v := maps.Clone(base)
		v["PORTAL_FRAME_ANCESTORS"] = ok
		if _, err := parseServeConfig(v); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"https://a.com;upgrade-insecure-requests", "https://*", "*", "http://a.com?x", "javascript:x", "https://a.com/path"} {
		v := maps.Clone(base)
		v["PORTAL_FRAME_ANCESTORS"] = bad
		if _, err := parseServeConfig(v); err == nil || !strings.Contains(err.Error(), "PORTAL_FRAME_ANCESTORS") {
			t.Errorf("%q accepted (%v)", bad, err)
		}
	}
}
