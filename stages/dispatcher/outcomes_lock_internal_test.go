package dispatcher

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/settle"
)

// recorderInstance is the part of a dispatcher the outcome recorder and disableStale use, the
// recorder running: a pool with the dispatcher's session settings (deadlock_timeout as given,
// application_name name), a log kept from Warn up, a settler and an hour's disable-after.
func recorderInstance(t *testing.T, db *sqltest.DB, name, deadlockTimeout string) (*Dispatcher, *observer.ObservedLogs) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	SessionParams(cfg.ConnConfig.RuntimeParams, false)
	cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = deadlockTimeout
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	core, logs := observer.New(zap.WarnLevel)
	d := &Dispatcher{pool: pool, log: zap.New(core), settler: settle.New(pool, settle.Config{InstanceID: name})}
	d.cfg.EndpointDisableAfter = time.Hour
	d.outcomes = newOutcomeRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	go d.recordOutcomes(ctx)
	t.Cleanup(func() {
		close(d.outcomes.done)
		<-d.outcomes.ended
		cancel()
	})
	return d, logs
}

// TestOutcomeRecordsOfTwoInstancesNeverDeadlock: two instances record outcomes of the same two
// endpoints, each in the order its batches saw them, both held up by a transaction on both
// rows. Taken in those orders, the rows deadlocked once the transaction ended, and the aborted
// record was dropped: instance A's 410 never disabled e1. The rows are locked in id order, and
// a record refused for a passing reason is tried again.
func TestOutcomeRecordsOfTwoInstancesNeverDeadlock(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const e1, e2 = "22222222-2222-4222-8222-222222222222", "11111111-1111-4111-8111-111111111111"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, url, secret) VALUES
		($1, 'http://127.0.0.1:9/one', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw'),
		($2, 'http://127.0.0.1:9/two', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')`, e1, e2); err != nil {
		t.Fatal(err)
	}
	a, _ := recorderInstance(t, db, "recorder-a", "100ms") // A would be the deadlock's victim
	b, _ := recorderInstance(t, db, "recorder-b", "10s")
	op, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = op.Rollback(ctx) }()
	if _, err := op.Exec(ctx, `SELECT 1 FROM webhook_endpoints WHERE id IN ($1, $2) FOR UPDATE`, e1, e2); err != nil {
		t.Fatal(err)
	}
	// A settled e1's 410, then e2's failure; B e2's failure, then e1's.
	one, two := endpointOutcome{id: e1, url: "http://127.0.0.1:9/one"}, endpointOutcome{id: e2, url: "http://127.0.0.1:9/two"}
	at := func(o endpointOutcome, result int16) endpointOutcome { o.result = result; return o }
	a.outcomes.add([]endpointOutcome{at(one, 3), at(two, 2)})
	b.outcomes.add([]endpointOutcome{at(two, 2), at(one, 2)})
	// Blocked by the transaction, or by the other record queued for the same row first.
	pollUntil(t, ctx, "both records waiting for the transaction", func() bool { return blocked(t, ctx, db, "recorder-%") == 2 })
	if err := op.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, ctx, "e1 disabled for its 410 and both endpoints failing", func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE id = $1 AND NOT enabled AND disabled_reason LIKE '%410%')
			+ count(*) FILTER (WHERE id = $2 AND enabled AND failing_since IS NOT NULL) FROM webhook_endpoints`, e1, e2).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 2
	})
}

// TestOutcomeRecorderPutsBackWhatFailed: outcomes a failed record took go back under those
// that came meanwhile, which are newer and replace them, except a 410, which stays.
func TestOutcomeRecorderPutsBackWhatFailed(t *testing.T) {
	r := newOutcomeRecorder()
	r.add(outcomesOf("c", 1, "a", 3, "b", 2))
	taken := r.take()
	if ids := []string{taken[0].id, taken[1].id, taken[2].id}; !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Fatalf("take gave %v, want the ids in order", ids)
	}
	r.add(outcomesOf("a", 1, "b", 1)) // newer: a succeeded, b succeeded
	r.putBack(taken)
	if got, want := r.take(), outcomesOf("a", 3, "b", 1, "c", 1); !slices.Equal(got, want) {
		t.Errorf("after the put back: %v, want a's 410 kept, b's newer success, c's success back", got)
	}
}

// TestOutcomeRecordedOnlyWhereItWasSaid: a 410 recorded after the endpoint was changed (the
// record waited for its row while an operator moved it to a new URL and another tenant) does
// not disable the endpoint as it is now, nor does a success date the new tenant's health.
func TestOutcomeRecordedOnlyWhereItWasSaid(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const e1, e2 = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, url, secret, tenant) VALUES
		($1, 'http://127.0.0.1:9/old', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'acme'),
		($2, 'http://127.0.0.1:9/two', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'acme')`, e1, e2); err != nil {
		t.Fatal(err)
	}
	a, _ := recorderInstance(t, db, "recorder-where", "1s")
	op, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = op.Rollback(ctx) }()
	if _, err := op.Exec(ctx, `UPDATE webhook_endpoints SET url = CASE WHEN id = $1 THEN 'http://127.0.0.1:9/new' ELSE url END,
		tenant = 'globex' WHERE id IN ($1, $2)`, e1, e2); err != nil {
		t.Fatal(err)
	}
	acme := "acme"
	a.outcomes.add([]endpointOutcome{{id: e1, result: 3, url: "http://127.0.0.1:9/old", tenant: &acme},
		{id: e2, result: 1, url: "http://127.0.0.1:9/two", tenant: &acme}})
	pollUntil(t, ctx, "the record waiting for the change", func() bool { return blocked(t, ctx, db, "recorder-where") == 1 })
	if err := op.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, ctx, "the record done", func() bool {
		var busy int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'recorder-where' AND state = 'active'`).Scan(&busy); err != nil {
			t.Fatal(err)
		}
		a.outcomes.mu.Lock()
		left := len(a.outcomes.pending)
		a.outcomes.mu.Unlock()
		return busy == 0 && left == 0
	})
	var enabled, dated bool
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT enabled FROM webhook_endpoints WHERE id = $1),
		(SELECT last_success_at IS NOT NULL FROM webhook_endpoints WHERE id = $2)`, e1, e2).Scan(&enabled, &dated); err != nil {
		t.Fatal(err)
	}
	if !enabled {
		t.Error("the endpoint, moved to a new URL and tenant, was disabled for its old URL's 410")
	}
	if dated {
		t.Error("the endpoint moved to globex shows the success of acme's delivery")
	}
}

