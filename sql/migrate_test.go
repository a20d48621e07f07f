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

// TestUpgradeToSchema4KeepsRowsWithoutRewrite upgrades a schema-3 outbox that holds pending
// rows: schema 4 adds the wake-up column and drops the trigger, and must do it without
// rewriting the table (a volatile DEFAULT given in ADD COLUMN would rewrite every row under an
// exclusive lock, stalling producers for as long as a large outbox takes to copy).
func TestUpgradeToSchema4KeepsRowsWithoutRewrite(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	ctx := context.Background()
	for _, m := range fluxsql.Migrations() {
		if m.Version > 3 {
			break
		}
		if _, err := db.Pool.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("applying %s: %v", m.Name, err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) SELECT 'before', '{}' FROM generate_series(1, 100)`); err != nil {
		t.Fatal(err)
	}
	var fileBefore uint32
	if err := db.Pool.QueryRow(ctx, `SELECT pg_relation_filenode('webhook_outbox')`).Scan(&fileBefore); err != nil {
		t.Fatal(err)
	}
	applied, err := fluxsql.Migrate(ctx, db.Pool)
	if err != nil || len(applied) != 1 || applied[0] != 4 {
		t.Fatalf("migrate from schema 3 = %v, %v; want [4]", applied, err)
	}
	var fileAfter uint32
	var rows, marked, triggers int
	if err := db.Pool.QueryRow(ctx, `SELECT pg_relation_filenode('webhook_outbox'),
		(SELECT count(*) FROM webhook_outbox WHERE event_type = 'before' AND NOT processed),
		(SELECT count(*) FROM webhook_outbox WHERE wake_notified IS NOT NULL),
		(SELECT count(*) FROM pg_trigger WHERE tgrelid = 'webhook_outbox'::regclass AND NOT tgisinternal)`).Scan(&fileAfter, &rows, &marked, &triggers); err != nil {
		t.Fatal(err)
	}
	if fileAfter != fileBefore {
		t.Errorf("the outbox was rewritten by the upgrade (file node %d, then %d)", fileBefore, fileAfter)
	}
	if rows != 100 || marked != 0 {
		t.Errorf("after the upgrade: %d pending rows (want 100), %d with wake_notified set (want 0)", rows, marked)
	}
	if triggers != 0 {
		t.Errorf("%d triggers left on webhook_outbox, want none", triggers)
	}
}
