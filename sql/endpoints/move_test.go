package endpoints_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestMoveCarriesNoCredentialHeaders: moving an endpoint to another tenant (or out of its tenant)
// is refused while a credential header's value would go with it, unchanged, merged or kept
// through the mask: the new tenant may point the URL at its own server, and the dispatcher
// would send it the old tenant's credential there. Headers given anew in the same change, a
// header that is not a credential, and a change that stays within the tenant pass.
func TestMoveCarriesNoCredentialHeaders(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, "", "")
	ptr := func(s string) *string { return &s }
	hdrs := func(h map[string]string) *map[string]string { return &h }
	e := mustAdd(t, db, c, endpoints.New{URL: "https://a.example/", Tenant: "acme",
		Headers: map[string]string{"Authorization": "Bearer acme-credential", "X-Env": "prod"}})

	for name, p := range map[string]endpoints.Patch{
		"kept":       {Tenant: ptr("globex")},
		"to none":    {Tenant: ptr("")},
		"merged":     {Tenant: ptr("globex"), Headers: hdrs(map[string]string{"X-Other": "1"}), MergeHeaders: true},
		"masked":     {Tenant: ptr("globex"), Headers: hdrs(map[string]string{"authorization": "********"}), HeaderMask: "********"},
		"url change": {Tenant: ptr("globex"), URL: ptr("https://globex.example/collector")},
	} {
		_, err := endpoints.Update(ctx, db.Pool, c, e.ID, p)
		var inv *endpoints.InvalidError
		if !errors.As(err, &inv) || inv.Field != "headers" {
			t.Errorf("%s: Update = %v; want the move refused, naming headers", name, err)
		}
	}
	if got := mustGet(t, db, c, e.ID); got.Tenant != "acme" || got.Headers["Authorization"] != "Bearer acme-credential" {
		t.Fatalf("after refused moves: tenant %q, headers %v; want both unchanged", got.Tenant, got.Headers)
	}
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Tenant: ptr("acme"), Description: ptr("same tenant")}); err != nil {
		t.Errorf("a change naming the same tenant: %v", err)
	}
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Tenant: ptr("globex"),
		Headers: hdrs(map[string]string{"Authorization": "Bearer globex-credential", "X-Env": "prod"})}); err != nil {
		t.Fatalf("a move with the headers given anew: %v", err)
	}
	if got := mustGet(t, db, c, e.ID); got.Tenant != "globex" || got.Headers["Authorization"] != "Bearer globex-credential" {
		t.Errorf("after the move: tenant %q, headers %v; want globex's", got.Tenant, got.Headers)
	}
	plain := mustAdd(t, db, c, endpoints.New{URL: "https://b.example/", Tenant: "acme", Headers: map[string]string{"X-Env": "prod"}})
	if _, err := endpoints.Update(ctx, db.Pool, c, plain.ID, endpoints.Patch{Tenant: ptr("globex")}); err != nil {
		t.Errorf("moving an endpoint without credential headers: %v", err)
	}
}
