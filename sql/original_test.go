package sql_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// originalTables are the original dispatcher's webhook_outbox, which fluxhook installs over.
//
// Our assumption, since its DDL was never published: the first is what its repository's
// migration is remembered to say (BIGSERIAL id, processed NOT NULL DEFAULT false, an unnamed
// index on (processed, created_at)); the second is the variant we think older installations
// may have, with a SERIAL (integer) id and a nullable processed. Both have the same six
// columns, names and meaning; a NULL processed is taken to mean "never marked processed",
// since its default was false. The producer role's grants are what the original's producers
// needed: INSERT, and USAGE on the serial's sequence for nextval.
var originalTables = []struct {
	name     string
	ddl      string
	nullable bool // processed is nullable
}{
	{name: "bigserial", ddl: `
		CREATE TABLE webhook_outbox (
			id BIGSERIAL PRIMARY KEY,
			stream_id TEXT,
			event_type TEXT NOT NULL,
			payload JSONB NOT NULL,
			created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
			processed BOOLEAN NOT NULL DEFAULT false
		);
		CREATE INDEX ON webhook_outbox (processed, created_at);`},
	{name: "serial-nullable-processed", nullable: true, ddl: `
		CREATE TABLE webhook_outbox (
			id SERIAL PRIMARY KEY,
			stream_id TEXT,
			event_type TEXT NOT NULL,
			payload JSONB NOT NULL,
			created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
			processed BOOLEAN DEFAULT false
		);
		CREATE INDEX ON webhook_outbox (processed, created_at);`},
}

// originalRow is a row of the original's table as it was before the upgrade.
type originalRow struct {
	ID        int64
	StreamID  *string
	EventType string
	Payload   string
	CreatedAt time.Time
	Processed *bool
}

// original is a database holding the original's table and rows, and what the checks need to
// know of it.
type original struct {
	db       *sqltest.DB
	producer string // a role with the original producers' grants
	rows     []originalRow
	nextID   int64 // what the original's sequence would have given next
}

