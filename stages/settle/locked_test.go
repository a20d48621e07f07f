package settle_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/deadletters"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/settle"
)

// lockRows opens a transaction on its own connection that holds rows ids of the outbox locked
// (an operator's forgotten SELECT ... FOR UPDATE) until the returned function ends it; pid is
// that connection's backend.
func lockRows(t *testing.T, db *sqltest.DB, ids ...int64) (release func(), pid uint32) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := tx.Exec(ctx, `SELECT 1 FROM webhook_outbox WHERE id = ANY ($1) FOR UPDATE`, ids)
	if err != nil || tag.RowsAffected() != int64(len(ids)) {
		t.Fatalf("locking rows %v: %v (%d locked)", ids, err, tag.RowsAffected())
	}
	done := false
	release = func() {
		if !done {
			done = true
			_ = tx.Rollback(ctx)
			_ = conn.Close(ctx)
		}
	}
	t.Cleanup(release)
	return release, conn.PgConn().PID()
}

// TestSettleLeavesARowLockedElsewhere: a row that a session outside fluxhook holds locked
// while it is in flight no longer stalls the settle (and so every settle of the instance) for
// as long as that session lasts: the rest of the batch is settled, the locked row is reported
// unsettled, its outcome not written, and it stays leased, to come back after its lease.
func TestSettleLeavesARowLockedElsewhere(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	rows := leased(t, db, "e", 3)
	for _, r := range rows {
		r.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	}
	rows[2].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503, Error: "HTTP 503"}
	release, lockerPID := lockRows(t, db, rows[1].ID)
	defer release()

	// Without the bound the settle waits for the lock for ever: the deadline fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := s.Settle(ctx, rows)
	if err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if res.Settled != 2 || res.Requeued != 1 || res.Unsettled != 1 {
		t.Errorf("result %+v, want 2 settled (one a retry) and the locked row unsettled", res)
	}
	if !rows[1].Outcome.Unsettled || !strings.Contains(rows[1].Outcome.Reason, "locked by another session") ||
		!strings.Contains(rows[1].Outcome.Reason, fmt.Sprintf("held by pid %d,", lockerPID)) {
		t.Errorf("the locked row's outcome: unsettled %v, reason %q; want unsettled, saying it was locked",
			rows[1].Outcome.Unsettled, rows[1].Outcome.Reason)
	}
	if rows[0].Outcome.Unsettled || rows[2].Outcome.Unsettled {
		t.Error("a row nobody locked is reported unsettled")
	}
	release()
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE id = $1 AND leased_by = 'me' AND lease_token = $2 AND NOT processed`,
		rows[1].ID, myToken); n != 1 {
		t.Error("the locked row is no longer in the queue under its lease")
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE id = ANY ($1)`, []int64{rows[0].ID, rows[2].ID}); n != 2 {
		t.Errorf("%d of the 2 other rows in the delivery log", n)
	}
	// Once the session lets it go, the row settles as any other.
	rows[1].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	settleWant(context.Background(), t, s, rows[1:2], settle.Result{Settled: 1})
}

// TestSettleSkipsLockedRowsOfItsStream: the rows of a stream that a settle parks behind its
// head, or releases after it, are left as they are when another session holds them locked: the
// head's own outcome is written at once, not after that session ends.
func TestSettleSkipsLockedRowsOfItsStream(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	orderedEndpoint(t, db)
	// Stream s: a head retried, two rows waiting behind it (one locked). Stream t: a head
	// delivered, the row parked behind it locked.
	orderedRows(t, db, `
		(1000, 's', '`+parkedEP+`', 100, -5, NULL, false, true),
		(1001, 's', '`+parkedEP+`', 101, -4, NULL, false, true),
		(1002, 's', '`+parkedEP+`', 102, -3, NULL, false, true),
		(1100, 't', '`+parkedEP+`', 110, -5, NULL, false, true),
		(1101, 't', '`+parkedEP+`', 111, 600, 'behind its stream', false, true)`)
	retried := leasedHead(t, db, 1000, 100)
	retried.Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503, Error: "HTTP 503"}
	delivered := leasedHead(t, db, 1100, 110)
	delivered.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	release, _ := lockRows(t, db, 1001, 1101)
	defer release()

	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	res, err := s.Settle(ctx, []*delivery.Delivery{retried, delivered})
	if err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if res.Settled != 2 || res.Requeued != 1 || res.Unsettled != 0 || res.Fallback != 0 {
		t.Errorf("result %+v, want both heads settled by the batch statement", res)
	}
	if in, reason := dueIn(t, db, 1002); in < 55*time.Second || reason != behind {
		t.Errorf("the unlocked row behind the retried head: due in %s (%q), want parked with it", in, reason)
	}
	if in, reason := dueIn(t, db, 1001); in > 0 || reason != "" {
		t.Errorf("the locked row behind the retried head: due in %s (%q), want left due as it was", in, reason)
	}
	if in, reason := dueIn(t, db, 1101); in < 9*time.Minute || reason != behind {
		t.Errorf("the locked row parked behind the delivered head: due in %s (%q), want left parked", in, reason)
	}
}

