package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestAPIKeysAddNeedsAnExplicitScope: `fluxhook api-keys add --tenant "$CUSTOMER"` with the
// variable empty must not make an admin key (every tenant, key management): the CLI fails
// closed. An admin key takes --admin; --tenant given empty, both flags, or neither are usage
// errors naming what to choose, and make no key.
func TestAPIKeysAddNeedsAnExplicitScope(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tenant", ""}, "--tenant: empty"},
		{[]string{"--tenant="}, "--tenant: empty"},
		{nil, "--admin"},
		{[]string{"--description", "ops"}, "--tenant T"},
		{[]string{"--tenant", "acme", "--admin"}, "choose one"},
		{[]string{"--tenant", " acme"}, "--tenant"},
	} {
		r := runCLI(t, db.URL, append([]string{"api-keys", "add", "--json"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("api-keys add %q exited %d; want 2 with %q: %s%s", c.args, r.code, c.want, r.stdout, r.stderr)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_api_keys`); n != 0 {
		t.Fatalf("refused commands made %d keys", n)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--admin"}, `"tenant": null`},
		{[]string{"--tenant", "acme"}, `"tenant": "acme"`},
	} {
		r := runCLI(t, db.URL, append([]string{"api-keys", "add", "--json"}, c.args...)...)
		if r.code != 0 || !strings.Contains(r.stdout, c.want) {
			t.Errorf("api-keys add %q exited %d; want 0 and %s: %s%s", c.args, r.code, c.want, r.stdout, r.stderr)
		}
	}
}

// TestAPIKeysRevokeEndsPortalSessions: `api-keys list --portal` shows the portal links that have
// not expired; `api-keys revoke` ends one of them by its id, and revoking a key ends the links
// it made, each recorded in the audit trail under the CLI's user.
func TestAPIKeysRevokeEndsPortalSessions(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	keyID, _ := addKey(t, db, "--admin")
	acme := "acme"
	var sessions []string
	for range 2 {
		s, _, err := apikeys.AddPortalSession(ctx, db.Pool, apikeys.New{Tenant: &acme, CreatedBy: "key:" + keyID}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s.ID)
	}
	list := runCLI(t, db.URL, "api-keys", "list", "--portal")
	if list.code != 0 || !strings.Contains(list.stdout, sessions[0]) || !strings.Contains(list.stdout, sessions[1]) || strings.Contains(list.stdout, "\n"+keyID) {
		t.Fatalf("api-keys list --portal (%d) shows:\n%s%s", list.code, list.stdout, list.stderr)
	}
	if r := runCLI(t, db.URL, "api-keys", "revoke", sessions[0]); r.code != 0 || !strings.Contains(r.stdout, "revoked portal session "+sessions[0]) {
		t.Fatalf("api-keys revoke SESSION exited %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, db.URL, "api-keys", "revoke", keyID); r.code != 0 || !strings.Contains(r.stdout, "1 portal sessions") {
		t.Fatalf("api-keys revoke KEY exited %d: %s%s", r.code, r.stdout, r.stderr)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_api_keys WHERE revoked_at IS NULL`); n != 0 {
		t.Errorf("%d keys or sessions still work", n)
	}
	got := queryStrings(t, db, `SELECT action || ' ' || object_id FROM webhook_audit WHERE actor LIKE 'cli%' AND action LIKE '%.revoke' ORDER BY id`)
	want := []string{"portal_session.revoke " + sessions[0], "api_key.revoke " + keyID, "portal_session.revoke " + sessions[1]}
	if !slices.Equal(got, want) {
		t.Errorf("audit trail = %q; want %q", got, want)
	}
}
