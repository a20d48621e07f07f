package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/settle"
)

// recorderInstance is the part of a dispatcher the outcome recorder uses, running: a pool
// with the dispatcher's session settings (deadlock_timeout as given, application_name name),
// a log and a settler.
func recorderInstance(t *testing.T, db *sqltest.DB, name, deadlockTimeout string) *Dispatcher {
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
	core, _ := observer.New(zap.WarnLevel)
	d := &Dispatcher{pool: pool, log: zap.New(core), settler: settle.New(pool, settle.Config{InstanceID: name})}
	d.outcomes = newOutcomeRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	go d.recordOutcomes(ctx)
	t.Cleanup(func() {
		close(d.outcomes.done)
		<-d.outcomes.ended
		cancel()
	})
	return d
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
	a := recorderInstance(t, db, "recorder-a", "100ms") // A would be the deadlock's victim
	b := recorderInstance(t, db, "recorder-b", "10s")
	op, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = op.Rollback(ctx) }()
	if _, err := op.Exec(ctx, `SELECT 1 FROM webhook_endpoints WHERE id IN ($1, $2) FOR UPDATE`, e1, e2); err != nil {
		t.Fatal(err)
	}
	// A settled e1's 410, then e2's failure; B e2's failure, then e1's.
	a.outcomes.add([]string{e1, e2}, []int16{3, 2})
	b.outcomes.add([]string{e2, e1}, []int16{2, 2})
	pollUntil(t, ctx, "both records waiting for the transaction", func() bool {
		var waiting int
		// Blocked by the transaction, or by the other record queued for the same row first.
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name LIKE 'recorder-%' AND cardinality(pg_blocking_pids(pid)) > 0`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting == 2
	})
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
	r.add([]string{"c", "a", "b"}, []int16{1, 3, 2})
	ids, results := r.take()
	if want := []string{"a", "b", "c"}; len(ids) != 3 || ids[0] != want[0] || ids[1] != want[1] || ids[2] != want[2] {
		t.Fatalf("take gave %v, want the ids in order %v", ids, want)
	}
	r.add([]string{"a", "b"}, []int16{1, 1}) // newer: a succeeded, b succeeded
	r.putBack(ids, results)
	ids, results = r.take()
	got := map[string]int16{}
	for i, id := range ids {
		got[id] = results[i]
	}
	if got["a"] != 3 || got["b"] != 1 || got["c"] != 1 || len(got) != 3 {
		t.Errorf("after the put back: %v, want a's 410 kept, b's newer success, c's success back", got)
	}
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
