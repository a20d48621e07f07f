package settle_test

import (
	"context"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/settle"
)

const (
	parkedEP    = "6f2a3c1e-0000-4000-8000-0000000000a1"
	parkedOther = "6f2a3c1e-0000-4000-8000-0000000000a2"
	behind      = "behind its stream"
)

// orderedRows writes, with explicit ids, the rows of the parking tests: per row its id, stream,
// endpoint (NULL: none), order key (NULL: none), due offset from now in seconds, deferral
// reason (NULL: none), whether another instance leases it, and whether it was routed.
func orderedRows(t *testing.T, db *sqltest.DB, rows string) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), `
		INSERT INTO webhook_outbox (id, stream_id, event_type, payload, endpoint_id, order_key, created_at,
		                            deferred_reason, lease_until, leased_by, lease_token, routed_at)
		SELECT id, stream, 'e', '{}', ep::text::uuid, ok::text::bigint, now() + due * interval '1 second', reason::text,
		       CASE WHEN other THEN now() + interval '1 minute' END, CASE WHEN other THEN 'other' END,
		       CASE WHEN other THEN 1 END, CASE WHEN routed THEN now() END
		FROM (VALUES `+rows+`) AS v(id, stream, ep, ok, due, reason, other, routed)`); err != nil {
		t.Fatal(err)
	}
}

// orderedEndpoint adds endpoint parkedEP, which orders its streams.
func orderedEndpoint(t *testing.T, db *sqltest.DB) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO webhook_endpoints (id, url, secret, ordering) VALUES
		($1, 'http://127.0.0.1:9/a', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'stream')`, parkedEP); err != nil {
		t.Fatal(err)
	}
}

// leasedHead leases row id to "me" and returns it as a claimed ordered delivery.
func leasedHead(t *testing.T, db *sqltest.DB, id, orderKey int64) *delivery.Delivery {
	t.Helper()
	d := &delivery.Delivery{ID: id, LeaseToken: myToken, Attempt: 1, OrderKey: orderKey}
	if err := db.Pool.QueryRow(context.Background(), `
		UPDATE webhook_outbox SET lease_until = now() + interval '1 minute', leased_by = 'me', lease_token = $2
		WHERE id = $1 RETURNING delivery_id::text`, id, myToken).Scan(&d.DeliveryID); err != nil {
		t.Fatal(err)
	}
	return d
}

// dueIn returns how far from now (by the database's clock) row id is due, and its reason.
func dueIn(t *testing.T, db *sqltest.DB, id int64) (time.Duration, string) {
	t.Helper()
	var secs float64
	var reason *string
	if err := db.Pool.QueryRow(context.Background(), `
		SELECT extract(epoch FROM created_at - now())::float8, deferred_reason FROM webhook_outbox WHERE id = $1`,
		id).Scan(&secs, &reason); err != nil {
		t.Fatalf("row %d: %v", id, err)
	}
	if reason == nil {
		return time.Duration(secs * float64(time.Second)), ""
	}
	return time.Duration(secs * float64(time.Second)), *reason
}

// TestRetryParksTheRowsBehindIt: when an ordered head goes back for a retry a minute away, the
// rows of its stream and endpoint waiting behind it are due when it is, marked, so that claims
// stop reading them meanwhile; nothing else moves: other endpoints and streams, a row another
// instance leases, a replayed row with its own mark, a row scheduled for later (before or
// after the head's time), an event waiting to be routed.
func TestRetryParksTheRowsBehindIt(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, url, secret, ordering) VALUES
		($1, 'http://127.0.0.1:9/a', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'stream'),
		($2, 'http://127.0.0.1:9/b', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'stream')`, parkedEP, parkedOther); err != nil {
		t.Fatal(err)
	}
	orderedRows(t, db, `
		(1000, 's', '`+parkedEP+`', 100, -5, NULL, false, true),
		(1001, 's', '`+parkedEP+`', 101, -4, NULL, false, true),
		(1002, 's', '`+parkedEP+`', 102, -3, NULL, false, true),
		(1003, 's', '`+parkedEP+`', 103, -2, 'rejoined', false, true),
		(1004, 's', '`+parkedEP+`', 104, -1, NULL, true, true),
		(1005, 's', '`+parkedOther+`', 101, -4, NULL, false, true),
		(1006, 't', '`+parkedEP+`', 105, -4, NULL, false, true),
		(1007, 's', '`+parkedEP+`', 106, 7200, NULL, false, true),
		(1008, 's', '`+parkedEP+`', 107, 30, NULL, false, true),
		(2000, 's', NULL, NULL, -1, NULL, false, false)`)
	head := leasedHead(t, db, 1000, 100)
	head.Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503, Error: "HTTP 503"}
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	if _, err := s.Settle(ctx, []*delivery.Delivery{head}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{1001, 1002} {
		if in, reason := dueIn(t, db, id); in < 55*time.Second || in > time.Minute || reason != behind {
			t.Errorf("row %d waiting behind the retried head: due in %s (%q), want with it in a minute, %q", id, in, reason, behind)
		}
	}
	for id, want := range map[int64]string{1003: "rejoined", 1004: "", 1005: "", 1006: "", 2000: ""} {
		if in, reason := dueIn(t, db, id); in > 0 || reason != want {
			t.Errorf("row %d: due in %s (%q), want untouched, due now (%q)", id, in, reason, want)
		}
	}
	if in, _ := dueIn(t, db, 1007); in < time.Hour {
		t.Errorf("a row due in two hours was brought forward to %s", in)
	}
	if in, reason := dueIn(t, db, 1008); in > 30*time.Second || reason != "" {
		t.Errorf("a row scheduled 30 s ahead is due in %s (%q), want its own time: a release would send it before it", in, reason)
	}
}

