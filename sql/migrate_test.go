package sql_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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

// TestScriptInstallsThroughPsql checks the promise to users who install by SQL: the printed
// script, applied with psql, installs a schema that fluxhook accepts and whose trigger works,
// and applying it twice is harmless.
func TestScriptInstallsThroughPsql(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql not installed")
	}
	db := sqltest.New(t)
	file := filepath.Join(t.TempDir(), "fluxhook.sql")
	if err := os.WriteFile(file, []byte(fluxsql.Script()), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db.URL, "-f", file).CombinedOutput()
		if err != nil {
			t.Fatalf("psql -f: %v\n%s", err, out)
		}
	}
	ctx := context.Background()
	if err := fluxsql.CheckCurrent(ctx, db.Pool); err != nil {
		t.Fatalf("CheckCurrent after psql install: %v", err)
	}
	// The installed schema accepts an original-style insert and fills in our columns.
	var attempt int
	var deliveryID string
	err = db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		VALUES ('s1', 'stream.updated', '{"a":1}') RETURNING attempt, delivery_id::text`).Scan(&attempt, &deliveryID)
	if err != nil {
		t.Fatalf("original-style insert: %v", err)
	}
	if attempt != 1 || len(deliveryID) != 36 {
		t.Fatalf("defaults: attempt=%d delivery_id=%q", attempt, deliveryID)
	}
	// Migrating a psql-installed database is a no-op.
	if applied, err := fluxsql.Migrate(ctx, db.Pool); err != nil || len(applied) != 0 {
		t.Fatalf("migrate after psql install = %v, %v", applied, err)
	}
}
