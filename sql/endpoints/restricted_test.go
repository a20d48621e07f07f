package endpoints_test

import (
	"context"
	"testing"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestRestrictedIsStoredAndPatched: an endpoint added restricted reads back so (Get, Page);
// a patch of other fields keeps it, and only a patch that sets Restricted changes it, so that
// a caller that forgets it never lifts a restriction.
func TestRestrictedIsStoredAndPatched(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, "", "")
	e := mustAdd(t, db, c, endpoints.New{URL: "https://hooks.example.com/a", Restricted: true})
	if !e.Restricted || !mustGet(t, db, c, e.ID).Restricted {
		t.Fatalf("an endpoint added restricted reads back %v", mustGet(t, db, c, e.ID).Restricted)
	}
	if page, err := endpoints.Page(ctx, db.Pool, c, endpoints.PageQuery{}); err != nil || len(page) != 1 || !page[0].Restricted {
		t.Fatalf("Page = %+v, %v; want the endpoint restricted", page, err)
	}
	u := "https://hooks.example.com/b"
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{URL: &u}); err != nil {
		t.Fatal(err)
	}
	if !mustGet(t, db, c, e.ID).Restricted {
		t.Errorf("a patch of the URL without Restricted lifted the restriction")
	}
	operator := false
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Restricted: &operator}); err != nil {
		t.Fatal(err)
	}
	if mustGet(t, db, c, e.ID).Restricted {
		t.Errorf("a patch of Restricted alone did not change it")
	}
	if n := mustAdd(t, db, c, endpoints.New{URL: "https://hooks.example.com/c"}); n.Restricted {
		t.Errorf("an endpoint added by the operator (the zero value) is restricted")
	}
}
