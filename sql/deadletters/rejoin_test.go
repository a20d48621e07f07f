package deadletters_test

import (
	"context"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/deadletters"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/claim"
)

// TestReplayWaitsForAClaimInProgress: a dead letter replayed into its ordered stream while a
// claim is leasing the stream's next row (its statement done, not yet committed) waits for that
// claim to commit, so that the replayed row sees the lease and waits for the request; it was
// sent beside it, the claim's lease invisible to the next claim's look.
func TestReplayWaitsForAClaimInProgress(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := claim.New(db.Pool, "a", time.Minute), claim.New(db.Pool, "b", time.Minute)
	for _, c := range []*claim.Claimer{a, b} {
		if err := c.Register(ctx); err != nil {
			t.Fatal(err)
		}
		c.SetOrdering(claim.Ordering{Active: true, Routed: true, Horizon: 1 << 62})
	}
	var ep string
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, ordering, created_at)
		VALUES ('https://consumer.example/', 's', 'stream', now() - interval '1 minute') RETURNING id::text`).Scan(&ep); err != nil {
		t.Fatal(err)
	}
	var dead int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_dead_letter (delivery_id, stream_id, event_type, payload, attempts, reason,
		enqueued_at, failed_at, endpoint_id, order_key)
		VALUES (gen_random_uuid(), 's', 'e', '{}', 1, 'status 413', now() - interval '1 minute', now(), $1::uuid, 1) RETURNING id`, ep).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	exec(t, db, `INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key)
		VALUES ('s', 'e', '{}', $1::uuid, now(), 5)`, ep)

	// Instance b's claim leases key 5, in a transaction not committed yet.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	q, args, read := b.Statement(10, claim.Skip{}, false, claim.Cursor{})
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := read(rows); err != nil || len(res.Rows) != 1 {
		t.Fatalf("b's claim: %d rows, %v; want key 5", len(res.Rows), err)
	}
	replayed := make(chan error, 1)
	go func() {
		_, err := replay(t, db, deadletters.Selection{IDs: []int64{dead}}, deadletters.Options{})
		replayed <- err
	}()
	for waiting := 0; waiting == 0; { // the replay waits for b's claim
		select {
		case err := <-replayed:
			t.Fatalf("the replay committed while a claim of its stream was in progress (%v)", err)
		default:
		}
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%FOR KEY SHARE%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // polling for the replay to wait on b's lock
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-replayed; err != nil {
		t.Fatal(err)
	}
	res, err := a.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(res.Rows) != 0 {
		t.Errorf("a's claim took %d rows (%v) while key 5 of the stream is out; want none: the replayed row waits", len(res.Rows), err)
	}
}
