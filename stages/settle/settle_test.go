package settle_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/settle"
)

// myToken is the lease token of the claim that leased leased's rows.
const myToken = 7

// leased inserts n rows leased by "me" (with lease token myToken) and returns them as claimed
// deliveries.
func leased(t *testing.T, db *sqltest.DB, eventType string, n int) []*delivery.Delivery {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		INSERT INTO webhook_outbox (event_type, payload, lease_until, leased_by, lease_token)
		SELECT $1, '{}', now() + interval '1 minute', 'me', $3 FROM generate_series(1, $2)
		RETURNING id, delivery_id::text, attempt`, eventType, n, myToken)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []*delivery.Delivery
	for rows.Next() {
		d := &delivery.Delivery{EventType: eventType, LeaseToken: myToken}
		if err := rows.Scan(&d.ID, &d.DeliveryID, &d.Attempt); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

func count(t *testing.T, db *sqltest.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func TestSettleWritesEveryKindInOneBatch(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	rows := leased(t, db, "e", 5)
	rows[0].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200, Duration: 12 * time.Millisecond}
	rows[1].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503, Error: "HTTP 503"}
	rows[2].Outcome = delivery.Outcome{Kind: delivery.Permanent, Status: 410, Error: "HTTP 410"}
	const deferral = 2345 * time.Millisecond // not a whole second, so a truncated delay shows
	rows[3].Outcome = delivery.Outcome{Kind: delivery.Defer, Delay: deferral, Reason: "circuit open"}
	rows[4].Outcome = delivery.Outcome{Kind: delivery.Release, Delay: 0}
	var before, after time.Time // the database's clock around the settle
	if err := db.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	res, err := s.Settle(context.Background(), rows)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	want := settle.Result{Settled: 3, Requeued: 1, DeadLettered: 1, Deferred: 1, Released: 1}
	if res != want {
		t.Fatalf("result %+v, want %+v", res, want)
	}
	// The retry is attempt 2 due in a minute.
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND attempt = 2 AND NOT processed
		AND created_at BETWEEN now() + interval '59 seconds' AND now() + interval '61 seconds'`, rows[1].DeliveryID); n != 1 {
		t.Fatal("retry row not due per the schedule")
	}
	// The deferral creates no row: the same row, attempt 1, unleased, moved to the deferral
	// time by the database's clock, with the reason on it.
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1`, rows[3].DeliveryID); n != 1 {
		t.Fatalf("a deferral left %d rows for its event, want its one row", n)
	}
	var due time.Time
	var reason string
	if err := db.Pool.QueryRow(context.Background(), `
		SELECT created_at, deferred_reason FROM webhook_deliveries
		WHERE id = $1 AND NOT processed AND attempt = 1 AND lease_until IS NULL AND leased_by IS NULL`,
		rows[3].ID).Scan(&due, &reason); err != nil {
		t.Fatalf("deferred row not pending, unleased, with its attempt: %v", err)
	}
	// Due exactly the deferral after the settle statement's now(), which lies between
	// before and after: a delay truncated to whole seconds would miss the window.
	if due.Before(before.Add(deferral)) || due.After(after.Add(deferral)) {
		t.Fatalf("deferred row due at %s, want the deferral (%s) after the settle, between %s and %s",
			due, deferral, before.Add(deferral), after.Add(deferral))
	}
	if reason != "circuit open" {
		t.Fatalf("deferred row's reason %q, want the gate's", reason)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1 AND last_status = 410`, rows[2].DeliveryID); n != 1 {
		t.Fatal("permanent failure not dead-lettered")
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND NOT processed AND lease_until <= now()`, rows[4].ID); n != 1 {
		t.Fatal("released row still leased")
	}
	// Settling the same outcomes again (a late duplicate after a lease expiry) changes nothing.
	again, err := s.Settle(context.Background(), rows[:4])
	if err != nil || again.Settled != 0 || again.Requeued != 0 || again.Deferred != 0 || again.Stale != 4 {
		t.Fatalf("second settle = %+v, %v; want no effect and every outcome stale", again, err)
	}
}

// TestBadRowDoesNotBlockTheBatch injects a row the database refuses to settle normally (an
// operator's constraint rejects its retry row): it is dead-lettered with the reason, and the
// other rows of the batch settle as usual.
func TestBadRowDoesNotBlockTheBatch(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE webhook_outbox ADD CONSTRAINT no_poison_retries
		CHECK (event_type <> 'poison' OR attempt < 2)`); err != nil {
		t.Fatal(err)
	}
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	good := leased(t, db, "good", 3)
	bad := leased(t, db, "poison", 1)[0]
	for _, d := range good {
		d.Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 500}
	}
	bad.Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 500}
	batch := []*delivery.Delivery{good[0], bad, good[1], good[2]}
	res, err := s.Settle(ctx, batch)
	if err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if res.Fallback != 4 || res.DeadLettered != 1 || res.Requeued != 3 {
		t.Fatalf("result %+v; want the batch settled row by row with one dead letter", res)
	}
	var reason string
	if err := db.Pool.QueryRow(ctx, `SELECT reason FROM webhook_dead_letter WHERE delivery_id = $1`, bad.DeliveryID).Scan(&reason); err != nil {
		t.Fatalf("bad row not dead-lettered: %v", err)
	}
	if !strings.Contains(reason, "no_poison_retries") {
		t.Fatalf("reason %q does not say what failed", reason)
	}
	if bad.Outcome.Kind != delivery.Permanent {
		t.Fatalf("bad row's outcome not updated to Permanent: %v", bad.Outcome.Kind)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE event_type = 'good' AND attempt = 2`); n != 3 {
		t.Fatalf("good rows' retries: %d, want 3", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE lease_until IS NOT NULL AND processed`); n != 0 {
		t.Fatalf("%d settled rows still leased", n)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	sched := []time.Duration{5 * time.Second, time.Minute, time.Hour}
	exact := settle.New(nil, settle.Config{Schedule: sched, Jitter: -1})
	for attempt, want := range map[int]time.Duration{1: 5 * time.Second, 2: time.Minute, 3: time.Hour} {
		if got := exact.Backoff(attempt, 0); got != want {
			t.Errorf("Backoff(%d) = %s, want %s", attempt, got, want)
		}
	}
	// Retry-After lengthens the wait, capped at the schedule's largest step.
	if got := exact.Backoff(1, 2*time.Minute); got != 2*time.Minute {
		t.Errorf("Retry-After 2m: %s", got)
	}
	if got := exact.Backoff(1, 48*time.Hour); got != time.Hour {
		t.Errorf("Retry-After 48h: %s, want capped at 1h", got)
	}
	if got := exact.Backoff(2, time.Second); got != time.Minute {
		t.Errorf("a shorter Retry-After must not shorten the schedule: %s", got)
	}
	jittered := settle.New(nil, settle.Config{Schedule: sched, Jitter: 0.2})
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := jittered.Backoff(2, 0)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 48*time.Second || hi > 72*time.Second || hi-lo < 10*time.Second {
		t.Fatalf("±20%% jitter of 1m spread over [%s, %s]", lo, hi)
	}
}