// newOriginal creates a database with the original's table, rows pending and processed, and a
// producer role, as a running installation of the original would have them.
func newOriginal(t *testing.T, ddl string, nullable bool) *original {
	t.Helper()
	ctx := context.Background()
	db := sqltest.New(t)
	o := &original{db: db, producer: sqltest.NewRole(t, db)}
	exec := func(sql string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(ddl)
	exec(`GRANT INSERT ON webhook_outbox TO ` + o.producer)
	exec(`GRANT USAGE ON SEQUENCE webhook_outbox_id_seq TO ` + o.producer)
	// Delivered rows, and pending ones: due for a while, just due, and one a producer inserted
	// in the original's own form.
	exec(`INSERT INTO webhook_outbox (stream_id, event_type, payload, created_at, processed) VALUES
		('s1', 'stream.created', '{"n": 1}', now() - interval '2 days', true),
		('s1', 'stream.updated', '{"n": 2, "deep": {"a": [1, 2]}}', now() - interval '1 day', true),
		('s2', 'stream.created', '{"n": 3}', now() - interval '10 minutes', false),
		(NULL, 'system.ping', '{"n": 4}', now() - interval '1 minute', false)`)
	exec(`INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES ('s3', 'stream.deleted', '{"n": 5}')`)
	if nullable {
		exec(`INSERT INTO webhook_outbox (stream_id, event_type, payload, processed) VALUES ('s4', 'stream.created', '{"n": 6}', NULL)`)
	}
	// A row that was deleted: the sequence stands past the highest id, and new ids must not
	// reuse it.
	exec(`INSERT INTO webhook_outbox (stream_id, event_type, payload, processed) VALUES ('gone', 'x', '{}', true)`)
	exec(`DELETE FROM webhook_outbox WHERE stream_id = 'gone'`)

	rows, err := db.Pool.Query(ctx, `SELECT id, stream_id, event_type, payload::text, created_at, processed
		FROM webhook_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	o.rows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[originalRow])
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT last_value + 1 FROM webhook_outbox_id_seq`).Scan(&o.nextID); err != nil {
		t.Fatal(err)
	}
	return o
}

// check verifies the upgraded database: the schema is a fresh install's (plus the original's
// index), every row is kept with our columns filled in, the pending ones are due for delivery,
// and producers written for the original still insert.
func (o *original) check(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	db := o.db
	if err := fluxsql.CheckCurrent(ctx, db.Pool); err != nil {
		t.Fatalf("CheckCurrent after the upgrade: %v", err)
	}

	// The schema: the same tables, columns in the same order, types, defaults, identity,
	// constraints, indexes, triggers and storage options as a fresh install's; the original's
	// index is the only addition.
	fresh := sqltest.NewMigrated(t)
	want, got := describeSchema(t, fresh), describeSchema(t, db)
	var extra []string
	for _, line := range got {
		if !slices.Contains(want, line) {
			extra = append(extra, line)
		}
	}
	for _, line := range want {
		if !slices.Contains(got, line) {
			t.Errorf("upgraded schema lacks: %s", line)
		}
	}
	originalIndex := "index CREATE INDEX webhook_outbox_processed_created_at_idx ON public.webhook_outbox USING btree (processed, created_at)"
	if !slices.Equal(extra, []string{originalIndex}) {
		t.Errorf("upgraded schema has, beyond a fresh install's: %q; want only the original's index", extra)
	}
	if got, want := columnOrder(t, db), columnOrder(t, fresh); !slices.Equal(got, want) {
		t.Errorf("webhook_outbox's columns are\n%v\nwant a fresh install's order\n%v", got, want)
	}

	// Every row, as it was, with our columns filled in.
	type upgradedRow struct {
		originalRow
		Processed   bool
		DeliveryID  *string
		Attempt     int
		EnqueuedAt  time.Time
		ProcessedAt *time.Time
		LeaseUntil  *time.Time
		RoutedAt    *time.Time
	}
	rows, err := db.Pool.Query(ctx, `SELECT id, stream_id, event_type, payload::text, created_at, processed,
			delivery_id::text, attempt, enqueued_at, processed_at, lease_until, routed_at
		FROM webhook_deliveries ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	after, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (upgradedRow, error) {
		var r upgradedRow
		err := row.Scan(&r.ID, &r.StreamID, &r.EventType, &r.Payload, &r.CreatedAt, &r.Processed,
			&r.DeliveryID, &r.Attempt, &r.EnqueuedAt, &r.ProcessedAt, &r.LeaseUntil, &r.RoutedAt)
		return r, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(o.rows) {
		t.Fatalf("%d rows after the upgrade, want the original's %d", len(after), len(o.rows))
	}
	ids := map[string]bool{}
	pending := 0
	for i, r := range after {
		b := o.rows[i]
		if r.ID != b.ID || !equalPtr(r.StreamID, b.StreamID) || r.EventType != b.EventType ||
			r.Payload != b.Payload || !r.CreatedAt.Equal(b.CreatedAt) {
			t.Errorf("row %d changed: %+v, was %+v", b.ID, r.originalRow, b)
		}
		wasProcessed := b.Processed != nil && *b.Processed
		if r.Processed != wasProcessed {
			t.Errorf("row %d: processed %v, was %v (NULL counts as pending)", b.ID, r.Processed, fmtPtr(b.Processed))
		}
		if r.DeliveryID == nil || len(*r.DeliveryID) != 36 || ids[*r.DeliveryID] {
			t.Errorf("row %d: delivery_id %v, want a new one of its own", b.ID, fmtPtr(r.DeliveryID))
		} else {
			ids[*r.DeliveryID] = true
		}
		if r.Attempt != 1 || !r.EnqueuedAt.Equal(b.CreatedAt) || r.LeaseUntil != nil || r.RoutedAt != nil {
			t.Errorf("row %d: attempt %d, enqueued_at %v (created_at %v), lease_until %v, routed_at %v; want 1, created_at, NULL, NULL",
				b.ID, r.Attempt, r.EnqueuedAt, b.CreatedAt, fmtPtr(r.LeaseUntil), fmtPtr(r.RoutedAt))
		}
		switch {
		case r.Processed && (r.ProcessedAt == nil || !r.ProcessedAt.Equal(b.CreatedAt)):
			t.Errorf("processed row %d: processed_at %v, want its created_at %v", b.ID, fmtPtr(r.ProcessedAt), b.CreatedAt)
		case !r.Processed && r.ProcessedAt != nil:
			t.Errorf("pending row %d: processed_at %v, want NULL", b.ID, *r.ProcessedAt)
		}
		if !r.Processed {
			pending++
		}
	}
	// The pending rows are what the dispatcher's claim finds: due, unprocessed, through the
	// due index's predicate.
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE NOT processed AND created_at <= now()`); n != pending || pending == 0 {
		t.Errorf("%d rows due for delivery, want the %d pending ones", n, pending)
	}

	// A producer written for the original, under its role (INSERT, and USAGE on the sequence,
	// so no RETURNING): its insert gets an id after the original's sequence, which currval
	// still answers on the sequence's name, and our defaults.
	var currval int64
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+o.producer); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
			VALUES ('s9', 'stream.created', '{"n": 9}')`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT currval('webhook_outbox_id_seq')`).Scan(&currval)
	})
	if err != nil {
		t.Fatalf("a producer's insert in the original's form, as the original's producer role: %v", err)
	}
	var id int64
	var attempt int
	var deliveryID string
	var processed bool
	if err := db.Pool.QueryRow(ctx, `SELECT id, attempt, delivery_id::text, processed FROM webhook_deliveries
		WHERE stream_id = 's9'`).Scan(&id, &attempt, &deliveryID, &processed); err != nil {
		t.Fatal(err)
	}
	if id != o.nextID || currval != id || attempt != 1 || len(deliveryID) != 36 || ids[deliveryID] || processed {
		t.Errorf("new row: id %d (currval %d), attempt %d, delivery_id %q, processed %v; want id %d, attempt 1, a new delivery_id, pending",
			id, currval, attempt, deliveryID, processed, o.nextID)
	}

	// Nothing is left to do: migrating again applies nothing.
	if applied, err := fluxsql.Migrate(ctx, db.Pool); err != nil || len(applied) != 0 {
		t.Errorf("migrate after the upgrade = %v, %v; want nothing applied", applied, err)
	}
}

