package main

import (
	"strings"
	"testing"

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