// TestSettleStillWaitsForTheLogsMaintenance: the bound on row locks does not cut the waits for
// table locks, which the delivery log's maintenance makes settles queue behind on purpose
// (a SHARE lock while it creates the partition of now): a settle waiting longer than the
// bound for the log is written once the lock is gone, not left to its lease.
func TestSettleStillWaitsForTheLogsMaintenance(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	rows := leased(t, db, "e", 2)
	for _, r := range rows {
		r.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE ONLY webhook_delivery_log IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	type settled struct {
		res settle.Result
		err error
	}
	done := make(chan settled, 1)
	go func() {
		res, err := s.Settle(ctx, rows)
		done <- settled{res, err}
	}()
	// Until the settle has waited for the log's lock longer than the bound on row locks.
	for {
		var waited bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE $1 = ANY (pg_blocking_pids(pid)) AND wait_event_type = 'Lock' AND now() - state_change > interval '2 seconds')`,
			conn.PgConn().PID()).Scan(&waited); err != nil {
			t.Fatal(err)
		}
		if waited {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the settle ended (%+v, %v) while the log was locked, want it waiting", r.res, r.err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.res.Settled != 2 || r.res.Unsettled != 0 {
		t.Errorf("settle after the log's lock: %+v, %v; want both rows settled", r.res, r.err)
	}
}

// TestSettleWaitsOnceForManyLockedRows: with several rows of a batch held by one session
// outside fluxhook, the settle waits its bound once, not once per locked row in turn: the
// unlocked rows are written while their lease (here 5 s, what serve accepts for a short
// WEBHOOK_TIMEOUT_MS) still holds. Waiting a second per locked row let it run out: another
// instance claimed them again (simulated below as claim.sql takes a row whose lease ended),
// sent them twice, and this settle's outcomes were refused as stale.
func TestSettleWaitsOnceForManyLockedRows(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	const k = 8
	locked := leased(t, db, "locked", k)
	free := leased(t, db, "free", 2)
	ids := make([]int64, 0, k)
	for _, r := range locked {
		ids = append(ids, r.ID)
	}
	freeIDs := []int64{free[0].ID, free[1].ID}
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET lease_until = now() + interval '5 seconds' WHERE id = ANY ($1)`, freeIDs); err != nil {
		t.Fatal(err)
	}
	batch := append(append([]*delivery.Delivery{}, locked...), free...)
	for _, r := range batch {
		r.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	}
	release, _ := lockRows(t, db, ids...)
	defer release()

	settled := make(chan struct{})
	reclaimed := make(chan int64, 1)
	go func() {
		for {
			tag, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET leased_by = 'other', lease_token = 99,
				lease_until = now() + interval '1 minute' WHERE id = ANY ($1) AND lease_until < now()`, freeIDs)
			if err == nil && tag.RowsAffected() > 0 {
				reclaimed <- tag.RowsAffected()
				return
			}
			select {
			case <-settled:
				reclaimed <- 0
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	res, err := s.Settle(ctx, batch)
	close(settled)
	if err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if n := <-reclaimed; n > 0 {
		t.Errorf("%d unlocked rows' leases ran out while the settle waited for the locked ones", n)
	}
	if res.Settled != 2 || res.Stale != 0 || res.Unsettled != k {
		t.Errorf("result %+v, want the 2 unlocked rows settled and the %d locked ones unsettled", res, k)
	}
	for _, r := range locked {
		if !r.Outcome.Unsettled || !strings.Contains(r.Outcome.Reason, "locked by another session") {
			t.Errorf("locked row %d: unsettled %v, reason %q", r.ID, r.Outcome.Unsettled, r.Outcome.Reason)
		}
	}
}

// TestSettleAnchoredLeavesLockedEventsToTheirLease: events routed in memory whose rows a
// session outside fluxhook holds locked are left to their lease (Failed, saying so), after one
// wait of the bound, and the other events of the batch are written.
func TestSettleAnchoredLeavesLockedEventsToTheirLease(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	evs := leased(t, db, "e", 3)
	eps := anchoredEndpoints(t, db, 1)
	var batch []settle.Anchored
	for i, ev := range evs {
		batch = append(batch, settle.Anchored{EventID: ev.ID, LeaseToken: myToken, NewToken: int64(300 + i), Endpoints: 1,
			Delivered: []*delivery.Delivery{delivered(eps[0])}})
	}
	release, _ := lockRows(t, db, evs[0].ID, evs[2].ID)
	defer release()
	res, err := s.SettleAnchored(ctx, batch, time.Minute)
	if err != nil {
		t.Fatalf("SettleAnchored: %v", err)
	}
	if !res.Written[301] || res.Written[300] || res.Written[302] {
		t.Errorf("written %v, want the unlocked event 301 alone", res.Written)
	}
	for _, nt := range []int64{300, 302} {
		if err := res.Failed[nt]; err == nil || !strings.Contains(err.Error(), "locked by another session") {
			t.Errorf("locked event %d: failed with %v, want left to its lease, saying it was locked", nt, err)
		}
	}
	release()
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE id = ANY ($1) AND leased_by = 'me' AND lease_token = $2`,
		[]int64{evs[0].ID, evs[2].ID}, myToken); n != 2 {
		t.Errorf("%d of the 2 locked events still in the queue under their lease", n)
	}
}

// TestSettleOfAStreamBeingReplayedGoesOn: a dead-letter replay that rejoins an ordered stream
// holds the stream's later rows locked until it commits (a recovery batch, a filtered replay
// of many rows), but not a row in flight: its delivered settle is written at once, instead of
// waiting out its bound and being left to its lease, to be sent again.
func TestSettleOfAStreamBeingReplayedGoesOn(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	orderedEndpoint(t, db)
	var dl int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_dead_letter
		(delivery_id, stream_id, event_type, payload, attempts, reason, enqueued_at, endpoint_id, order_key)
		VALUES (gen_random_uuid(), 's', 'e', '{}', 3, 'retries exhausted', now() - interval '1 minute', $1, 1)
		RETURNING id`, parkedEP).Scan(&dl); err != nil {
		t.Fatal(err)
	}
	orderedRows(t, db, `(2, 's', '`+parkedEP+`', 2, -1, NULL, false, true), (3, 's', '`+parkedEP+`', 3, -1, NULL, false, true)`)
	head := leasedHead(t, db, 2, 2)
	head.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if out, err := deadletters.Replay(ctx, tx, deadletters.Selection{IDs: []int64{dl}}, deadletters.Options{}); err != nil || len(out.Replayed) != 1 {
		t.Fatalf("replay: %+v, %v", out, err)
	}
	// The replay's transaction is still open.
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	res, err := s.Settle(ctx, []*delivery.Delivery{head})
	if err != nil || res.Settled != 1 || head.Outcome.Unsettled {
		t.Errorf("the delivered head's settle during a replay of its stream: %+v, %v (reason %q); want it settled",
			res, err, head.Outcome.Reason)
	}
	// The row that is not in flight is still held for the replay: a claim passes over it.
	var held bool
	if err := db.Pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM webhook_outbox WHERE id = 3 FOR UPDATE SKIP LOCKED)`).Scan(&held); err != nil || !held {
		t.Errorf("row 3, waiting behind the replayed event: held %v, %v; want it locked until the replay commits", held, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
