package main

import (
	"context"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestEndpointsUpdateURLVouchesForIt: an endpoint whose URL a tenant wrote through the API is
// restricted, and `endpoints show` says so; `endpoints update` of another field keeps it, and
// `endpoints update --url` (the operator writing the URL) lifts it.
func TestEndpointsUpdateURLVouchesForIt(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	e := addEndpoint(t, db, nil, "--url", "https://a.example/hooks", "--tenant", "acme")
	restricted := func() bool {
		t.Helper()
		var r bool
		if err := db.Pool.QueryRow(context.Background(), `SELECT restricted FROM webhook_endpoints WHERE id = $1`, e.ID).Scan(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if restricted() {
		t.Fatal("an endpoint added by the CLI is restricted")
	}
	if _, err := db.Pool.Exec(context.Background(), `UPDATE webhook_endpoints SET restricted = true WHERE id = $1`, e.ID); err != nil {
		t.Fatal(err)
	}
	if r := runEndpointsCLI(t, db, nil, "show", e.ID); r.code != 0 || !strings.Contains(r.stdout, "restricted") {
		t.Errorf("show of a restricted endpoint: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runEndpointsCLI(t, db, nil, "update", e.ID, "--description", "reviewed"); r.code != 0 || !restricted() {
		t.Errorf("update --description: exit %d, restricted %v; want it kept\n%s", r.code, restricted(), r.stderr)
	}
	if r := runEndpointsCLI(t, db, nil, "update", e.ID, "--url", "https://a.example/hooks"); r.code != 0 || restricted() {
		t.Errorf("update --url: exit %d, restricted %v; want it lifted (the operator vouches)\n%s", r.code, restricted(), r.stderr)
	}
}
