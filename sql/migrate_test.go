package sql_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// holdOutboxLock opens a producer's transaction that inserted a row into webhook_outbox and
// stays open: it holds ROW EXCLUSIVE on the table until committed, which conflicts with the
// ACCESS EXCLUSIVE lock of ALTER TABLE and DROP TRIGGER. It returns the transaction and its
// session's pid; the transaction is rolled back at cleanup if still open.
func holdOutboxLock(t *testing.T, db *sqltest.DB) (pgx.Tx, int32) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('long.transaction', '{}')`); err != nil {
		t.Fatal(err)
	}
	return tx, int32(conn.PgConn().PID())
}

// producer inserts into webhook_outbox from its own sessions, one row at a time, until stop
// is called, which returns how many rows it inserted and the longest an insert took.
func producer(t *testing.T, db *sqltest.DB) (stop func() (n int, longest time.Duration)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var n int
	var longest time.Duration
	var insertErr error
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			start := time.Now()
			_, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('producer', '{}')`)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				insertErr = err
				return
			}
			n++
			longest = max(longest, time.Since(start))
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return func() (int, time.Duration) {
		cancel()
		<-done
		if insertErr != nil {
			t.Fatalf("producer's insert: %v", insertErr)
		}
		return n, longest
	}
}

// TestMigrateGivesUpBehindLongTransaction: a long producer transaction holds a lock on
// webhook_outbox for the whole migration. Migrate must give up after its attempts, each bounded
// by the lock timeout, with an error that names the blocking transaction and says what to do,
// having changed nothing; and the other producers' inserts, which queue behind a migration
// waiting for its lock, must each have waited no longer than about one lock timeout, not the
// whole migration.
func TestMigrateGivesUpBehindLongTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigratedTo(t, 4)
	_, holderPID := holdOutboxLock(t, db)
	stopProducer := producer(t, db)

	const lockTimeout = time.Second
	opts := fluxsql.MigrateOptions{LockTimeout: lockTimeout, Attempts: 3, Backoff: 200 * time.Millisecond}
	var retries []int
	opts.OnLockTimeout = func(attempt int, pause time.Duration, err error) { retries = append(retries, attempt) }
	start := time.Now()
	applied, err := fluxsql.MigrateWith(ctx, db.Pool, opts)
	elapsed := time.Since(start)
	inserted, longest := stopProducer()

	if err == nil {
		t.Fatalf("migrate behind a long transaction applied %v", applied)
	}
	t.Logf("after %s, the error: %v", elapsed, err)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Errorf("error %v does not wrap the lock timeout (SQLSTATE 55P03)", err)
	}
	for _, want := range []string{
		"gave up after 3 attempts",
		"a long transaction holds a lock on webhook_outbox",
		fmt.Sprintf("pid %d", holderPID),
		"idle in transaction",
		"migrations need a brief exclusive lock",
		"retry when that transaction has ended",
		fmt.Sprintf("pg_terminate_backend(%d)", holderPID),
		"--lock-timeout",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q:\n%v", want, err)
		}
	}
	if !slices.Equal(retries, []int{1, 2}) {
		t.Errorf("OnLockTimeout called for attempts %v, want [1 2]", retries)
	}
	// Three waits of the lock timeout and two pauses; the upper bound leaves room for a loaded
	// machine but not for a wait without a bound.
	if min := 3 * lockTimeout; elapsed < min || elapsed > min+10*time.Second {
		t.Errorf("migrate gave up after %s, want three lock timeouts (%s) and two short pauses", elapsed, min)
	}
	if longest > lockTimeout+time.Second {
		t.Errorf("an insert waited %s behind the migration, want at most about the lock timeout (%s)", longest, lockTimeout)
	}
	if inserted < 10 {
		t.Errorf("the producer inserted %d rows in the %s the migration tried, want it not held up", inserted, elapsed)
	}
	if v, err := fluxsql.CurrentVersion(ctx, db.Pool); err != nil || v != 4 {
		t.Errorf("schema version %d, %v after giving up; want 4, unchanged", v, err)
	}
}