// TestMigrateUpgradesOriginalTable installs fluxhook with Migrate over the original's table
// with pending and processed rows.
func TestMigrateUpgradesOriginalTable(t *testing.T) {
	t.Parallel()
	for _, tc := range originalTables {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := newOriginal(t, tc.ddl, tc.nullable)
			applied, err := fluxsql.Migrate(context.Background(), o.db.Pool)
			if err != nil {
				t.Fatalf("migrate over the original's table: %v", err)
			}
			if len(applied) != len(fluxsql.Migrations()) {
				t.Errorf("applied %v, want every migration", applied)
			}
			o.check(t)
		})
	}
}

// TestScriptUpgradesOriginalTable does the same through psql, as users who install by SQL do,
// twice (the second run must change nothing).
func TestScriptUpgradesOriginalTable(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql not installed")
	}
	file := filepath.Join(t.TempDir(), "fluxhook.sql")
	if err := os.WriteFile(file, []byte(fluxsql.Script()), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range originalTables {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := newOriginal(t, tc.ddl, tc.nullable)
			for range 2 {
				out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", o.db.URL, "-f", file).CombinedOutput()
				if err != nil {
					t.Fatalf("psql -f: %v\n%s", err, out)
				}
			}
			o.check(t)
		})
	}
}

// TestMigrateFreshSchemaUnchangedByUpgradeBlock checks that the upgrade block in migration 1
// leaves a fresh install alone: a database where migration 1 ran without the block (the table
// created by its CREATE TABLE alone) and then the rest, has the same schema as Migrate's.
func TestMigrateFreshSchemaUnchangedByUpgradeBlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	first := fluxsql.Migrations()[0].SQL
	start := strings.Index(first, "DO $upgrade$")
	end := strings.Index(first, "$upgrade$;")
	if start < 0 || end < 0 {
		t.Fatal("migration 1 has no DO $upgrade$ block")
	}
	without := sqltest.New(t)
	if _, err := without.Pool.Exec(ctx, first[:start]+first[end+len("$upgrade$;"):]); err != nil {
		t.Fatalf("migration 1 without the upgrade block: %v", err)
	}
	for _, m := range fluxsql.Migrations()[1:] {
		if _, err := without.Pool.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
	}
	with := sqltest.NewMigrated(t)
	if got, want := describeSchema(t, with), describeSchema(t, without); !slices.Equal(got, want) {
		t.Errorf("fresh schema with the upgrade block:\n%s\nwithout:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got, want := columnOrder(t, with), columnOrder(t, without); !slices.Equal(got, want) {
		t.Errorf("columns %v, want %v", got, want)
	}
}

// describeSchema lists, sorted, what makes up the schema of db's public schema: each table's
// columns (type, NOT NULL, identity, default, owned sequence), constraints, indexes, triggers
// and storage options, and each sequence's type and bounds. Not its privileges (roles differ
// between databases), nor a sequence's start (an upgraded identity continues the original's).
func describeSchema(t *testing.T, db *sqltest.DB) []string {
	t.Helper()
	return queryStrings(t, db, `
		SELECT format('column %s.%s %s%s%s%s%s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
			CASE WHEN a.attnotnull THEN ' not null' ELSE '' END,
			CASE a.attidentity WHEN 'd' THEN ' generated by default as identity'
			                   WHEN 'a' THEN ' generated always as identity' ELSE '' END,
			coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), ''),
			coalesce(' sequence ' || pg_get_serial_sequence(c.oid::regclass::text, a.attname), ''))
		FROM pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT format('constraint %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
		FROM pg_constraint WHERE connamespace = 'public'::regnamespace
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relnamespace = 'public'::regnamespace
		UNION ALL
		SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger
		WHERE NOT tgisinternal AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)
		UNION ALL
		SELECT format('options %s %s', relname, reloptions) FROM pg_class
		WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'
		UNION ALL
		SELECT format('sequence %s %s increment %s min %s max %s cache %s cycle %s', c.relname,
			format_type(s.seqtypid, NULL), s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle)
		FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
		WHERE c.relnamespace = 'public'::regnamespace
		ORDER BY 1`)
}

// columnOrder is webhook_outbox's columns in their order.
func columnOrder(t *testing.T, db *sqltest.DB) []string {
	t.Helper()
	return queryStrings(t, db, `SELECT attname::text FROM pg_attribute
		WHERE attrelid = 'webhook_outbox'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`)
}

func queryInt(t *testing.T, db *sqltest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func queryStrings(t *testing.T, db *sqltest.DB, sql string) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return out
}

func equalPtr[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

func fmtPtr[T any](p *T) any {
	if p == nil {
		return "NULL"
	}
	return *p
}