// TestTransientErrorsNeverDeadLetter makes the batch and the first per-row attempt fail with
// a serialization failure (transient, not about the row): nothing may be dead-lettered,
// neither the delivered row nor the retry; Settle reports an error and the rows stay leased
// for redelivery.
func TestTransientErrorsNeverDeadLetter(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE flaky (n int);
		INSERT INTO flaky VALUES (0);
		CREATE FUNCTION flaky_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			UPDATE flaky SET n = n + 1;
			IF (SELECT n FROM flaky) <= 3 THEN
				RAISE EXCEPTION 'transient' USING ERRCODE = '40001';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER flaky BEFORE INSERT ON webhook_delivery_log FOR EACH ROW EXECUTE FUNCTION flaky_update();`)
	if err != nil {
		t.Fatal(err)
	}
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	rows := leased(t, db, "e", 2)
	rows[0].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	rows[1].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503}
	// The retry first: before the fix it was dead-lettered after one attempt.
	if _, err := s.Settle(ctx, []*delivery.Delivery{rows[1], rows[0]}); err == nil {
		t.Fatal("Settle reported success although every statement failed")
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Fatalf("%d rows dead-lettered for a transient error", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE NOT processed AND lease_until > now()`); n != 2 {
		t.Fatalf("%d rows still leased, want 2 (redelivered after the lease)", n)
	}
}

