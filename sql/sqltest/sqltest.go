// Package sqltest gives each test its own freshly migrated PostgreSQL database on the server
// named by FLUXHOOK_TEST_DATABASE_URL (default: root on 127.0.0.1:5432, as the README's test
// command sets it up), and drops it when the test ends.
//
// A database per test, rather than a schema or a transaction, because fluxhook's behaviour
// spans several connections (claim, settle, the listener) and its trigger and NOTIFY channel
// are database-wide: only a database isolates all of it, and tests can then run in parallel.
package sqltest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

// DefaultURL is the server tests use when FLUXHOOK_TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://root@127.0.0.1:5432/postgres?sslmode=disable"

// ServerURL returns the URL of the server the tests create their databases on.
func ServerURL() string {
	if u := os.Getenv("FLUXHOOK_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's database.
type DB struct {
	// Name is the database's name.
	Name string
	// URL connects to it.
	URL string
	// Pool is a small pool on it, closed at cleanup.
	Pool *pgxpool.Pool
}

// New creates an empty database for t (no fluxhook schema).
func New(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, drop, err := Create(ctx)
	if err != nil {
		t.Fatalf("sqltest: %v", err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("sqltest: %v", err)
		}
	})
	return db
}

// Create creates an empty database outside any one test and returns the function that drops
// it. It is for a TestMain whose examples need a database: an Example has no *testing.T to
// hand to New, so the database is set up around m.Run instead.
func Create(ctx context.Context) (*DB, func() error, error) {
	admin, err := pgx.Connect(ctx, ServerURL())
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to %s (set FLUXHOOK_TEST_DATABASE_URL, or run the README's test command, which starts PostgreSQL): %w", ServerURL(), err)
	}
	defer admin.Close(ctx)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "fluxhook_test_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, nil, fmt.Errorf("create database: %w", err)
	}
	url := withDatabase(ServerURL(), name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, nil, fmt.Errorf("pool: %w", err)
	}
	db := &DB{Name: name, URL: url, Pool: pool}
	drop := func() error {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, ServerURL())
		if err != nil {
			return fmt.Errorf("cleanup connect: %w", err)
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}
	return db, drop, nil
}

// NewMigrated creates a database for t with fluxhook's schema installed.
func NewMigrated(t testing.TB) *DB {
	t.Helper()
	db := New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := fluxsql.Migrate(ctx, db.Pool); err != nil {
		t.Fatalf("sqltest: migrate: %v", err)
	}
	return db
}

// NewMigratedTo creates a database for t with the migrations up to version v applied and the
// later ones pending, as an older fluxhook left it: the starting point of upgrade tests.
func NewMigratedTo(t testing.TB, v int) *DB {
	t.Helper()
	db := New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range fluxsql.Migrations() {
		if m.Version > v {
			break
		}
		if _, err := db.Pool.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("sqltest: applying %s: %v", m.Name, err)
		}
	}
	return db
}

// ConnectAs opens a pool on db's database as role (the test server trusts local connections),
// closed at cleanup: what a least-privileged producer or dispatcher sees.
func ConnectAs(t testing.TB, db *DB, role string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatalf("sqltest: %v", err)
	}
	cfg.ConnConfig.User = role
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("sqltest: connecting as %s: %v", role, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// NewRole creates a LOGIN role without privileges for t, for tests of what a least-privileged
// producer or dispatcher may do, and drops it (with its grants in db) at cleanup. Roles are
// cluster-wide, so its name is random.
func NewRole(t testing.TB, db *DB) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "fluxhook_role_" + hex.EncodeToString(b[:])
	if _, err := db.Pool.Exec(context.Background(), `CREATE ROLE `+role+` LOGIN`); err != nil {
		t.Fatalf("sqltest: create role: %v", err)
	}
	t.Cleanup(func() {
		for _, stmt := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := db.Pool.Exec(context.Background(), stmt); err != nil {
				t.Errorf("sqltest: %s: %v", stmt, err)
			}
		}
	})
	return role
}

// RefuseSettles installs a trigger in db that refuses every row settled into the delivery log
// (schema 7: a settle deletes the outbox row and inserts its outcome into
// webhook_delivery_log) whose log row satisfies condition (an SQL boolean over NEW, a
// webhook_delivery_log row), as an operator's own trigger might. Refusing the log row refuses
// the whole settle of that row. The error is a row error (P0001, "row N refused by the
// operator"): what the settle fallback must keep to its own row.
func RefuseSettles(t testing.TB, db *DB, condition string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.Pool.Exec(ctx, `
		CREATE FUNCTION fluxhook_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF `+condition+` THEN
				RAISE EXCEPTION 'row % refused by the operator', NEW.id;
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER fluxhook_test_refuse BEFORE INSERT ON webhook_delivery_log
			FOR EACH ROW EXECUTE FUNCTION fluxhook_test_refuse();`); err != nil {
		t.Fatalf("sqltest: installing the refusing trigger: %v", err)
	}
}

// EndpointsVersion reads the sequence webhook_endpoints_version, which every change to what
// dispatchers use of webhook_endpoints moves (0 when none was ever made).
func (db *DB) EndpointsVersion(t testing.TB) int64 {
	t.Helper()
	var v int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(pg_catalog.pg_sequence_last_value('webhook_endpoints_version'::pg_catalog.regclass), 0)`).Scan(&v); err != nil {
		t.Fatalf("sqltest: reading webhook_endpoints_version: %v", err)
	}
	return v
}