// TestDeferralParksAndTheHeadReleasesTheNext: a head the gate defers for half a minute parks
// the rows behind it with it; a deferral under a second parks nothing (it would rewrite a
// stream's backlog for every short wait); and when the breaker lets the head go early, the
// row parked behind it comes due as soon as the head is delivered, not at the time the head
// no longer has.
func TestDeferralParksAndTheHeadReleasesTheNext(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	orderedEndpoint(t, db)
	orderedRows(t, db, `
		(1000, 's', '`+parkedEP+`', 100, -5, NULL, false, true),
		(1001, 's', '`+parkedEP+`', 101, -4, NULL, false, true),
		(1010, 'u', '`+parkedEP+`', 110, -5, NULL, false, true),
		(1011, 'u', '`+parkedEP+`', 111, -4, NULL, false, true)`)
	long := leasedHead(t, db, 1000, 100)
	long.Outcome = delivery.Outcome{Kind: delivery.Defer, Delay: 30 * time.Second, Reason: "circuit breaker open"}
	short := leasedHead(t, db, 1010, 110)
	short.Outcome = delivery.Outcome{Kind: delivery.Defer, Delay: 500 * time.Millisecond, Reason: "retry rate limit"}
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	if _, err := s.Settle(ctx, []*delivery.Delivery{long, short}); err != nil {
		t.Fatal(err)
	}
	if in, reason := dueIn(t, db, 1001); in < 25*time.Second || reason != behind {
		t.Fatalf("row behind a head deferred for 30 s: due in %s (%q), want with it, %q", in, reason, behind)
	}
	if in, reason := dueIn(t, db, 1011); in > 0 || reason != "" {
		t.Errorf("row behind a head deferred for 500 ms: due in %s (%q), want untouched", in, reason)
	}
	n, err := s.Resume(ctx, settle.Resumption{Keys: []string{"ep:" + parkedEP}, Reasons: []string{"circuit breaker open"}})
	if err != nil || n != 1 {
		t.Fatalf("Resume = %d, %v; want the deferred head", n, err)
	}
	if in, _ := dueIn(t, db, 1000); in > 0 {
		t.Fatalf("the head is due in %s after the breaker closed, want now", in)
	}
	head := leasedHead(t, db, 1000, 100)
	head.Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	if res, err := s.Settle(ctx, []*delivery.Delivery{head}); err != nil || res.Unparked != 1 {
		t.Fatalf("settling the delivered head = %+v, %v; want the row behind it let go (Unparked 1), for the dispatcher to claim it", res, err)
	}
	if in, reason := dueIn(t, db, 1001); in > 0 || reason != "" {
		t.Errorf("the row parked behind the head is due in %s (%q) once the head was delivered, want now", in, reason)
	}
}

// TestDefaultOrderedRetryParksWithoutEndpoints: WEBHOOK_ORDERING=stream rows for WEBHOOK_URL
// (no endpoint, never routed while no endpoint exists) park behind their head's retry too.
func TestDefaultOrderedRetryParksWithoutEndpoints(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	orderedRows(t, db, `
		(1000, 's', NULL, NULL, -5, NULL, false, false),
		(1001, 's', NULL, NULL, -4, NULL, false, false)`)
	head := leasedHead(t, db, 1000, 1000)
	head.Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503, Error: "HTTP 503"}
	s := settle.New(db.Pool, settle.Config{Schedule: []time.Duration{time.Minute}, Jitter: -1, InstanceID: "me"})
	if _, err := s.Settle(ctx, []*delivery.Delivery{head}); err != nil {
		t.Fatal(err)
	}
	if in, reason := dueIn(t, db, 1001); in < 55*time.Second || reason != behind {
		t.Errorf("row behind the retried head: due in %s (%q), want with it in a minute, %q", in, reason, behind)
	}
}