// TestBadDeliveredRowDoesNotBlockTheBatch makes the database refuse to settle one delivered
// row (an operator's trigger), placed first so that an early return would leave every other
// row unsettled. The other rows of every kind must settle; the bad row is dead-lettered with a
// reason saying it was delivered when the database allows that, and is otherwise left leased
// and counted, without holding anything back.
func TestBadDeliveredRowDoesNotBlockTheBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// condition is the trigger's condition on the bad row's update, beyond its id.
		condition    string
		deadLettered bool
	}{
		// Only the normal settle writes duration_ms: the dead letter goes through.
		{"settle refused", "NEW.duration_ms IS NOT NULL", true},
		// Every update of the row is refused: it can only stay leased.
		{"every update refused", "true", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := sqltest.NewMigrated(t)
			ctx := context.Background()
			s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
			rows := leased(t, db, "e", 5)
			bad := rows[0]
			sqltest.RefuseSettles(t, db, `NEW.id = `+strconv.FormatInt(bad.ID, 10)+` AND (`+tc.condition+`)`)
			bad.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200, Duration: 5 * time.Millisecond}
			rows[1].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 204, Duration: 7 * time.Millisecond}
			rows[2].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503, Error: "HTTP 503"}
			rows[3].Outcome = delivery.Outcome{Kind: delivery.Permanent, Status: 410, Error: "HTTP 410"}
			rows[4].Outcome = delivery.Outcome{Kind: delivery.Release}
			res, err := s.Settle(ctx, rows)
			if err != nil {
				t.Fatalf("Settle: %v", err)
			}
			want := settle.Result{Settled: 3, Requeued: 1, DeadLettered: 1, Released: 1, Fallback: 5}
			if tc.deadLettered {
				want.Settled, want.DeadLettered = 4, 2
			} else {
				want.Unsettled = 1
			}
			if res != want {
				t.Fatalf("result %+v, want %+v", res, want)
			}
			// Every other row is settled as its outcome says.
			if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE id = ANY($1) AND processed AND lease_until IS NULL`,
				[]int64{rows[1].ID, rows[2].ID, rows[3].ID}); n != 3 {
				t.Fatalf("%d of the 3 other settled rows are processed", n)
			}
			if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND status_code = 204`, rows[1].ID); n != 1 {
				t.Fatal("the good delivered row was not marked with its status")
			}
			if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND attempt = 2 AND NOT processed`, rows[2].DeliveryID); n != 1 {
				t.Fatal("the retry after the bad row was not enqueued")
			}
			if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, rows[3].DeliveryID); n != 1 {
				t.Fatal("the permanent failure after the bad row was not dead-lettered")
			}
			if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND NOT processed AND lease_until <= now()`, rows[4].ID); n != 1 {
				t.Fatal("the released row after the bad row is still leased")
			}
			if !tc.deadLettered {
				if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND NOT processed AND lease_until > now()`, bad.ID); n != 1 {
					t.Fatal("the refused row is no longer leased; it must come back after its lease")
				}
				if !bad.Outcome.Unsettled || bad.Outcome.Kind != delivery.Delivered || !strings.Contains(bad.Outcome.Reason, "refused by the operator") {
					t.Fatalf("refused row's outcome = %+v, want still Delivered (for the breaker), marked Unsettled with the database's reason", bad.Outcome)
				}
				return
			}
			var reason string
			if err := db.Pool.QueryRow(ctx, `SELECT reason FROM webhook_dead_letter WHERE delivery_id = $1`, bad.DeliveryID).Scan(&reason); err != nil {
				t.Fatalf("bad delivered row not dead-lettered: %v", err)
			}
			if !strings.HasPrefix(reason, "settle failed: delivered (HTTP 200)") || !strings.Contains(reason, "refused by the operator") {
				t.Fatalf("reason %q does not say the row was delivered and why it failed", reason)
			}
			if bad.Outcome.Kind != delivery.Permanent || bad.Outcome.Reason != reason {
				t.Fatalf("bad row's outcome %+v not updated to the dead letter", bad.Outcome)
			}
			if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND processed AND lease_until IS NULL`, bad.ID); n != 1 {
				t.Fatal("dead-lettered row still pending")
			}
		})
	}
}

