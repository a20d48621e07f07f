package deadletters_test

import (
	"context"
	"testing"

	"github.com/fluxora/fluxhook/sql/deadletters"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// stoppedWithParked writes an ordered stream of plainEndpoint stopped at a dead letter (its row
// parked at 'infinity'), with two later rows parked behind it for an hour ('behind its
// stream', as the dispatcher parks them) and one of another stream, and returns the dead
// letter's id.
func stoppedWithParked(t *testing.T, db *sqltest.DB, stream string) int64 {
	t.Helper()
	var outboxID int64
	var delivery string
	if err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key, created_at, deferred_reason)
		VALUES ($1, 'e', '{}', $2::uuid, now(), 100, 'infinity', 'stream stopped: permanent: HTTP 410')
		RETURNING id, delivery_id::text`, stream, plainEndpoint).Scan(&outboxID, &delivery); err != nil {
		t.Fatal(err)
	}
	exec(t, db, `INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key, created_at, deferred_reason)
		VALUES ($1, 'e', '{}', $2::uuid, now(), 101, now() + interval '1 hour', 'behind its stream'),
		       ($1, 'e', '{}', $2::uuid, now(), 102, now() + interval '1 hour', 'behind its stream'),
		       ($1 || '-other', 'e', '{}', $2::uuid, now(), 103, now() + interval '1 hour', 'behind its stream')`,
		stream, plainEndpoint)
	var id int64
	if err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload, attempts, reason,
		                                 enqueued_at, endpoint_id, order_key)
		VALUES ($1, $2::uuid, $3, 'e', '{}', 1, 'permanent: HTTP 410', now(), $4::uuid, 100) RETURNING id`,
		outboxID, delivery, stream, plainEndpoint).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestReleasedStreamBringsItsParkedRows: replaying or purging the dead letter a stream stopped
// at releases the stream, and the rows parked behind it come due at once instead of at the end
// of their hour; another stream's parked rows stay as they are.
func TestReleasedStreamBringsItsParkedRows(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	replayed := stoppedWithParked(t, db, "r")
	if _, err := replay(t, db, deadletters.Selection{IDs: []int64{replayed}}, deadletters.Options{}); err != nil {
		t.Fatal(err)
	}
	purged := stoppedWithParked(t, db, "p")
	if _, err := deadletters.Purge(ctx, db.Pool, deadletters.Selection{IDs: []int64{purged}}, deadletters.PurgeOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{"r", "p"} {
		var due, parked int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE created_at <= now() AND deferred_reason IS NULL),
			count(*) FILTER (WHERE deferred_reason = 'behind its stream')
			FROM webhook_outbox WHERE stream_id = $1 AND order_key > 100`, stream).Scan(&due, &parked); err != nil {
			t.Fatal(err)
		}
		if due != 2 || parked != 0 {
			t.Errorf("stream %s released: %d of its 2 parked rows due now, %d still parked", stream, due, parked)
		}
		var other int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_outbox
			WHERE stream_id = $1 || '-other' AND deferred_reason = 'behind its stream' AND created_at > now()`, stream).Scan(&other); err != nil {
			t.Fatal(err)
		}
		if other != 1 {
			t.Errorf("another stream's parked row moved when stream %s was released", stream)
		}
	}
}

// TestReleasedStreamLeavesOtherTenantsParked: two tenants' events to the same destination
// (WEBHOOK_URL here) under the same stream id share a stream for the dispatcher, so one's row
// may be parked behind the other's stopped head. Replaying or purging that head releases the
// rows of its own tenant only: an action on one tenant's dead letter (its key may make it)
// writes no other tenant's queue rows. The other's row goes on when the head's next settle
// releases it, or at the end of its hour.
func TestReleasedStreamLeavesOtherTenantsParked(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	for _, release := range []string{"replay", "purge"} {
		stream := "shared-" + release
		var outboxID int64
		var delivery string
		if err := db.Pool.QueryRow(ctx, `
			INSERT INTO webhook_outbox (stream_id, event_type, payload, tenant, routed_at, order_key, created_at, deferred_reason)
			VALUES ($1, 'e', '{}', 'acme', now(), 100, 'infinity', 'stream stopped: permanent: HTTP 410')
			RETURNING id, delivery_id::text`, stream).Scan(&outboxID, &delivery); err != nil {
			t.Fatal(err)
		}
		exec(t, db, `INSERT INTO webhook_outbox (stream_id, event_type, payload, tenant, routed_at, order_key, created_at, deferred_reason)
			VALUES ($1, 'e', '{}', 'acme', now(), 101, now() + interval '1 hour', 'behind its stream'),
			       ($1, 'e', '{}', 'globex', now(), 102, now() + interval '1 hour', 'behind its stream')`, stream)
		var id int64
		if err := db.Pool.QueryRow(ctx, `
			INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload, attempts, reason,
			                                 enqueued_at, tenant, order_key)
			VALUES ($1, $2::uuid, $3, 'e', '{}', 1, 'permanent: HTTP 410', now(), 'acme', 100) RETURNING id`,
			outboxID, delivery, stream).Scan(&id); err != nil {
			t.Fatal(err)
		}
		var err error
		if release == "replay" {
			_, err = replay(t, db, deadletters.Selection{IDs: []int64{id}}, deadletters.Options{})
		} else {
			_, err = deadletters.Purge(ctx, db.Pool, deadletters.Selection{IDs: []int64{id}}, deadletters.PurgeOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		var acmeDue, globexParked int
		if err := db.Pool.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE tenant = 'acme' AND order_key = 101 AND created_at <= now()),
			count(*) FILTER (WHERE tenant = 'globex' AND deferred_reason = 'behind its stream' AND created_at > now())
			FROM webhook_outbox WHERE stream_id = $1`, stream).Scan(&acmeDue, &globexParked); err != nil {
			t.Fatal(err)
		}
		if acmeDue != 1 || globexParked != 1 {
			t.Errorf("%s of acme's head: acme's parked row due %d (want 1), globex's still parked %d (want 1)", release, acmeDue, globexParked)
		}
	}
}
