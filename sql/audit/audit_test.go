package audit_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/fluxora/fluxhook/sql/audit"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestMain fails the package if a test leaves a goroutine behind (a pool not closed).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTrailIsScopedByTenantAndNewestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	acme, globex := "acme", "globex"
	for i, c := range []audit.Change{
		{Actor: "cli:a", Tenant: &acme, Action: "endpoint.create", ObjectType: "endpoint", ObjectID: "e1", After: map[string]any{"url": "https://a.example"}},
		{Actor: "key:k", Tenant: &globex, Action: "endpoint.create", ObjectType: "endpoint", ObjectID: "e2"},
		{Actor: "cli:a", Tenant: &acme, Action: "endpoint.update", ObjectType: "endpoint", ObjectID: "e1",
			Before: map[string]any{"url": "https://a.example"}, After: map[string]any{"url": "https://b.example"}},
	} {
		if err := audit.Record(ctx, db.Pool, c); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	got, err := audit.List(ctx, db.Pool, audit.Filter{Tenant: &acme})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Action != "endpoint.update" || got[1].Action != "endpoint.create" {
		t.Fatalf("acme's trail = %+v; want its two entries, newest first", got)
	}
	if !strings.Contains(string(got[0].Before), "a.example") || !strings.Contains(string(got[0].After), "b.example") {
		t.Fatalf("before/after not kept: %s / %s", got[0].Before, got[0].After)
	}
	page, _ := audit.List(ctx, db.Pool, audit.Filter{Before: got[0].ID, Limit: 1})
	if len(page) != 1 || page[0].ObjectID != "e2" {
		t.Fatalf("the page before entry %d = %+v; want globex's entry", got[0].ID, page)
	}
	all, _ := audit.List(ctx, db.Pool, audit.Filter{})
	if len(all) != 3 {
		t.Fatalf("admin's trail has %d entries; want 3", len(all))
	}
}

func TestTrailRefusesSecrets(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	err := audit.Record(context.Background(), db.Pool, audit.Change{Actor: "cli:a", Action: "endpoint.create",
		ObjectType: "endpoint", ObjectID: "e1", After: map[string]any{"secret": "whsec_x"}})
	if err == nil || !strings.Contains(err.Error(), "secret") {
		t.Fatalf("an entry holding a secret was recorded (%v)", err)
	}
}