// TestStaleSettleIsRefused: an instance whose lease ran out while its attempt was slow, and
// whose row another claim took (another instance, or this one again with a new token), gets
// every kind of outcome refused: nothing is written, the current holder's lease stands, and
// the outcome is marked stale.
func TestStaleSettleIsRefused(t *testing.T) {
	t.Parallel()
	for _, holder := range []struct {
		name  string
		by    string
		token int64
	}{
		{"another instance", "peer", myToken},
		{"a later claim of this instance", "me", myToken + 1},
	} {
		t.Run(holder.name, func(t *testing.T) {
			t.Parallel()
			db := sqltest.NewMigrated(t)
			ctx := context.Background()
			s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
			rows := leased(t, db, "e", 6)
			rows[0].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
			rows[1].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503}
			rows[2].Outcome = delivery.Outcome{Kind: delivery.Permanent, Status: 410}
			rows[3].Outcome = delivery.Outcome{Kind: delivery.Defer, Delay: time.Minute, Reason: "retry rate limit"}
			rows[4].Outcome = delivery.Outcome{Kind: delivery.Release}
			rows[5].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200} // still ours
			ids := []int64{rows[0].ID, rows[1].ID, rows[2].ID, rows[3].ID, rows[4].ID}
			if _, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET leased_by = $2, lease_token = $3,
				lease_until = now() + interval '1 minute' WHERE id = ANY ($1)`, ids, holder.by, holder.token); err != nil {
				t.Fatal(err)
			}
			settleWant(ctx, t, s, rows, settle.Result{Settled: 1, Stale: 5})
			for i, d := range rows {
				if d.Outcome.Stale != (i < 5) {
					t.Fatalf("row %d (%v): Stale = %v", i, d.Outcome.Kind, d.Outcome.Stale)
				}
			}
			if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE id = ANY ($1) AND NOT processed
				AND leased_by = $2 AND lease_token = $3 AND lease_until > now() + interval '50 seconds'
				AND deferred_reason IS NULL`, ids, holder.by, holder.token); n != 5 {
				t.Fatalf("%d of 5 rows still held by the current holder, untouched", n)
			}
			if n := count(t, db, `SELECT count(*) FROM webhook_deliveries`); n != 6 {
				t.Fatalf("%d outbox rows, want the 6 inserted (no retry row from a stale retry)", n)
			}
			if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 0 {
				t.Fatal("a stale 410 was dead-lettered")
			}
		})
	}
}

