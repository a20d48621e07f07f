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
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// DefaultLockTimeout, DefaultLockAttempts and DefaultLockBackoff are how Migrate waits for the
// table locks its migrations take, unless MigrateOptions says otherwise.
const (
	DefaultLockTimeout  = 5 * time.Second
	DefaultLockAttempts = 4
	DefaultLockBackoff  = 2 * time.Second
)

// MigrateOptions tunes how MigrateWith waits for locks.
//
// Most migrations change webhook_outbox (ALTER TABLE, CREATE and DROP TRIGGER, CREATE INDEX),
// which needs a lock that conflicts with the one every producer's INSERT takes. PostgreSQL
// queues lock requests: while a migration waits for its lock behind a long producer
// transaction, every new INSERT waits behind the migration. Unbounded, that wait would stop
// every producer for as long as the long transaction lasts. So each attempt waits at most
// LockTimeout for a lock, then rolls back (letting the queued inserts through), pauses and
// tries again.
type MigrateOptions struct {
	// LockTimeout bounds each wait for a lock on a table (PostgreSQL's lock_timeout, set for
	// the migration's transaction only). It does not apply to the advisory lock that orders
	// concurrent migrations, whose waiters hold no lock on any table. Zero means
	// DefaultLockTimeout; a negative value, no bound (wait as long as it takes).
	LockTimeout time.Duration
	// Attempts is how many times the migration is tried in all while lock waits time out.
	// Zero means DefaultLockAttempts.
	Attempts int
	// Backoff is the pause after the first attempt that timed out, doubled after each further
	// one. Zero means DefaultLockBackoff.
	Backoff time.Duration
	// OnLockTimeout, when set, is called after an attempt timed out and was rolled back, before
	// the pause: for a command to say why it seems to do nothing.
	OnLockTimeout func(attempt int, pause time.Duration, err error)
}

func (o MigrateOptions) withDefaults() MigrateOptions {
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.Attempts <= 0 {
		o.Attempts = DefaultLockAttempts
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultLockBackoff
	}
	return o
}

// lockTimeoutSetting is d as a value of lock_timeout: whole seconds when it is, otherwise
// milliseconds (rounded up, since 0 would mean no bound), and 0 (no bound) when negative.
func lockTimeoutSetting(d time.Duration) string {
	switch {
	case d < 0:
		return "0"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	default:
		return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10) + "ms"
	}
}

// Script returns every migration as one transactional script for `psql -f`, with lock_timeout
// at DefaultLockTimeout. Because each migration is idempotent and records its own version,
// running it on a database that is already partly or fully migrated is safe.
func Script() string { return ScriptWith(MigrateOptions{}) }

// ScriptWith is Script with opts.LockTimeout. The other options need a retry loop, which a
// psql script has not: it stops at the first lock timeout, having changed nothing.
func ScriptWith(opts MigrateOptions) string {
	opts = opts.withDefaults()
	timeout := lockTimeoutSetting(opts.LockTimeout)
	var b strings.Builder
	b.WriteString("-- fluxhook schema, version " + strconv.Itoa(LatestVersion()) + ". Apply with: psql \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -f FILE (psql ignores DATABASE_URL: pass it)\n")
	b.WriteString("--\n")
	b.WriteString("-- If it stops with \"canceling statement due to lock timeout\", a long transaction holds a\n")
	b.WriteString("-- lock on a table it changes (usually webhook_outbox: see pg_locks and pg_stat_activity),\n")
	b.WriteString("-- and nothing was changed: run it again once that transaction has ended. The migrations\n")
	b.WriteString("-- need a brief exclusive lock, and while one waits for it every producer's insert waits\n")
	b.WriteString("-- behind it, so each wait is bounded by lock_timeout.\n")
	b.WriteString("BEGIN;\n")
	// The advisory lock comes first and without a bound: a second run waits for the first to
	// finish, holding no lock on any table meanwhile. SET LOCAL: the bound ends with the
	// transaction, for whoever includes the script in a session of their own.
	b.WriteString("SELECT pg_advisory_xact_lock(" + strconv.FormatInt(migrateLockKey, 10) + ");\n")
	b.WriteString("SET LOCAL lock_timeout = '" + timeout + "';\n\n")
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

// Migrate is MigrateWith with the default options.
func Migrate(ctx context.Context, db Execer) ([]int, error) {
	return MigrateWith(ctx, db, MigrateOptions{})
}

// MigrateWith applies the migrations the database lacks, in one transaction, under an advisory
// lock so that several instances starting at once apply each step exactly once. It returns the
// versions it applied (none when the schema was already current).
//
// When a lock on a table is not granted within opts.LockTimeout, the attempt is rolled back and
// the migration tried again after a pause, up to opts.Attempts times in all; the error then
// names the transactions that hold locks on fluxhook's tables.
func MigrateWith(ctx context.Context, db Execer, opts MigrateOptions) ([]int, error) {
	opts = opts.withDefaults()
	pause := opts.Backoff
	for attempt := 1; ; attempt++ {
		applied, err := migrateOnce(ctx, db, opts.LockTimeout)
		if err == nil {
			return applied, nil
		}
		if !isLockTimeout(err) {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		if attempt >= opts.Attempts {
			return nil, lockTimeoutError(ctx, db, opts, attempt, err)
		}
		if opts.OnLockTimeout != nil {
			opts.OnLockTimeout(attempt, pause, err)
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("migrate: %w (while waiting to retry after: %v)", ctx.Err(), err)
		case <-timer.C:
		}
		pause *= 2
	}
}

// lockNotAvailable is the SQLSTATE of a lock wait that reached lock_timeout.
const lockNotAvailable = "55P03"

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == lockNotAvailable || pgErr.Code == deadlockDetected)
}

