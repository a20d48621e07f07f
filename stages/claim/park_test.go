package claim_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestParkTakesWaitingRowsOutOfTheClaimsWay: rows a producer inserted behind a head waiting for
// its retry an hour away (WEBHOOK_ORDERING=stream, no endpoint: nothing routes them) are parked
// at the head's due time, marked 'behind its stream', and a row behind a stream stopped at a
// dead letter for an hour; nothing else is: a row behind a head due within a second, a
// stream's head itself, a row
// another instance leases, a replayed row with its own mark, and any row at all when
// WEBHOOK_ORDERING is off.
func TestParkTakesWaitingRowsOutOfTheClaimsWay(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_outbox (id, stream_id, event_type, payload, attempt, order_key, created_at, deferred_reason,
		                            lease_until, leased_by, lease_token)
		VALUES (900001, 'hour', 'head', '{}', 2, 900001, now() + interval '1 hour', NULL, NULL, NULL, NULL),
		       (900002, 'hour', 'w1', '{}', 1, NULL, now() - interval '2 seconds', NULL, NULL, NULL, NULL),
		       (900003, 'hour', 'w2', '{}', 1, NULL, now() - interval '1 second', NULL, NULL, NULL, NULL),
		       (900004, 'hour', 'leased', '{}', 1, NULL, now() - interval '1 second', NULL, now() + interval '1 minute', 'b', 1),
		       (900005, 'hour', 'replayed', '{}', 1, 900005, now() - interval '1 second', 'rejoined', NULL, NULL, NULL),
		       (900011, 'soon', 'head', '{}', 2, 900011, now() + interval '500 milliseconds', NULL, NULL, NULL, NULL),
		       (900012, 'soon', 'w', '{}', 1, NULL, now() - interval '1 second', NULL, NULL, NULL, NULL),
		       (900021, 'stopped', 'head', '{}', 1, 900021, 'infinity', 'stream stopped: HTTP 410', NULL, NULL, NULL),
		       (900022, 'stopped', 'w', '{}', 1, NULL, now() - interval '1 second', NULL, NULL, NULL, NULL),
		       (900031, 'free', 'head', '{}', 1, NULL, now() - interval '1 second', NULL, NULL, NULL, NULL),
		       (900032, 'free', 'w', '{}', 1, NULL, now() - interval '1 second', NULL, NULL, NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	if n, released, err := c.Park(ctx, false, 100); err != nil || n != 0 || released != 0 {
		t.Fatalf("Park without WEBHOOK_ORDERING = %d parked, %d released, %v; want nothing", n, released, err)
	}
	n, released, err := c.Park(ctx, true, 100)
	if err != nil || n != 3 || released != 0 {
		t.Fatalf("Park = %d parked, %d released, %v; want the two rows behind the head an hour away and the one behind the stopped stream", n, released, err)
	}
	rows, err := db.Pool.Query(ctx, `
		SELECT stream_id || '/' || event_type, created_at > now() + interval '59 minutes', coalesce(deferred_reason, '')
		FROM webhook_outbox WHERE deferred_reason = 'behind its stream' OR created_at > now() + interval '59 minutes'
		ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var name, reason string
		var late bool
		err := r.Scan(&name, &late, &reason)
		return fmt.Sprintf("%s late=%v %q", name, late, reason), err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`hour/head late=true ""`, `hour/w1 late=true "behind its stream"`, `hour/w2 late=true "behind its stream"`,
		`stopped/head late=true "stream stopped: HTTP 410"`, `stopped/w late=true "behind its stream"`}
	if !slices.Equal(got, want) {
		t.Errorf("rows parked or due in an hour\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestParkReleasesRowsWhoseHeadLeft: a row parked behind a head that then left without
// releasing it (it settled while the park that read it was committing) leads its stream for
// its endpoint: the park pass makes it due, and only it; a row parked behind a head still
// waiting, or behind that row, stays parked.
func TestParkReleasesRowsWhoseHeadLeft(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_outbox (id, stream_id, event_type, payload, attempt, order_key, created_at, deferred_reason)
		VALUES (900001, 'gone', 'w1', '{}', 1, NULL, now() + interval '30 minutes', 'behind its stream'),
		       (900002, 'gone', 'w2', '{}', 1, NULL, now() + interval '30 minutes', 'behind its stream'),
		       (900011, 'here', 'head', '{}', 2, 900011, now() + interval '30 minutes', NULL),
		       (900012, 'here', 'w', '{}', 1, NULL, now() + interval '30 minutes', 'behind its stream')`); err != nil {
		t.Fatal(err)
	}
	parked, released, err := c.Park(ctx, true, 100)
	if err != nil || parked != 0 || released != 1 {
		t.Fatalf("Park = %d parked, %d released, %v; want the one row leading its stream released", parked, released, err)
	}
	var due []string
	rows, err := db.Pool.Query(ctx, `SELECT stream_id || '/' || event_type FROM webhook_outbox
		WHERE created_at <= now() AND deferred_reason IS NULL ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	due, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(due, []string{"gone/w1"}) {
		t.Errorf("rows due after the pass: %v, want only gone/w1", due)
	}
}