// TestStaleFallbackIsRefused: the row-by-row fallback's last resort (a dead letter) is fenced
// too: a row another claim holds is not dead-lettered by the stale holder.
func TestStaleFallbackIsRefused(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	rows := leased(t, db, "e", 2)
	sqltest.RefuseSettles(t, db, `NEW.id = `+strconv.FormatInt(rows[0].ID, 10)+` AND NEW.duration_ms IS NOT NULL`)
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET leased_by = 'peer' WHERE id = $1`, rows[0].ID); err != nil {
		t.Fatal(err)
	}
	for _, d := range rows {
		d.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200, Duration: time.Millisecond}
	}
	res, err := s.Settle(ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	// The batch fails on the trigger only if the fence let the row through; either way the
	// stale row must end up neither processed nor dead-lettered.
	if res.Settled != 1 || res.Stale != 1 || !rows[0].Outcome.Stale {
		t.Fatalf("result %+v, outcome %+v; want the peer's row stale and ours settled", res, rows[0].Outcome)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Fatal("the stale row was dead-lettered")
	}
}

// TestUndecidedIsNeverDelivered: a row no stage decided (a wiring bug) is released for another
// attempt, never written as delivered.
func TestUndecidedIsNeverDelivered(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	rows := leased(t, db, "e", 1)
	res, err := s.Settle(context.Background(), rows)
	if err != nil {
		t.Fatal(err)
	}
	if res.Settled != 0 || res.Released != 1 || rows[0].Outcome.Kind != delivery.Release {
		t.Fatalf("result %+v, outcome %v; want the row released", res, rows[0].Outcome.Kind)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE NOT processed AND lease_until <= now() + interval '2 seconds'`); n != 1 {
		t.Fatal("undecided row not pending and due again soon")
	}
}

// TestConnectionFailureIsAnError: when the database cannot be reached, Settle says so (the
// dispatcher counts it, and the rows come back through their leases); it never reports rows
// as settled.
func TestConnectionFailureIsAnError(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	rows := leased(t, db, "e", 2)
	rows[0].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	rows[1].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503}
	// A pool whose connections are killed under it: the statement fails on the wire.
	cfg := db.Pool.Config().Copy()
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var pid int
	if err := pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	s := settle.New(pool, settle.Config{InstanceID: "me"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := s.Settle(ctx, rows)
	if err == nil {
		t.Fatalf("Settle over a killed connection = %+v, nil; want an error", res)
	}
	if res.Settled != 0 {
		t.Fatalf("result %+v reports rows settled", res)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE NOT processed`); n != 2 {
		t.Fatalf("%d rows pending, want both (left to their leases)", n)
	}
}

// TestResumeBringsForwardOneEndpointsDeferredRows: after a successful probe, the rows deferred
// behind that endpoint's breaker come due at once, by the claim's key for the endpoint (a
// managed endpoint's "ep:<id>", an endpoint_url, "" for the default), and no other rows move.
func TestResumeBringsForwardOneEndpointsDeferredRows(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	const ep = "6f2a3c1e-0000-4000-8000-0000000000aa"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, created_at, endpoint_id, endpoint_url, deferred_reason) VALUES
		('managed', '{}', now() + interval '1 hour', $1, NULL, 'circuit breaker open'),
		('managed.rate', '{}', now() + interval '1 hour', $1, NULL, 'retry rate limit'),
		('default', '{}', now() + interval '1 hour', NULL, NULL, 'circuit breaker half-open: probe in flight'),
		('url', '{}', now() + interval '1 hour', NULL, 'https://other.example/', 'circuit breaker open')`, ep); err != nil {
		t.Fatal(err)
	}
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	reasons := []string{"circuit breaker open", "circuit breaker half-open: probe in flight"}
	for _, tc := range []struct {
		key  string
		want string
	}{{"ep:" + ep, "managed"}, {"", "default"}} {
		n, err := s.Resume(ctx, settle.Resumption{Keys: []string{tc.key}, Reasons: reasons})
		if err != nil || n != 1 {
			t.Fatalf("Resume(%q) = %d, %v; want the one %s row", tc.key, n, err, tc.want)
		}
		if c := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE event_type = $1 AND created_at <= now() AND deferred_reason IS NULL`, tc.want); c != 1 {
			t.Errorf("the %s row is not due now", tc.want)
		}
	}
	if c := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE created_at > now()`); c != 2 {
		t.Errorf("%d rows still deferred, want 2 (the rate-limited one and the other endpoint's)", c)
	}
}

// TestResumeBringsOneRowToTheNextProbe: after a probe that did not close the circuit, the
// soonest due of the rows deferred behind it, across every key sharing the breaker, comes due
// at the next probe time with the open circuit as its reason; the others keep their time, and
// a row due sooner is never pushed back.
func TestResumeBringsOneRowToTheNextProbe(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	const probe = "circuit breaker half-open: probe in flight"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, created_at, endpoint_url, deferred_reason) VALUES
		('default', '{}', now() + interval '1 hour', NULL, $1),
		('url', '{}', now() + interval '30 minutes', 'https://h.example/', $1),
		('url.later', '{}', now() + interval '2 hours', 'https://h.example/', $1),
		('soon', '{}', now() + interval '1 second', NULL, $1)`, probe); err != nil {
		t.Fatal(err)
	}
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	r := settle.Resumption{Keys: []string{"", "https://h.example/"}, Reasons: []string{probe}, In: time.Minute, Limit: 1, Reason: "circuit breaker open"}
	for range 2 { // the second call finds the soonest row already at the next probe time: it moves the next one
		if n, err := s.Resume(ctx, r); err != nil || n != 1 {
			t.Fatalf("Resume = %d, %v; want one row", n, err)
		}
	}
	if c := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE event_type IN ('url', 'default') AND created_at <= now() + interval '61 seconds' AND deferred_reason = 'circuit breaker open'`); c != 2 {
		t.Errorf("%d of the two soonest rows behind the probe come due at the next probe time, want both", c)
	}
	if c := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE event_type = 'url.later' AND created_at > now() + interval '1 hour'`); c != 1 {
		t.Error("a third row was brought forward")
	}
	if c := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE event_type = 'soon' AND created_at <= now() + interval '1 second' AND deferred_reason = $1`, probe); c != 1 {
		t.Error("a row due before the next probe time was touched")
	}
}

