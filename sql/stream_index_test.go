package sql_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestEnsureStreamIndex: the migrations leave ordered delivery's index out (producers would pay
// for it with ordering off); EnsureStreamIndex builds it once, leaves a valid one alone, and
// rebuilds one that a failed build left invalid.
func TestEnsureStreamIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	state := func() string {
		t.Helper()
		var s string
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT CASE WHEN indisvalid THEN 'valid' ELSE 'invalid' END
			FROM pg_index WHERE indexrelid = to_regclass('webhook_outbox_stream_idx')), 'missing')`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := state(); s != "missing" {
		t.Fatalf("after the migrations the stream index is %s, want missing", s)
	}
	for i, want := range []bool{true, false} {
		built, err := fluxsql.EnsureStreamIndex(ctx, db.Pool)
		if err != nil || built != want || state() != "valid" {
			t.Fatalf("call %d: built %v, err %v, index %s; want built %v and a valid index", i+1, built, err, state(), want)
		}
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'webhook_outbox_stream_idx'::regclass`); err != nil {
		t.Skipf("cannot mark the index invalid (not a superuser?): %v", err)
	}
	if built, err := fluxsql.EnsureStreamIndex(ctx, db.Pool); err != nil || !built || state() != "valid" {
		t.Fatalf("over an invalid index: built %v, err %v, index %s; want it rebuilt and valid", built, err, state())
	}
}

// TestEnsureStreamIndexConcurrently: instances that start together take turns: one builds the
// index, the others wait for its build (an index being built is not valid yet, and dropping it
// as a failed build deadlocked), and none fails.
func TestEnsureStreamIndexConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		SELECT 's' || (g % 100), 'x', '{}' FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		built bool
		err   error
	}
	results := make(chan result, 4)
	for range 4 {
		go func() {
			built, err := fluxsql.EnsureStreamIndex(ctx, db.Pool)
			results <- result{built, err}
		}()
	}
	builds := 0
	for range 4 {
		r := <-results
		if r.err != nil {
			t.Errorf("EnsureStreamIndex: %v", r.err)
		}
		if r.built {
			builds++
		}
	}
	if builds != 1 {
		t.Errorf("%d sessions built the index, want exactly one", builds)
	}
}

// TestEnsureStreamIndexReplacesTheOlderForm: an install whose stream index was built keyed by
// stream alone gets the current one (endpoint key included) under the same name, built beside
// it first; a replacement that stopped after building its successor (before or after dropping
// the older index) is finished by the next call, keeping the successor, and one that stopped
// while building it is started again.
func TestEnsureStreamIndexReplacesTheOlderForm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	const older = `CREATE INDEX webhook_outbox_stream_idx ON webhook_outbox (stream_id, (coalesce(order_key, id)))
		WHERE NOT processed AND stream_id IS NOT NULL`
	columns := func(name string) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT indnkeyatts FROM pg_index
			WHERE indexrelid = to_regclass($1) AND indisvalid), 0)`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ensure := func(what string) {
		t.Helper()
		built, err := fluxsql.EnsureStreamIndex(ctx, db.Pool)
		if err != nil || !built {
			t.Fatalf("%s: built %v, err %v; want the index built", what, built, err)
		}
		if n, next := columns("webhook_outbox_stream_idx"), columns("webhook_outbox_stream_next_idx"); n != 3 || next != 0 {
			t.Fatalf("%s: webhook_outbox_stream_idx has %d key columns (0: missing), its successor %d; want 3 and none", what, n, next)
		}
	}
	if _, err := db.Pool.Exec(ctx, older); err != nil {
		t.Fatal(err)
	}
	ensure("over the older index")

	// Stopped after the drop: only the successor is left.
	if _, err := db.Pool.Exec(ctx, `ALTER INDEX webhook_outbox_stream_idx RENAME TO webhook_outbox_stream_next_idx`); err != nil {
		t.Fatal(err)
	}
	ensure("over a successor left alone")

	// Stopped after the build, before the drop: the older index and a valid successor, which
	// is kept (not built again).
	if _, err := db.Pool.Exec(ctx, `ALTER INDEX webhook_outbox_stream_idx RENAME TO webhook_outbox_stream_next_idx`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, older); err != nil {
		t.Fatal(err)
	}
	var successor, kept uint32
	if err := db.Pool.QueryRow(ctx, `SELECT 'webhook_outbox_stream_next_idx'::regclass::oid`).Scan(&successor); err != nil {
		t.Fatal(err)
	}
	ensure("over the older index and a valid successor")
	if err := db.Pool.QueryRow(ctx, `SELECT 'webhook_outbox_stream_idx'::regclass::oid`).Scan(&kept); err != nil || kept != successor {
		t.Errorf("the stream index is %d (%v), want the successor %d kept, not built again", kept, err, successor)
	}

	// Stopped during the build: the older index and an invalid successor.
	if _, err := db.Pool.Exec(ctx, `DROP INDEX webhook_outbox_stream_idx`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, older); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE INDEX webhook_outbox_stream_next_idx ON webhook_outbox (id)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'webhook_outbox_stream_next_idx'::regclass`); err != nil {
		t.Skipf("cannot mark the index invalid (not a superuser?): %v", err)
	}
	ensure("over the older index and a failed successor")
}

// TestEnsureStreamIndexNotOwner: a role that does not own the table cannot build, drop or
// rename the stream index. Over the older form, or over the current form left under its
// successor's name by a replacement that stopped, it is told the index is usable as it is
// (ErrStreamIndexOutdated, with what to run as the owner) and nothing changes; over the current
// index it has nothing to do.
func TestEnsureStreamIndexNotOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	role := sqltest.NewRole(t, db)
	other := sqltest.ConnectAs(t, db, role)
	const older = `CREATE INDEX webhook_outbox_stream_idx ON webhook_outbox (stream_id, (coalesce(order_key, id)))
		WHERE NOT processed AND stream_id IS NOT NULL`
	exec := func(q string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec(older)
	if built, err := fluxsql.EnsureStreamIndex(ctx, other); built || !errors.Is(err, fluxsql.ErrStreamIndexOutdated) {
		t.Errorf("over the older index: built %v, err %v; want ErrStreamIndexOutdated", built, err)
	}
	exec(`DROP INDEX webhook_outbox_stream_idx`)
	exec(strings.Replace(strings.Replace(fluxsql.StreamIndexSQL, "CONCURRENTLY IF NOT EXISTS ", "", 1),
		"webhook_outbox_stream_idx", "webhook_outbox_stream_next_idx", 1))
	built, err := fluxsql.EnsureStreamIndex(ctx, other)
	if built || !errors.Is(err, fluxsql.ErrStreamIndexOutdated) || !strings.Contains(err.Error(), "RENAME TO webhook_outbox_stream_idx") {
		t.Errorf("over the successor alone: built %v, err %v; want ErrStreamIndexOutdated naming the rename to run", built, err)
	}
	if usable, err := fluxsql.StreamIndexUsable(ctx, other); !usable || err != nil {
		t.Errorf("StreamIndexUsable over the successor alone = %v, %v; want true", usable, err)
	}
	exec(`ALTER INDEX webhook_outbox_stream_next_idx RENAME TO webhook_outbox_stream_idx`)
	if built, err := fluxsql.EnsureStreamIndex(ctx, other); built || err != nil {
		t.Errorf("over the current index: built %v, err %v; want nothing to do", built, err)
	}
}