// TestMigrateRetriesUntilLockIsReleased: the long transaction ends after the first attempt
// timed out; a later attempt gets the lock and migrates, keeping that transaction's row.
func TestMigrateRetriesUntilLockIsReleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigratedTo(t, 4)
	holder, _ := holdOutboxLock(t, db)

	timedOut := make(chan struct{})
	var once sync.Once
	opts := fluxsql.MigrateOptions{
		LockTimeout: 300 * time.Millisecond,
		Attempts:    5,
		Backoff:     100 * time.Millisecond,
		OnLockTimeout: func(attempt int, pause time.Duration, err error) {
			once.Do(func() { close(timedOut) })
		},
	}
	type result struct {
		applied []int
		err     error
	}
	done := make(chan result, 1)
	go func() {
		applied, err := fluxsql.MigrateWith(ctx, db.Pool, opts)
		done <- result{applied, err}
	}()
	select {
	case <-timedOut:
	case r := <-done:
		t.Fatalf("migrate returned %v, %v before any lock timeout", r.applied, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("no lock timeout within 30 s")
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("migrate did not finish within 30 s of the lock's release")
	}
	var want []int
	for v := 5; v <= fluxsql.LatestVersion(); v++ {
		want = append(want, v)
	}
	if r.err != nil || !slices.Equal(r.applied, want) {
		t.Fatalf("migrate after the lock was released = %v, %v; want %v", r.applied, r.err, want)
	}
	if err := fluxsql.CheckCurrent(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE event_type = 'long.transaction'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the long transaction's row: %d, %v; want it kept", n, err)
	}
}

// TestMigrateWaitsForAnotherMigrationBeyondLockTimeout: the lock timeout bounds waits for
// table locks only. An instance that waits for another's migration (the advisory lock) longer
// than the lock timeout keeps waiting, then finds the work done, as before.
func TestMigrateWaitsForAnotherMigrationBeyondLockTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.New(t)
	other, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, "SELECT pg_advisory_lock($1)", fluxsql.MigrateLockKey); err != nil {
		t.Fatal(err)
	}
	const lockTimeout = 200 * time.Millisecond
	done := make(chan error, 1)
	go func() {
		_, err := fluxsql.MigrateWith(ctx, db.Pool, fluxsql.MigrateOptions{LockTimeout: lockTimeout, Attempts: 1})
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := other.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("migrate returned %v while another migration held the advisory lock", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("migrate never waited for the advisory lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The wait has to outlast the lock timeout: a bare sleep is the point here.
	time.Sleep(5 * lockTimeout)
	select {
	case err := <-done:
		t.Fatalf("migrate returned %v while another migration held the advisory lock", err)
	default:
	}
	if _, err := other.Exec(ctx, "SELECT pg_advisory_unlock($1)", fluxsql.MigrateLockKey); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("migrate after waiting for another migration: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("migrate did not finish within 30 s of the advisory lock's release")
	}
}

// TestScriptSetsLockTimeout: the psql script bounds its lock waits too. Applied behind a long
// transaction, psql stops with the lock timeout within about that timeout, having changed
// nothing, and the advisory lock comes before the bound.
func TestScriptSetsLockTimeout(t *testing.T) {
	t.Parallel()
	script := fluxsql.Script()
	lock := strings.Index(script, "SELECT pg_advisory_xact_lock(")
	set := strings.Index(script, "SET LOCAL lock_timeout = '5s';")
	first := strings.Index(script, "-- 0001_")
	if lock < 0 || set < lock || first < set {
		t.Fatalf("the script does not set lock_timeout = '5s' after its advisory lock and before the migrations:\n%.800s", script)
	}
	if s := fluxsql.ScriptWith(fluxsql.MigrateOptions{LockTimeout: 1500 * time.Millisecond}); !strings.Contains(s, "SET LOCAL lock_timeout = '1500ms';") {
		t.Error("ScriptWith(1.5 s) does not set lock_timeout = '1500ms'")
	}
	if s := fluxsql.ScriptWith(fluxsql.MigrateOptions{LockTimeout: -1}); !strings.Contains(s, "SET LOCAL lock_timeout = '0';") {
		t.Error("ScriptWith(no bound) does not set lock_timeout = '0'")
	}

	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql not installed")
	}
	db := sqltest.NewMigratedTo(t, 4)
	holdOutboxLock(t, db)
	const lockTimeout = 500 * time.Millisecond
	file := filepath.Join(t.TempDir(), "fluxhook.sql")
	if err := os.WriteFile(file, []byte(fluxsql.ScriptWith(fluxsql.MigrateOptions{LockTimeout: lockTimeout})), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db.URL, "-f", file).CombinedOutput()
	elapsed := time.Since(start)
	if err == nil {
		t.Fatalf("psql -f behind a long transaction succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "lock timeout") {
		t.Errorf("psql's output does not name the lock timeout:\n%s", out)
	}
	if elapsed > lockTimeout+10*time.Second {
		t.Errorf("psql gave up after %s, want about the lock timeout (%s)", elapsed, lockTimeout)
	}
	if v, err := fluxsql.CurrentVersion(context.Background(), db.Pool); err != nil || v != 4 {
		t.Errorf("schema version %d, %v; want 4, unchanged", v, err)
	}
}