// TestSettledRowsLeaveTheQueue: from schema 7 the outbox holds only undelivered rows. A
// delivered, a retried and a dead-lettered row are deleted from webhook_outbox and their
// outcomes are in webhook_delivery_log; what stays in the queue is the retry's new row, the
// deferred row and the released one.
func TestSettledRowsLeaveTheQueue(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	rows := leased(t, db, "e", 5)
	rows[0].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200, Duration: 4 * time.Millisecond}
	rows[1].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503, Error: "HTTP 503", Duration: time.Millisecond}
	rows[2].Outcome = delivery.Outcome{Kind: delivery.Permanent, Status: 410, Error: "HTTP 410"}
	rows[3].Outcome = delivery.Outcome{Kind: delivery.Defer, Delay: time.Minute, Reason: "circuit open"}
	rows[4].Outcome = delivery.Outcome{Kind: delivery.Release}
	if _, err := s.Settle(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	settled := []int64{rows[0].ID, rows[1].ID, rows[2].ID}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE id = ANY($1)`, settled); n != 0 {
		t.Fatalf("%d settled rows still in webhook_outbox, want none", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE processed`); n != 0 {
		t.Fatalf("%d processed rows in webhook_outbox, want none", n)
	}
	// The queue: the retry's next attempt, the deferred row and the released row.
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE NOT processed`); n != 3 {
		t.Fatalf("%d rows in the queue, want 3", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE delivery_id = $1::uuid AND attempt = 2`, rows[1].DeliveryID); n != 1 {
		t.Fatalf("the retry's next attempt: %d rows, want 1", n)
	}
	for _, want := range []struct {
		id       int64
		status   int
		error    string
		duration int
	}{{rows[0].ID, 200, "", 4}, {rows[1].ID, 503, "HTTP 503", 1}, {rows[2].ID, 410, "HTTP 410", 0}} {
		var status, duration int
		var errText, by string
		if err := db.Pool.QueryRow(context.Background(), `
			SELECT status_code, coalesce(error, ''), coalesce(duration_ms, 0), leased_by
			FROM webhook_delivery_log WHERE id = $1 AND processed_at <= now()`, want.id).
			Scan(&status, &errText, &duration, &by); err != nil {
			t.Fatalf("log row of %d: %v", want.id, err)
		}
		if status != want.status || errText != want.error || duration != want.duration || by != "me" {
			t.Errorf("log row of %d: status %d, error %q, %d ms, by %q; want %d, %q, %d ms, by me",
				want.id, status, errText, duration, by, want.status, want.error, want.duration)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE processed`); n != 3 {
		t.Fatalf("webhook_deliveries shows %d processed rows, want the 3 settled", n)
	}
}

// TestDeliveredBatchTakesTheSmallStatement: a batch of deliveries alone goes through the
// statement made for them (settle.sql up to its delivered:end marker), which writes the same log rows and is fenced
// the same way; a batch with any other outcome goes through the whole one, and a row of
// another kind can never be settled by the small one.
func TestDeliveredBatchTakesTheSmallStatement(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	rows := leased(t, db, "e", 3)
	for _, d := range rows {
		d.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200, Duration: 3 * time.Millisecond, Excerpt: "ok", Excerpted: true}
	}
	small, _, _ := s.Statement(rows)
	mixed := []*delivery.Delivery{rows[0], {ID: 1, Attempt: 1, Outcome: delivery.Outcome{Kind: delivery.Retry, Status: 503}}}
	whole, _, _ := s.Statement(mixed)
	if small == whole || strings.Contains(small, "INSERT INTO webhook_dead_letter") || !strings.Contains(whole, "INSERT INTO webhook_dead_letter") || !strings.Contains(small, "i.kind = 1 AND") {
		t.Fatal("a delivered batch and a mixed one got the same statement, or the delivered one has the other kinds' writes or settles more than deliveries")
	}
	// Row 2 was claimed again by another instance meanwhile: fenced.
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET leased_by = 'peer' WHERE id = $1`, rows[2].ID); err != nil {
		t.Fatal(err)
	}
	settleWant(ctx, t, s, rows, settle.Result{Settled: 2, Stale: 1})
	if n := count(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE id = ANY ($1) AND status_code = 200
		AND duration_ms = 3 AND response_excerpt = 'ok' AND leased_by = 'me' AND lease_token = $2`,
		[]int64{rows[0].ID, rows[1].ID}, myToken); n != 2 {
		t.Fatalf("%d of 2 delivered rows logged with their answer", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE id = $1 AND leased_by = 'peer'`, rows[2].ID); n != 1 {
		t.Fatal("the row another instance holds was settled by the stale holder")
	}

	// The small statement given a retry by mistake (its arguments, its kind 2): the row is
	// reported stale and stays, never deleted without its retry row.
	retry := leased(t, db, "r", 1)
	retry[0].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503}
	_, args, _ := s.Statement(retry)
	var settled int64
	var written []int64
	var z1, z2, z3, z4, z5 int64
	if err := db.Pool.QueryRow(ctx, small, args...).Scan(&settled, &z1, &z2, &z3, &z4, &z5, &written); err != nil {
		t.Fatal(err)
	}
	if settled != 0 || len(written) != 0 {
		t.Fatalf("the delivered-only statement wrote a retry: settled %d, written %v", settled, written)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE id = $1`, retry[0].ID); n != 1 {
		t.Fatal("the retry's row was deleted by the delivered-only statement")
	}
}

// settleWant settles rows and fails the test unless Settle reports exactly want.
func settleWant(ctx context.Context, t *testing.T, s *settle.Settler, rows []*delivery.Delivery, want settle.Result) {
	t.Helper()
	res, err := s.Settle(ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	if res != want {
		t.Fatalf("result %+v, want %+v", res, want)
	}
}
