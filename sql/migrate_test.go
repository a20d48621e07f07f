package sql_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	ctx := context.Background()

	if err := fluxsql.CheckCurrent(ctx, db.Pool); !errors.Is(err, fluxsql.ErrSchemaOutdated) {
		t.Fatalf("CheckCurrent on an empty database = %v, want ErrSchemaOutdated", err)
	}

	// Several instances starting at once: every migration is applied exactly once.
	var wg sync.WaitGroup
	applied := make([][]int, 5)
	errs := make([]error, 5)
	for i := range 5 {
		wg.Go(func() { applied[i], errs[i] = fluxsql.Migrate(ctx, db.Pool) })
	}
	wg.Wait()
	total := 0
	for i := range 5 {
		if errs[i] != nil {
			t.Fatalf("concurrent migrate %d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	if total != len(fluxsql.Migrations()) {
		t.Fatalf("concurrent migrations applied %d steps in all, want %d", total, len(fluxsql.Migrations()))
	}
	again, err := fluxsql.Migrate(ctx, db.Pool)
	if err != nil || len(again) != 0 {
		t.Fatalf("second migrate = %v, %v; want nothing applied", again, err)
	}
	if err := fluxsql.CheckCurrent(ctx, db.Pool); err != nil {
		t.Fatalf("CheckCurrent after migrate: %v", err)
	}
}