// TestOutcomeRecordNeverDeadlocksWithDisableStale: a success recorded for two failing
// endpoints while the housekeeping disables them: both lock the rows in the order of their
// ids. disableStale locked them in its plan's order (the tenant index), and the two deadlocked.
func TestOutcomeRecordNeverDeadlocksWithDisableStale(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const e1, e2 = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
	// e2 first in the heap and in the tenant index: a plan's scan locks e2 first.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, url, secret, tenant, failing_since) VALUES
		($2, 'http://127.0.0.1:9/two', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'alpha', now() - interval '2 hours'),
		($1, 'http://127.0.0.1:9/one', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'zeta', now() - interval '2 hours')`, e1, e2); err != nil {
		t.Fatal(err)
	}
	rec, recLogs := recorderInstance(t, db, "recorder-rec", "100ms")
	dis, disLogs := recorderInstance(t, db, "recorder-dis", "1s")
	op, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = op.Rollback(ctx) }()
	if _, err := op.Exec(ctx, `SELECT 1 FROM webhook_endpoints WHERE id = $1 FOR UPDATE`, e1); err != nil {
		t.Fatal(err)
	}
	waiting := func(name string) func() bool { return func() bool { return blocked(t, ctx, db, name) == 1 } }
	zeta, alpha := "zeta", "alpha"
	rec.outcomes.add([]endpointOutcome{{id: e2, result: 1, url: "http://127.0.0.1:9/two", tenant: &alpha},
		{id: e1, result: 1, url: "http://127.0.0.1:9/one", tenant: &zeta}})
	pollUntil(t, ctx, "the record waiting", waiting("recorder-rec"))
	done := make(chan struct{})
	go func() { dis.disableStale(ctx); close(done) }()
	pollUntil(t, ctx, "disableStale waiting", waiting("recorder-dis"))
	if err := op.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	pollUntil(t, ctx, "the record written", func() bool {
		rec.outcomes.mu.Lock()
		defer rec.outcomes.mu.Unlock()
		return len(rec.outcomes.pending) == 0 && !waiting("recorder-rec")()
	})
	for _, l := range append(recLogs.All(), disLogs.All()...) {
		if err, ok := l.ContextMap()["error"].(string); ok && strings.Contains(err, "40P01") {
			t.Errorf("deadlock between the outcome recorder and disableStale: %q: %v", l.Message, err)
		}
	}
}

// blocked counts the sessions whose application_name is LIKE name that wait for a lock.
func blocked(t *testing.T, ctx context.Context, db *sqltest.DB, name string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name LIKE $1 AND cardinality(pg_blocking_pids(pid)) > 0`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// pollUntil checks cond every 20 ms until it holds, failing t when ctx ends first.
func pollUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestOutcomeRecorderEndsWithTheDatabaseGone: with the database unreachable, Stop's last
// record is tried a few times, then given up with a warning: a Stop whose context has no
// deadline (a program embedding the dispatcher) must still return.
func TestOutcomeRecorderEndsWithTheDatabaseGone(t *testing.T) {
	t.Parallel()
	// Loopback, a port nothing listens on: refused at once.
	pool, err := pgxpool.New(context.Background(), "postgres://root@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	core, logs := observer.New(zap.WarnLevel)
	d := &Dispatcher{pool: pool, log: zap.New(core)}
	d.outcomes = newOutcomeRecorder()
	go d.recordOutcomes(context.Background())
	d.outcomes.add(outcomesOf("11111111-1111-4111-8111-111111111111", 2))
	close(d.outcomes.done)
	select {
	case <-d.outcomes.ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the recorder had not ended 30 s after Stop, the database unreachable")
	}
	if logs.FilterMessage("endpoint outcomes not recorded at shutdown").Len() != 1 {
		t.Errorf("no warning that the last outcomes were given up: %v", logs.All())
	}
}
