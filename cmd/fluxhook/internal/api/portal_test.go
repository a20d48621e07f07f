package api_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/api"
)

// TestPortalSessionsActAsTheirTenantUntilTheyExpire: an admin key makes a portal link for a
// tenant; the link's token sees that tenant's objects only, cannot manage keys or make more
// links, and stops working when it expires.
func TestPortalSessionsActAsTheirTenantUntilTheyExpire(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	acme, globex := h.key(ptr("acme")), h.key(ptr("globex"))
	h.must(http.StatusCreated, acme, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/acme"})
	other := h.must(http.StatusCreated, globex, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/globex"}).Body["id"].(string)

	h.must(http.StatusForbidden, acme, "POST", "/v1/tenants/acme/portal-sessions", nil)
	s := h.must(http.StatusCreated, h.admin, "POST", "/v1/tenants/acme/portal-sessions", map[string]any{"ttl_seconds": 600})
	link := s.Body["url"].(string)
	_, token, ok := strings.Cut(link, "/portal/#session=")
	if !ok || !strings.HasPrefix(link, h.srv.URL) || !strings.HasPrefix(token, "fhp_") || s.Body["tenant"] != "acme" {
		t.Fatalf("session = %s; want a link to this server's portal with the token in its fragment", s.Raw)
	}
	list := h.must(http.StatusOK, token, "GET", "/v1/endpoints", nil)
	if n := len(list.Body["data"].([]any)); n != 1 || strings.Contains(string(list.Raw), other) {
		t.Fatalf("the acme session lists %d endpoints: %s", n, list.Raw)
	}
	h.must(http.StatusNotFound, token, "GET", "/v1/endpoints/"+other, nil)
	h.must(http.StatusForbidden, token, "GET", "/v1/api-keys", nil)
	h.must(http.StatusForbidden, token, "POST", "/v1/tenants/acme/portal-sessions", nil)
	made := h.must(http.StatusCreated, token, "POST", "/v1/endpoints", map[string]any{"url": "https://hooks.example.com/portal"})
	trail := h.must(http.StatusOK, acme, "GET", "/v1/audit?object_id="+made.Body["id"].(string), nil)
	if !strings.Contains(string(trail.Raw), `"actor":"portal:`+s.Body["id"].(string)+`"`) {
		t.Fatalf("a change made in the portal is not recorded under the session: %s", trail.Raw)
	}

	op := h.must(http.StatusCreated, h.admin, "POST", "/v1/portal-sessions", nil)
	if op.Body["tenant"] != nil {
		t.Fatalf("an operator's session has a tenant: %s", op.Raw)
	}
	_, opToken, _ := strings.Cut(op.Body["url"].(string), "#session=")
	if all := h.must(http.StatusOK, opToken, "GET", "/v1/endpoints", nil); len(all.Body["data"].([]any)) != 3 {
		t.Fatalf("the operator's session does not see every tenant: %s", all.Raw)
	}
	h.must(http.StatusForbidden, opToken, "POST", "/v1/api-keys", map[string]any{})
	if st := h.must(http.StatusOK, opToken, "GET", "/v1/status", nil); st.Body["backlog"] == nil || st.Body["schema_version"] == nil {
		t.Fatalf("the operator's status overview = %s", st.Raw)
	}
	if ts := h.must(http.StatusOK, opToken, "GET", "/v1/tenants", nil); len(ts.Body["data"].([]any)) != 2 {
		t.Fatalf("the operator's tenant selector = %s; want acme and globex", ts.Raw)
	}
	h.must(http.StatusForbidden, token, "GET", "/v1/status", nil)
	h.must(http.StatusForbidden, token, "GET", "/v1/tenants", nil)
	if me := h.must(http.StatusOK, token, "GET", "/v1/me", nil); me.Body["tenant"] != "acme" || me.Body["portal"] != true || me.Body["admin"] != false {
		t.Fatalf("/v1/me for the acme session = %s", me.Raw)
	}

	h.must(http.StatusUnprocessableEntity, h.admin, "POST", "/v1/tenants/acme/portal-sessions", map[string]any{"ttl_seconds": 10})
	if _, err := h.db.Pool.Exec(context.Background(), `UPDATE webhook_api_keys SET expires_at = now() WHERE kind = 'portal'`); err != nil {
		t.Fatal(err)
	}
	h.must(http.StatusUnauthorized, token, "GET", "/v1/endpoints", nil)
}

// TestPortalSessionsCanBeRevoked: a portal link is a bearer credential in a browser's history
// for up to 24 hours (an operator's sees every tenant). An admin key lists the links that have
// not expired and ends one before it does; revoking the admin key that made links ends them
// too, and only them; each revocation is in the audit trail.
func TestPortalSessionsCanBeRevoked(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	minted := h.must(http.StatusCreated, h.admin, "POST", "/v1/api-keys", map[string]any{"tenant": nil, "description": "portal minter"})
	minter, minterID := minted.Body["key"].(string), minted.Body["id"].(string)
	session := func(key, path string) (id, token string) {
		s := h.must(http.StatusCreated, key, "POST", path, map[string]any{"ttl_seconds": 86400})
		_, token, _ = strings.Cut(s.Body["url"].(string), "#session=")
		return s.Body["id"].(string), token
	}
	opID, opToken := session(minter, "/v1/portal-sessions")
	acmeID, acmeToken := session(minter, "/v1/tenants/acme/portal-sessions")
	otherID, otherToken := session(h.admin, "/v1/tenants/acme/portal-sessions")

	list := h.must(http.StatusOK, h.admin, "GET", "/v1/portal-sessions", nil)
	for _, id := range []string{opID, acmeID, otherID} {
		if !strings.Contains(string(list.Raw), id) {
			t.Errorf("GET /v1/portal-sessions misses session %s: %s", id, list.Raw)
		}
	}
	if strings.Contains(string(list.Raw), opToken[len(opToken)-43:]) {
		t.Fatalf("the list shows a session's token: %s", list.Raw)
	}
	if acme := h.must(http.StatusOK, h.admin, "GET", "/v1/portal-sessions?tenant=acme", nil); len(acme.Body["data"].([]any)) != 2 || strings.Contains(string(acme.Raw), opID) {
		t.Errorf("?tenant=acme lists %s; want the two acme sessions", acme.Raw)
	}
	first := h.must(http.StatusOK, h.admin, "GET", "/v1/portal-sessions?limit=2", nil)
	next := h.must(http.StatusOK, h.admin, "GET", "/v1/portal-sessions?limit=2&cursor="+first.Body["next_cursor"].(string), nil)
	if len(first.Body["data"].([]any)) != 2 || len(next.Body["data"].([]any)) != 1 || next.Body["next_cursor"] != nil {
		t.Errorf("pages of 2: %s then %s", first.Raw, next.Raw)
	}

	h.must(http.StatusNotFound, h.admin, "DELETE", "/v1/api-keys/"+opID, nil)
	h.must(http.StatusNotFound, h.admin, "DELETE", "/v1/portal-sessions/"+minterID, nil)
	h.must(http.StatusNotFound, h.admin, "DELETE", "/v1/portal-sessions/nope", nil)
	h.must(http.StatusForbidden, opToken, "DELETE", "/v1/portal-sessions/"+opID, nil)
	if r := h.must(http.StatusOK, h.admin, "DELETE", "/v1/portal-sessions/"+opID, nil); r.Body["revoked_at"] == nil {
		t.Errorf("the revoked session = %s", r.Raw)
	}
	h.must(http.StatusUnauthorized, opToken, "GET", "/v1/status", nil)
	h.must(http.StatusOK, acmeToken, "GET", "/v1/me", nil)

	h.must(http.StatusOK, h.admin, "DELETE", "/v1/api-keys/"+minterID, nil)
	h.must(http.StatusUnauthorized, acmeToken, "GET", "/v1/me", nil)
	h.must(http.StatusOK, otherToken, "GET", "/v1/me", nil)

	trail := h.must(http.StatusOK, h.admin, "GET", "/v1/audit?object_type=portal_session", nil)
	var revoked []string
	for _, e := range trail.Body["data"].([]any) {
		if e := e.(map[string]any); e["action"] == "portal_session.revoke" {
			revoked = append(revoked, e["object_id"].(string))
		}
	}
	if len(revoked) != 2 || !slices.Contains(revoked, opID) || !slices.Contains(revoked, acmeID) {
		t.Errorf("portal_session.revoke entries for %v; want %s (revoked) and %s (its key revoked): %s", revoked, opID, acmeID, trail.Raw)
	}
}

// TestPortalPageHeaders: the portal's page is served with a policy that allows no inline
// script, no other origin, and no framing unless configured.
func TestPortalPageHeaders(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	resp, err := http.Get(h.srv.URL + "/portal/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"script-src 'self'", "frame-ancestors 'none'", "default-src 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-inline") || resp.Header.Get("X-Frame-Options") != "DENY" || resp.StatusCode != 200 {
		t.Errorf("portal page: %d, CSP %q, X-Frame-Options %q", resp.StatusCode, csp, resp.Header.Get("X-Frame-Options"))
	}
}

// TestJanitorDeletesExpiredPortalSessions: the API's janitor, run as serve and api run it,
// deletes the portal sessions that expired, at once and then on each later run, with the
// grants docs/install.md gives the API; a live session and the keys stay.
func TestJanitorDeletesExpiredPortalSessions(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.InfoLevel)
	h := newHarnessWith(t, func(c *api.Config) {
		c.JanitorInterval = 20 * time.Millisecond
		c.Logger = zap.New(core)
	})
	acme := h.key(ptr("acme"))
	session := func() (id, token string) {
		s := h.must(http.StatusCreated, h.admin, "POST", "/v1/tenants/acme/portal-sessions", map[string]any{"ttl_seconds": 600})
		_, token, _ = strings.Cut(s.Body["url"].(string), "#session=")
		return s.Body["id"].(string), token
	}
	old, _ := session()
	later, _ := session()
	_, liveToken := session()
	expire := func(id string) {
		t.Helper()
		if _, err := h.db.Pool.Exec(context.Background(), `UPDATE webhook_api_keys SET expires_at = now() - interval '1 second' WHERE id = $1::uuid`, id); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(id string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var n int
			if err := h.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_api_keys WHERE id = $1::uuid`, id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the expired session %s is still there after 10 s (logs: %v)", id, logs.All())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	expire(old)
	h.api.RunJanitor()
	gone(old)
	// A session that expires after the janitor started goes on a later run.
	expire(later)
	gone(later)

	var left int
	if err := h.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_api_keys`).Scan(&left); err != nil || left != 3 {
		t.Errorf("%d rows left (%v); want the admin key, the acme key and the live session", left, err)
	}
	h.must(http.StatusOK, liveToken, "GET", "/v1/endpoints", nil)
	h.must(http.StatusOK, acme, "GET", "/v1/endpoints", nil)
	if n := logs.FilterMessage("deleted expired portal sessions").Len(); n != 2 {
		t.Errorf("%d lines say sessions were deleted; want one per deletion: %v", n, logs.All())
	}
	if n := logs.FilterLevelExact(zap.WarnLevel).Len(); n != 0 {
		t.Errorf("the janitor warned: %v", logs.All())
	}
}
