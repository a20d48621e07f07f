package sql

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrateLockKey is the advisory lock that serialises concurrent `fluxhook migrate` runs.
// It is an arbitrary constant ("fluxhook" in ASCII) shared by every version of fluxhook.
const migrateLockKey int64 = 0x666c7578686f6f6b

// Migration is one numbered schema step.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations in version order.
func Migrations() []Migration {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		panic(fmt.Sprintf("fluxhook: embedded migrations unreadable: %v", err))
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic(fmt.Sprintf("fluxhook: embedded migration %q is not named NNNN_name.sql", name))
		}
		body, err := migrationFS.ReadFile("migrations/" + name)
		if err != nil {
			panic(fmt.Sprintf("fluxhook: embedded migration %q unreadable: %v", name, err))
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// LatestVersion is the schema version this build of fluxhook needs.
func LatestVersion() int {
	m := Migrations()
	return m[len(m)-1].Version
}

// Script returns every migration as one transactional script for `psql -f`. Because each
// migration is idempotent and records its own version, running it on a database that is
// already partly or fully migrated is safe.
func Script() string {
	var b strings.Builder
	b.WriteString("-- fluxhook schema, version " + strconv.Itoa(LatestVersion()) + ". Apply with: psql -v ON_ERROR_STOP=1 -f FILE\n")
	b.WriteString("BEGIN;\n")
	b.WriteString("SELECT pg_advisory_xact_lock(" + strconv.FormatInt(migrateLockKey, 10) + ");\n\n")
	for _, m := range Migrations() {
		b.WriteString("-- " + m.Name + "\n")
		b.WriteString(m.SQL)
		b.WriteString("\n")
	}
	b.WriteString("COMMIT;\n")
	return b.String()
}

// Execer is the part of a pgx connection or pool that Migrate needs.
type Execer interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate applies the migrations the database lacks, in one transaction, under an advisory
// lock so that several instances starting at once apply each step exactly once. It returns the
// versions it applied (none when the schema was already current).
func Migrate(ctx context.Context, db Execer) ([]int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockKey); err != nil {
		return nil, fmt.Errorf("migrate: advisory lock: %w", err)
	}
	current, err := currentVersion(ctx, tx)
	if err != nil {
		return nil, err
	}
	var applied []int
	for _, m := range Migrations() {
		if m.Version <= current {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("migrate: applying %s: %w", m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrate: commit: %w", err)
	}
	return applied, nil
}

// Querier is the part of a pgx connection, pool or transaction that read-only checks need.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CurrentVersion reports the schema version installed in the database, 0 when fluxhook's
// schema is not installed at all.
func CurrentVersion(ctx context.Context, db Querier) (int, error) {
	return currentVersion(ctx, db)
}

func currentVersion(ctx context.Context, db Querier) (int, error) {
	// A look-up instead of catching undefined_table: inside Migrate's transaction an error
	// would abort the transaction. A query on pg_class rather than to_regclass: to_regclass
	// answers from the session's catalog cache, which taking an advisory lock does not
	// refresh, so an instance that waited for another's migration could still see no table
	// and apply every step again; the query reads the catalog with a snapshot taken after
	// the lock.
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (
		SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'webhook_schema_version' AND n.nspname = ANY (current_schemas(false)))`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := db.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM webhook_schema_version").Scan(&v); err != nil {
		return 0, fmt.Errorf("reading schema version: %w", err)
	}
	return v, nil
}

// ErrSchemaOutdated is returned by CheckCurrent when the database needs `fluxhook migrate`.
var ErrSchemaOutdated = errors.New("schema out of date")

// CheckCurrent returns nil when the installed schema is the one this build needs, and
// otherwise an error that tells the operator what to run.
func CheckCurrent(ctx context.Context, db Querier) error {
	v, err := CurrentVersion(ctx, db)
	if err != nil {
		return err
	}
	want := LatestVersion()
	switch {
	case v == want:
		return nil
	case v == 0:
		return fmt.Errorf("%w: fluxhook's schema is not installed in this database; run `fluxhook migrate` (or apply `fluxhook migrate --print` with psql) first", ErrSchemaOutdated)
	case v < want:
		return fmt.Errorf("%w: the database has schema version %d, this fluxhook needs %d; run `fluxhook migrate`", ErrSchemaOutdated, v, want)
	default:
		return fmt.Errorf("%w: the database has schema version %d, newer than this fluxhook's %d; upgrade fluxhook", ErrSchemaOutdated, v, want)
	}
}
