package endpoints_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestAuditViewDropsTheQuery: the audit trail keeps an endpoint's URL without its query string
// or fragment, where consumers put tokens, but with what tells URLs apart: scheme, host, port
// and path.
func TestAuditViewDropsTheQuery(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://hooks.example.com:8443/in/acme?token=secret#frag": "https://hooks.example.com:8443/in/acme",
		"https://hooks.example.com/in?":                            "https://hooks.example.com/in",
		"https://hooks.example.com":                                "https://hooks.example.com",
		"http://[::1]:9/x?a=b":                                     "http://[::1]:9/x",
		"%zz?token=secret":                                         "%zz",
		"https://svc:pa/ss@hooks.example.com/in?t=1":               "https://hooks.example.com/in",
		"https://svc:pa?ss@hooks.example.com/in":                   "https://hooks.example.com/in",
		"https://svc:pa#ss@hooks.example.com/in":                   "https://hooks.example.com/in",
	} {
		if got := endpoints.AuditView(endpoints.Endpoint{URL: in}).URL; got != want {
			t.Errorf("AuditView(%q).URL = %q; want %q", in, got, want)
		}
	}
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, "", "")
	e, err := endpoints.AddAudited(ctx, db.Pool, c, endpoints.New{URL: "https://hooks.example.com/in?token=create-secret"}, "cli:test")
	if err != nil {
		t.Fatal(err)
	}
	u := "https://hooks.example.com/in?token=update-secret"
	if _, err := endpoints.Audited(ctx, db.Pool, c, e.ID, nil, "cli:test", "endpoint.update", func(tx pgx.Tx) error {
		_, err := endpoints.Update(ctx, tx, c, e.ID, endpoints.Patch{URL: &u})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var trail string
	if err := db.Pool.QueryRow(ctx, `SELECT string_agg(concat(before::text, after::text), ' ') FROM webhook_audit`).Scan(&trail); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(trail, "create-secret") || strings.Contains(trail, "update-secret") || !strings.Contains(trail, `"https://hooks.example.com/in"`) {
		t.Errorf("the audit trail = %s; want the URL without its query", trail)
	}
}
