package sql_test

import (
	"context"
	"testing"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestVacuumKeepsTheQueuesPages: schema 8 turns off vacuum's truncation of webhook_outbox.
// A queue that emptied leaves empty pages at the end of its file; a vacuum that truncated them
// would take the table's ACCESS EXCLUSIVE lock, which every producer's insert waits behind.
// The control, a table without the setting, shows that this vacuum would have truncated.
func TestVacuumKeepsTheQueuesPages(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE control (LIKE webhook_outbox INCLUDING ALL)`); err != nil {
		t.Fatal(err)
	}
	sizes := func() (queue, control int64) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT pg_relation_size('webhook_outbox'), pg_relation_size('control')`).
			Scan(&queue, &control); err != nil {
			t.Fatal(err)
		}
		return queue, control
	}
	for _, table := range []string{"webhook_outbox", "control"} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO `+table+` (event_type, payload)
			SELECT 'vacuum.test', jsonb_build_object('pad', repeat('x', 200)) FROM generate_series(1, 2000)`); err != nil {
			t.Fatal(err)
		}
	}
	queueFull, controlFull := sizes()
	if queueFull == 0 || controlFull == 0 {
		t.Fatalf("sizes after the inserts: queue %d, control %d bytes", queueFull, controlFull)
	}
	for _, table := range []string{"webhook_outbox", "control"} {
		if _, err := db.Pool.Exec(ctx, `DELETE FROM `+table); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `VACUUM `+table); err != nil {
			t.Fatal(err)
		}
	}
	queueAfter, controlAfter := sizes()
	if controlAfter >= controlFull {
		t.Fatalf("the control table was not truncated (%d bytes, then %d): this test shows nothing", controlFull, controlAfter)
	}
	if queueAfter != queueFull {
		t.Errorf("webhook_outbox went from %d to %d bytes: vacuum truncated the queue", queueFull, queueAfter)
	}
	var options []string
	if err := db.Pool.QueryRow(ctx, `SELECT reloptions FROM pg_class WHERE oid = 'webhook_outbox'::regclass`).Scan(&options); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range options {
		found = found || o == "vacuum_truncate=false"
	}
	if !found {
		t.Errorf("webhook_outbox's options %v lack vacuum_truncate=false", options)
	}
}

// TestQueueNoTruncateMigrationWaitsForNoProducer: schema 8's migration takes a lock that an
// open producer transaction does not conflict with, so it upgrades a busy installation
// without queueing every insert behind it.
func TestQueueNoTruncateMigrationWaitsForNoProducer(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigratedTo(t, 7)
	ctx := context.Background()
	producer, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Rollback(ctx)
	if _, err := producer.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('open.tx', '{}')`); err != nil {
		t.Fatal(err)
	}
	var m8 string
	for _, m := range fluxsql.Migrations() {
		if m.Version == 8 {
			m8 = m.SQL
		}
	}
	if m8 == "" {
		t.Fatal("no migration 8")
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, m8); err != nil {
		t.Fatalf("migration 8 beside an open producer transaction: %v", err)
	}
	var mode string
	if err := tx.QueryRow(ctx, `SELECT mode FROM pg_locks WHERE relation = 'webhook_outbox'::regclass
		AND pid = pg_backend_pid() ORDER BY mode DESC LIMIT 1`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "ShareUpdateExclusiveLock" {
		t.Errorf("migration 8 holds %s on webhook_outbox, want ShareUpdateExclusiveLock", mode)
	}
}