// deadlockDetected is the SQLSTATE of a transaction PostgreSQL chose to end to break a
// deadlock: a migration that locks rows and then a table (schema 21 rewrites dead letters
// before it locks the outbox) can meet a session that takes them the other way (a purge), and
// either may be ended. Retried like a lock wait that timed out: nothing was changed.
const deadlockDetected = "40P01"

// migrateOnce is one attempt: one transaction, rolled back on any error.
func migrateOnce(ctx context.Context, db Execer, lockTimeout time.Duration) ([]int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockKey); err != nil {
		return nil, fmt.Errorf("advisory lock: %w", err)
	}
	// After the advisory lock, which must not time out (see MigrateOptions.LockTimeout), and
	// local to the transaction, so that the pool's connection does not keep it.
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", lockTimeoutSetting(lockTimeout)); err != nil {
		return nil, fmt.Errorf("setting lock_timeout: %w", err)
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
			return nil, fmt.Errorf("applying %s: %w", m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return applied, nil
}

// lockHolder is a session, or a prepared transaction, that holds locks on fluxhook's tables.
type lockHolder struct {
	pid    *int32 // nil for a prepared transaction
	tables string
	state  *string  // nil, like the two below, where pg_stat_activity hides it from this role
	age    *float64 // seconds since its transaction began
	query  *string
}

// lockTimeoutError is the error of a migration whose every attempt timed out waiting for a
// lock: it names the transactions that hold locks on fluxhook's tables, the longest-running
// first, which the operator has to wait for or end. err is the last attempt's.
func lockTimeoutError(ctx context.Context, db Execer, opts MigrateOptions, attempts int, err error) error {
	holders := lockHolders(ctx, db, opts.LockTimeout)
	who := "a long transaction held a lock on fluxhook's tables (it has ended since, or this role may not see it in pg_locks)"
	end := "commit or roll it back"
	if len(holders) > 0 {
		who = "a long transaction holds a lock on " + holders[0].tables + " (" + describeHolder(holders[0], false)
		for _, h := range holders[1:] {
			who += "; also " + describeHolder(h, true)
		}
		who += ")"
		if holders[0].pid != nil {
			end += fmt.Sprintf(", or end its session with SELECT pg_terminate_backend(%d)", *holders[0].pid)
		}
	}
	return fmt.Errorf("migrate: gave up after %d attempts: %s; migrations need a brief exclusive lock on the tables they change, "+
		"and every new insert waits behind a migration waiting for one, so each attempt waited at most lock_timeout (%s); "+
		"nothing was changed; retry when that transaction has ended (%s), or with a longer --lock-timeout: %w",
		attempts, who, opts.LockTimeout, end, err)
}

// describeHolder describes h for lockTimeoutError, with the tables it holds locks on if
// withTables.
func describeHolder(h lockHolder, withTables bool) string {
	var b strings.Builder
	if h.pid == nil {
		b.WriteString("a prepared transaction (see pg_prepared_xacts)")
	} else {
		fmt.Fprintf(&b, "pid %d", *h.pid)
	}
	if withTables {
		fmt.Fprintf(&b, " on %s", h.tables)
	}
	if h.age != nil {
		fmt.Fprintf(&b, ", in a transaction for %s", time.Duration(*h.age*float64(time.Second)).Round(time.Second))
	}
	if h.state != nil && *h.state != "" {
		b.WriteString(", " + *h.state)
	}
	if h.query != nil && *h.query != "" {
		q := strings.Join(strings.Fields(*h.query), " ")
		if len(q) > 100 {
			q = q[:100] + "..."
		}
		fmt.Fprintf(&b, ", last statement %q", q)
	}
	return b.String()
}

// lockHolders lists, the longest-running first, the transactions that hold a lock on one of
// the webhook_ tables and began at least lockTimeout ago: what the migration's
// lock requests waited behind. Best effort: on any error it lists none.
func lockHolders(ctx context.Context, db Execer, lockTimeout time.Duration) []lockHolder {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `
		SELECT l.pid, string_agg(DISTINCT c.relname, ', '), a.state,
		       extract(epoch FROM now() - a.xact_start)::float8, a.query
		FROM pg_catalog.pg_locks l
		JOIN pg_catalog.pg_class c ON c.oid = l.relation
		JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.granted
		  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
		  AND l.pid IS DISTINCT FROM pg_backend_pid()
		  AND c.relkind IN ('r', 'p') AND c.relname LIKE 'webhook\_%'
		  AND n.nspname = ANY (current_schemas(false))
		  -- pg_locks and pg_stat_activity are read at slightly different moments: a session
		  -- whose short transaction ended in between shows a lock but no transaction, and was
		  -- named as the long one. Only a prepared transaction holds locks without a session.
		  AND (l.pid IS NULL OR a.xact_start <= now() - $1::bigint * interval '1 millisecond')
		GROUP BY l.pid, a.state, a.xact_start, a.query
		ORDER BY a.xact_start NULLS FIRST
		LIMIT 3`, max(lockTimeout.Milliseconds(), 0))
	if err != nil {
		return nil
	}
	holders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (lockHolder, error) {
		var h lockHolder
		err := row.Scan(&h.pid, &h.tables, &h.state, &h.age, &h.query)
		return h, err
	})
	if err != nil {
		return nil
	}
	return holders
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
