package claim_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/settle"
)

func TestClaimLeasesArmsAndSkips(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	armed := func(instance string) bool {
		var a bool
		if err := db.Pool.QueryRow(ctx, `SELECT armed FROM webhook_dispatcher WHERE instance_id = $1`, instance).Scan(&a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := claim.New(db.Pool, "a", time.Minute)
	b := claim.New(db.Pool, "b", 300*time.Millisecond)
	for _, c := range []*claim.Claimer{a, b} {
		if err := c.Register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	claimN := func(c *claim.Claimer, limit int, skip []string, arm bool) claim.Result {
		t.Helper()
		res, err := c.Claim(ctx, limit, claim.Skip{Endpoints: skip}, arm, claim.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	slow := []string{"https://slow.example/x"}

	// An empty claim arms; claiming work disarms.
	if res := claimN(a, 10, nil, true); len(res.Rows) != 0 || res.HasNext {
		t.Fatalf("empty claim on an empty table = %d rows, next %v %s", len(res.Rows), res.HasNext, res.Next)
	}
	if !armed("a") {
		t.Fatal("empty claim did not arm the dispatcher")
	}
	exec(`INSERT INTO webhook_outbox (event_type, payload, endpoint_url) VALUES
		('e', '{"a": 1}', NULL), ('e', '{}', 'https://slow.example/x'), ('e', '{}', NULL)`)
	exec(`INSERT INTO webhook_outbox (event_type, payload, created_at) VALUES ('future', '{}', now() + interval '1 hour')`)

	// A full batch disarms, even in arming mode: more rows are probably waiting and the
	// dispatcher will look again without being told, so it is not told when the next is due.
	// Saturated endpoints are claimed around.
	res := claimN(a, 1, slow, true)
	if len(res.Rows) != 1 || res.HasNext {
		t.Fatalf("claimed %d rows, next %v; want 1 and no next", len(res.Rows), res.HasNext)
	}
	rows := res.Rows
	if armed("a") {
		t.Fatal("a claim that found a full batch did not disarm")
	}
	// A partial batch in arming mode arms: it saw every row it could take. The row it took is
	// not "claimable now" (its own snapshot still shows it unleased); the next is the lease
	// of the row the previous claim took, in about a minute.
	res = claimN(a, 10, slow, true)
	rows = append(rows, res.Rows...)
	if len(rows) != 2 || rows[0].EndpointURL != "" || string(rows[0].Payload) != `{"a":1}` || rows[0].Attempt != 1 {
		t.Fatalf("claimed %+v", rows)
	}
	if !res.HasNext || res.Next < 55*time.Second || res.Next > time.Minute {
		t.Fatalf("next = %v %s; want the first lease's expiry in about a minute", res.HasNext, res.Next)
	}
	if !armed("a") {
		t.Fatal("a partial batch in arming mode did not arm")
	}
	// Outside arming mode every claim disarms, and reports no next.
	if res := claimN(a, 10, slow, false); len(res.Rows) != 0 || res.HasNext {
		t.Fatalf("a claimed %d rows, next %v; want none", len(res.Rows), res.HasNext)
	}
	if armed("a") {
		t.Fatal("a claim outside arming mode did not disarm")
	}
	// An empty claim arms only in arming mode.
	if res := claimN(a, 10, slow, false); len(res.Rows) != 0 {
		t.Fatalf("empty claim: %d rows", len(res.Rows))
	}
	if armed("a") {
		t.Fatal("an empty claim outside arming mode armed the dispatcher")
	}
	if res := claimN(a, 10, slow, true); len(res.Rows) != 0 {
		t.Fatalf("empty claim: %d rows", len(res.Rows))
	}
	if !armed("a") {
		t.Fatal("an empty claim in arming mode did not arm")
	}
	// Leased rows are not claimed again; the slow endpoint's row is now claimable by b.
	rows = claimN(b, 10, nil, true).Rows
	if len(rows) != 1 || rows[0].EndpointURL != "https://slow.example/x" {
		t.Fatalf("b claimed %d rows; want only the slow endpoint's row", len(rows))
	}
	// b "crashes": its short lease expires and the row comes back.
	res = claimN(a, 10, nil, true)
	if len(res.Rows) != 0 || !res.HasNext || res.Next > 300*time.Millisecond {
		t.Fatalf("a claimed %d rows, next = %v %s; want none and b's lease expiry within 300ms", len(res.Rows), res.HasNext, res.Next)
	}
	time.Sleep(res.Next + 20*time.Millisecond) // the lease is the thing under test: wait it out
	res = claimN(a, 10, nil, true)
	if len(res.Rows) != 1 || res.Rows[0].EndpointURL != "https://slow.example/x" {
		t.Fatalf("after b's lease expired a claimed %d rows; want b's row", len(res.Rows))
	}
	// What remains: a's own one-minute leases (the row just claimed among them) and the row
	// due in an hour; the leases are the earlier (a crashed a's rows would come back then).
	if !res.HasNext || res.Next < 55*time.Second || res.Next > time.Minute {
		t.Fatalf("next = %v %s; want a's lease expiry in about a minute", res.HasNext, res.Next)
	}
	exec(`UPDATE webhook_outbox SET processed = true WHERE event_type = 'e'`)
	// A row another session holds locked (its claim in progress) is skipped, and is due now:
	// if that claim rolls back, nothing else would wake the dispatcher for it. A saturated
	// endpoint's rows are left out.
	exec(`INSERT INTO webhook_outbox (event_type, payload, endpoint_url) VALUES ('late', '{}', 'https://busy.example/x')`)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT id FROM webhook_outbox WHERE event_type = 'late' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if res := claimN(a, 10, nil, true); len(res.Rows) != 0 || !res.HasNext || res.Next != 0 {
		t.Fatalf("with the row locked elsewhere: %d rows, next = %v %s; want none and 0", len(res.Rows), res.HasNext, res.Next)
	}
	if res := claimN(a, 10, []string{"https://busy.example/x"}, true); !res.HasNext || res.Next < 59*time.Minute {
		t.Fatalf("skipping the busy endpoint: next = %v %s; want the future row in about an hour", res.HasNext, res.Next)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if rows := claimN(a, 10, nil, true).Rows; len(rows) != 1 || rows[0].EventType != "late" {
		t.Fatalf("after the other session rolled back: claimed %d rows; want the late row", len(rows))
	}
}

func TestHeartbeatRemovesStalePeers(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_dispatcher (instance_id, armed, seen_at)
		VALUES ('crashed', true, now() - interval '1 hour'), ('alive', true, now())`); err != nil {
		t.Fatal(err)
	}
	c := claim.New(db.Pool, "me", time.Minute)
	if err := c.Heartbeat(ctx, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	var ids []string
	rows, _ := db.Pool.Query(ctx, `SELECT instance_id FROM webhook_dispatcher ORDER BY instance_id`)
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		ids = append(ids, id)
	}
	if len(ids) != 2 || ids[0] != "alive" || ids[1] != "me" {
		t.Fatalf("dispatchers after heartbeat: %v; want [alive me]", ids)
	}
}

func TestPruneDeletesOnlyOldProcessedRows(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_outbox (event_type, payload, processed, processed_at)
		SELECT 'old', '{}', true, now() - interval '8 days' FROM generate_series(1, 25);
		INSERT INTO webhook_outbox (event_type, payload, processed, processed_at) VALUES ('recent', '{}', true, now());
		INSERT INTO webhook_outbox (event_type, payload, created_at) VALUES ('pending', '{}', now() - interval '30 days');
		INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, reason, enqueued_at, failed_at)
		VALUES (gen_random_uuid(), 'dead', '{}', 9, 'exhausted', now() - interval '30 days', now() - interval '30 days');`)
	if err != nil {
		t.Fatal(err)
	}
	c := claim.New(db.Pool, "me", time.Minute)
	n, err := c.Prune(ctx, 7*24*time.Hour, 10) // batches of 10: 10, 10, 5
	if err != nil || n != 25 {
		t.Fatalf("Prune = %d, %v; want 25 old rows deleted", n, err)
	}
	var left []string
	rows, _ := db.Pool.Query(ctx, `SELECT event_type FROM webhook_deliveries ORDER BY event_type`)
	for rows.Next() {
		var e string
		_ = rows.Scan(&e)
		left = append(left, e)
	}
	if len(left) != 2 || left[0] != "pending" || left[1] != "recent" {
		t.Fatalf("rows left: %v; want [pending recent]", left)
	}
	var dead int
	_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_dead_letter`).Scan(&dead)
	if dead != 1 {
		t.Fatalf("dead letters: %d; the janitor must keep them", dead)
	}
}

// TestCheckAnnounceNamesTheMissingGrant: a dispatcher whose role may not set the NOTIFY switch
// is told which GRANT it lacks (the dispatcher refuses to start with it).
func TestCheckAnnounceNamesTheMissingGrant(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	role := sqltest.NewRole(t, db)
	pool := sqltest.ConnectAs(t, db, role)
	c := claim.New(pool, "x", time.Minute)
	if err := c.CheckAnnounce(ctx); err == nil || !strings.Contains(err.Error(), "GRANT UPDATE ON SEQUENCE webhook_outbox_notify_until") {
		t.Fatalf("CheckAnnounce without the grant = %v, want the GRANT to run", err)
	}
	if _, err := db.Pool.Exec(ctx, `GRANT UPDATE ON SEQUENCE webhook_outbox_notify_until TO `+role); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckAnnounce(ctx); err != nil {
		t.Fatalf("CheckAnnounce with the grant: %v", err)
	}
}

func TestSnapshotSees(t *testing.T) {
	t.Parallel()
	s, err := claim.ParseSnapshot("100:105:101,103")
	if err != nil {
		t.Fatal(err)
	}
	for xid, want := range map[uint64]bool{99: true, 100: true, 101: false, 102: true, 103: false, 104: true, 105: false, 200: false} {
		if got := s.Sees(xid); got != want {
			t.Errorf("snapshot 100:105:101,103 sees %d = %v, want %v", xid, got, want)
		}
	}
	if s, err := claim.ParseSnapshot("7:7:"); err != nil || !s.Sees(6) || s.Sees(7) {
		t.Errorf("snapshot 7:7: = %v, %v", s, err)
	}
	for _, bad := range []string{"", "1:2", "x:2:", "5:4:", "1:3:a"} {
		if _, err := claim.ParseSnapshot(bad); err == nil {
			t.Errorf("ParseSnapshot(%q) accepted a malformed snapshot", bad)
		}
	}
	if (claim.Snapshot{}).Sees(1) {
		t.Error("the zero snapshot sees a transaction")
	}
}

// The claim's snapshot is what the dispatcher holds NOTIFYs against: it must see a producer
// transaction that committed before the claim, and not one that committed after.
func TestClaimSnapshotSeesEarlierProducers(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	produce := func() uint64 {
		t.Helper()
		var xid uint64
		if err := db.Pool.QueryRow(ctx, `WITH i AS (INSERT INTO webhook_outbox (event_type, payload) VALUES ('e', '{}'))
			SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid
	}
	before := produce()
	res, err := c.Claim(ctx, 10, claim.Skip{}, true, claim.Cursor{})
	if err != nil || len(res.Rows) != 1 {
		t.Fatalf("claimed %d rows, %v", len(res.Rows), err)
	}
	after := produce()
	if !res.Snapshot.Sees(before) {
		t.Errorf("the claim's snapshot does not see transaction %d, which committed before it", before)
	}
	if res.Snapshot.Sees(after) {
		t.Errorf("the claim's snapshot sees transaction %d, which committed after it", after)
	}
}

// A claim from a cursor considers only rows after it in claim order; rows behind it wait for
// the next claim from the head, which takes them.
func TestClaimFromCursor(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, created_at)
		SELECT 'e', jsonb_build_object('n', i), now() - interval '1 minute' + i * interval '1 ms'
		FROM generate_series(1, 5) i`); err != nil {
		t.Fatal(err)
	}
	first, err := c.Claim(ctx, 2, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(first.Rows) != 2 {
		t.Fatalf("first claim: %d rows, %v", len(first.Rows), err)
	}
	if last := first.Rows[1]; first.Last != (claim.Cursor{DueAt: last.DueAt, ID: last.ID}) {
		t.Fatalf("Last = %+v, want the last row claimed (%v, %d)", first.Last, last.DueAt, last.ID)
	}
	// A row behind the cursor: a lease that expired (here: released by hand).
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET lease_until = NULL WHERE id = $1`, first.Rows[0].ID); err != nil {
		t.Fatal(err)
	}
	next, err := c.Claim(ctx, 10, claim.Skip{}, false, first.Last)
	if err != nil {
		t.Fatal(err)
	}
	if len(next.Rows) != 3 {
		t.Fatalf("claim from the cursor took %d rows, want the 3 after it", len(next.Rows))
	}
	for _, r := range next.Rows {
		if r.ID == first.Rows[0].ID {
			t.Fatal("the claim from the cursor took a row behind it")
		}
	}
	head, err := c.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(head.Rows) != 1 || head.Rows[0].ID != first.Rows[0].ID {
		t.Fatalf("claim from the head: %d rows, %v; want the row behind the cursor", len(head.Rows), err)
	}
}

// newRegistered returns a migrated database and a registered claimer with a one-minute lease.
func newRegistered(t *testing.T, instance string) (*sqltest.DB, *claim.Claimer) {
	t.Helper()
	db := sqltest.NewMigrated(t)
	c := claim.New(db.Pool, instance, time.Minute)
	if err := c.Register(deadline(t)); err != nil {
		t.Fatal(err)
	}
	return db, c
}

// A producer may insert any id (the identity is GENERATED BY DEFAULT), 0 included: such a row
// is claimed and returned like any other, never taken for the statement's own row.
func TestClaimRowWithIDZero(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (id, event_type, payload) VALUES (0, 'zero', '{"n": 0}'), (-5, 'neg', '{}')`); err != nil {
		t.Fatal(err)
	}
	res, err := c.Claim(ctx, 10, claim.Skip{}, true, claim.Cursor{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 2 || res.Rows[0].ID != 0 && res.Rows[1].ID != 0 {
		t.Fatalf("claimed %d rows; want the rows with ids 0 and -5", len(res.Rows))
	}
	for _, r := range res.Rows {
		if r.ID == 0 && (r.EventType != "zero" || string(r.Payload) != `{"n":0}`) {
			t.Fatalf("row 0 came back as %q %s", r.EventType, r.Payload)
		}
	}
	if res.Snapshot.Sees(^uint64(0)) || !res.Snapshot.Sees(1) {
		t.Fatal("the statement's own row (its snapshot) was lost")
	}
}

// Every claim stamps its rows with a token of its own, the fence every settle presents.
func TestClaimStampsALeaseToken(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) SELECT 'e', '{}' FROM generate_series(1, 4)`); err != nil {
		t.Fatal(err)
	}
	first, err := c.Claim(ctx, 2, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(first.Rows) != 2 {
		t.Fatalf("first claim: %d rows, %v", len(first.Rows), err)
	}
	second, err := c.Claim(ctx, 2, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(second.Rows) != 2 {
		t.Fatalf("second claim: %d rows, %v", len(second.Rows), err)
	}
	tok1, tok2 := first.Rows[0].LeaseToken, second.Rows[0].LeaseToken
	if tok1 == tok2 || first.Rows[1].LeaseToken != tok1 || second.Rows[1].LeaseToken != tok2 {
		t.Fatalf("tokens %d,%d and %d,%d; want one per claim, different claims different", tok1,
			first.Rows[1].LeaseToken, tok2, second.Rows[1].LeaseToken)
	}
	for _, r := range append(first.Rows, second.Rows...) {
		var token int64
		var by string
		if err := db.Pool.QueryRow(ctx, `SELECT lease_token, leased_by FROM webhook_deliveries WHERE id = $1`, r.ID).Scan(&token, &by); err != nil {
			t.Fatal(err)
		}
		if token != r.LeaseToken || by != "a" {
			t.Fatalf("row %d stored token %d by %q, returned %d", r.ID, token, by, r.LeaseToken)
		}
	}
}

// Skip.Retries leaves an endpoint's retries (over its retry rate) in the table and still
// claims its first attempts, which the rate limit never holds back.
func TestClaimSkipsRetriesOnly(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, attempt, endpoint_url) VALUES
		('first', '{}', 1, NULL), ('retry', '{}', 2, NULL), ('other', '{}', 3, 'https://other.example/')`); err != nil {
		t.Fatal(err)
	}
	res, err := c.Claim(ctx, 10, claim.Skip{Retries: []string{""}}, false, claim.Cursor{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res.Rows {
		got = append(got, r.EventType)
	}
	if strings.Join(got, ",") != "first,other" {
		t.Fatalf("claimed %v; want the default endpoint's first attempt and the other endpoint's retry", got)
	}
}

// TestClaimCarriesTheDeferralReason: a row the gate deferred comes back with the reason of its
// deferral (delivery.Delivery.DeferredBy), which the rate limiter reads to tell a retry that
// waited its turn from a newly due one; a row never deferred has none. Both statements (one
// that orders, one that does not) return it.
func TestClaimCarriesTheDeferralReason(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			t.Parallel()
			db, c := newRegistered(t, "a")
			ctx := deadline(t)
			if ordered {
				c.SetOrdering(claim.Ordering{Active: true, Horizon: math.MaxInt64})
			}
			if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, attempt, deferred_reason) VALUES
				('deferred', '{}', 2, 'retry rate limit'), ('new', '{}', 2, NULL)`); err != nil {
				t.Fatal(err)
			}
			res, err := c.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, r := range res.Rows {
				got[r.EventType] = r.DeferredBy
			}
			if want := map[string]string{"deferred": "retry rate limit", "new": ""}; !maps.Equal(got, want) {
				t.Fatalf("claimed rows' deferral reasons %v, want %v", got, want)
			}
		})
	}
}

// TestOrderedClaimReadsTheHorizonFirst: a claim that orders takes a committed ordered row the
// horizon it was given does not cover yet, when the reading it takes just before its statement
// finds no producer transaction open: an event alone goes with the first claim, not with the
// claim after the one that read a horizon covering it. A producer transaction still open
// (it could commit a smaller id of the stream) holds the row back, however late the reading.
func TestOrderedClaimReadsTheHorizonFirst(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	// WEBHOOK_ORDERING=stream, with the horizon of a dispatcher that has read nothing yet.
	c.SetOrdering(claim.Ordering{Active: true, Default: true})
	claimed := func() []int64 {
		t.Helper()
		res, err := c.Claim(ctx, 10, claim.Skip{}, true, claim.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, d := range res.Rows {
			ids = append(ids, d.ID)
		}
		return ids
	}
	insert := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, stream string) int64 {
		t.Helper()
		var id int64
		if err := q.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
			VALUES ($1, 'stream.updated', '{}') RETURNING id`, stream).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}

	alone := insert(db.Pool, "s-1")
	if got := claimed(); len(got) != 1 || got[0] != alone {
		t.Fatalf("the first claim took %v, want the event alone (%d)", got, alone)
	}

	// An open producer transaction that drew an id holds back a later committed event of any
	// stream.
	open, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	insert(open, "s-2")
	later := insert(db.Pool, "s-3")
	if got := claimed(); len(got) != 0 {
		t.Fatalf("a claim took %v while a producer transaction with a smaller id was open", got)
	}
	if err := open.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := claimed(); len(got) != 1 || got[0] != later {
		t.Fatalf("once the producer transaction ended, the claim took %v, want %d", got, later)
	}
}

// TestOrderedClaimReadingGuards: the reading before a claim is used only when it can be
// trusted. Under REPEATABLE READ the claim's snapshot would predate it: unused. A session
// setting of the same name (a role's, a database's, a connection string's) never stands in
// for it. And a claim whose look at the rows it left was cut short at 1,000 reports ordered
// rows as possibly waiting, so that a moved horizon still brings another claim.
func TestOrderedClaimReadingGuards(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	claimer := func(p *pgxpool.Pool, instance string) *claim.Claimer {
		t.Helper()
		c := claim.New(p, instance, time.Minute)
		if err := c.Register(ctx); err != nil {
			t.Fatal(err)
		}
		c.SetOrdering(claim.Ordering{Active: true, Default: true})
		return c
	}
	claimOnce := func(c *claim.Claimer, arm bool) claim.Result {
		t.Helper()
		res, err := c.Claim(ctx, 10, claim.Skip{}, arm, claim.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	insert := func() {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
			VALUES ('s', 'stream.updated', '{}')`); err != nil {
			t.Fatal(err)
		}
	}
	insert()

	t.Run("repeatable read", func(t *testing.T) {
		c := claimer(poolWith(t, db.URL, map[string]string{"default_transaction_isolation": "repeatable read"}, nil), "rr")
		if res := claimOnce(c, true); len(res.Rows) != 0 || res.HorizonNow != 0 {
			t.Fatalf("under REPEATABLE READ the claim took %d rows with horizon %d from its reading, want 0 and 0",
				len(res.Rows), res.HorizonNow)
		}
	})
	t.Run("a session setting of the same name", func(t *testing.T) {
		c := claimer(poolWith(t, db.URL, map[string]string{"fluxhook.horizon_now": "9223372036854775807"}, nil), "set")
		for _, arm := range []bool{false, true} {
			open := openProducer(t, ctx, db.Pool) // a holder: the reading gives nothing
			res := claimOnce(c, arm)
			_ = open.Rollback(ctx)
			for _, d := range res.Rows {
				if d.StreamID == "s" {
					t.Fatalf("arm %v: the claim took the ordered row past its horizon, on the session's own setting", arm)
				}
			}
		}
	})
	t.Run("a look cut short", func(t *testing.T) {
		// 1,000 unordered rows leased by another instance stand before the ordered one.
		if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, created_at)
			SELECT 'bulk', '{}', now() - interval '1 hour' FROM generate_series(1, 1000)`); err != nil {
			t.Fatal(err)
		}
		other := claim.New(db.Pool, "other", time.Minute)
		if err := other.Register(ctx); err != nil {
			t.Fatal(err)
		}
		if res, err := other.Claim(ctx, 1000, claim.Skip{}, false, claim.Cursor{}); err != nil || len(res.Rows) != 1000 {
			t.Fatalf("leasing the 1,000 rows: %d, %v", len(res.Rows), err)
		}
		// A horizon of 0 and a holder open: the ordered row waits, behind 1,000 leased rows.
		openProducer(t, ctx, db.Pool)
		res := claimOnce(claimer(db.Pool, "cut"), true)
		if len(res.Rows) != 0 || !res.OrderedWaiting {
			t.Fatalf("claim took %d rows, ordered waiting %v; want 0 and true (its look stopped at 1,000 rows)",
				len(res.Rows), res.OrderedWaiting)
		}
	})
}

// TestUnorderedClaimLeavesOrderedRowsToAConfirmedCache: a dispatcher whose endpoint cache has
// not seen an endpoint turn ordering on claims with the statement that orders nothing; that
// statement takes the endpoint's ordered rows (an order key) only while the cache is confirmed
// at the endpoints' current version. A stale instance sent keys 2 and 3 of a stream past key 1
// in flight, and the consumer saw 1, 3, 2.
func TestUnorderedClaimLeavesOrderedRowsToAConfirmedCache(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	var ep string
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:1/', 's')
		RETURNING id::text`).Scan(&ep); err != nil {
		t.Fatal(err)
	}
	version := func() int64 { return db.EndpointsVersion(t) }
	stale := version() // the cache loaded (and confirmed) before ordering was turned on
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_endpoints SET ordering = 'stream'`); err != nil {
		t.Fatal(err)
	}
	// Another instance routed three events of one stream, and sends key 1.
	var keys []int64
	for i := range 3 {
		var id int64
		if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key,
			leased_by, lease_token, lease_until)
			VALUES ('s', 'order.updated', '{}', $1::uuid, now(), 100 + $2::int,
			        CASE WHEN $2::int = 0 THEN 'b' END, CASE WHEN $2::int = 0 THEN 1 END,
			        CASE WHEN $2::int = 0 THEN now() + interval '1 minute' END) RETURNING id`, ep, i).Scan(&id); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, id)
	}
	claimed := func(o claim.Ordering) int {
		t.Helper()
		c.SetOrdering(o)
		res, err := c.Claim(ctx, 10, claim.Skip{}, true, claim.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Rows)
	}
	for _, o := range []claim.Ordering{{Routed: true, Confirmed: stale}, {Routed: true, Confirmed: -1}} {
		if n := claimed(o); n != 0 {
			t.Fatalf("a claim that orders nothing, its cache confirmed at %d (the endpoints are at %d), took %d ordered rows behind the stream's head in flight",
				o.Confirmed, version(), n)
		}
	}
	// Ordering turned off again, the cache confirmed at that version: the rows left with a key
	// are leftovers, and go without order, as deliveries routed before a change do.
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_endpoints SET ordering = 'none'`); err != nil {
		t.Fatal(err)
	}
	if n := claimed(claim.Ordering{Routed: true, Confirmed: version()}); n != 2 {
		t.Fatalf("a claim that orders nothing, its cache confirmed at the current version, took %d of the 2 unleased rows left with a key", n)
	}
}

// TestOrderedClaimSeesTheFirstEndpoint: under WEBHOOK_ORDERING=stream, a dispatcher whose
// cache does not know yet of the first endpoint (Routed false) must still hold an endpoint's
// ordered delivery behind an earlier event of its stream not routed yet: the claim looks for
// endpoints itself.
func TestOrderedClaimSeesTheFirstEndpoint(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	var ep string
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, ordering) VALUES ('http://127.0.0.1:1/', 's', 'stream')
		RETURNING id::text`).Scan(&ep); err != nil {
		t.Fatal(err)
	}
	// Event 1 of the stream, not routed yet and leased by another instance; event 2 routed by
	// that instance to the endpoint, waiting for its turn.
	var first, second int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload, leased_by, lease_token, lease_until)
		VALUES ('s', 'order.updated', '{}', 'b', 1, now() + interval '1 minute') RETURNING id`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key)
		VALUES ('s', 'order.updated', '{}', $1::uuid, now(), currval(pg_get_serial_sequence('webhook_outbox', 'id')) + 1)
		RETURNING id`, ep).Scan(&second); err != nil {
		t.Fatal(err)
	}
	c.SetOrdering(claim.Ordering{Active: true, Default: true, Routed: false, Horizon: second + 10})
	res, err := c.Claim(ctx, 10, claim.Skip{}, true, claim.Cursor{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 0 {
		t.Fatalf("the claim took row %d (key %d) while event %d of its stream waits to be routed", res.Rows[0].ID, res.Rows[0].OrderKey, first)
	}
}

// TestOrderedClaimWaitsForTheStreamsUnroutedEvents: an ordered endpoint's delivery of a
// stream's event is not its stream's head while an earlier event of the stream has not been
// routed yet (leased by another instance, or left for a later batch): once routed, that event's
// delivery will have the smaller key. Here instance b holds event 1 of stream s, and instance
// a, which knows its endpoints (Routed), routes event 2 and claims: the claim must not take
// event 2's delivery. Once b's lease lapses and a routes event 1, a claim takes event 1's
// delivery and still not event 2's. Without the head check's unrouted events clause the
// stream's second event went first.
func TestOrderedClaimWaitsForTheStreamsUnroutedEvents(t *testing.T) {
	t.Parallel()
	db, a := newRegistered(t, "a")
	ctx := deadline(t)
	b := claim.New(db.Pool, "b", time.Minute)
	if err := b.Register(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, ordering, created_at)
		VALUES ('http://127.0.0.1:1/', 's', 'stream', now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	var first, second int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES ('s', 'order.created', '{}') RETURNING id`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES ('s', 'order.updated', '{}') RETURNING id`).Scan(&second); err != nil {
		t.Fatal(err)
	}
	// As a dispatcher that knows an endpoint orders streams, with no producer holding the
	// horizon back.
	ordering := claim.Ordering{Active: true, Routed: true, Horizon: 1 << 62}
	a.SetOrdering(ordering)
	b.SetOrdering(ordering)
	claimed := func(c *claim.Claimer) []*delivery.Delivery {
		t.Helper()
		res, err := c.Claim(ctx, 1, claim.Skip{}, false, claim.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		return res.Rows
	}
	route := func(rows []*delivery.Delivery, event int64) {
		t.Helper()
		if len(rows) != 1 || rows[0].ID != event {
			t.Fatalf("claimed %d rows; want event %d", len(rows), event)
		}
		r, err := a.Route(ctx, rows, false)
		if err != nil || r.Queued != 1 || len(r.Deliveries) != 0 {
			t.Fatalf("routing event %d: %d queued, %d leased deliveries, %v; want its ordered delivery queued", event, r.Queued, len(r.Deliveries), err)
		}
	}
	held := claimed(b) // instance b holds event 1, not routed yet
	if len(held) != 1 || held[0].ID != first {
		t.Fatalf("instance b claimed %d rows; want event %d", len(held), first)
	}
	route(claimed(a), second) // event 2 comes in a's batch
	var key int64
	if err := db.Pool.QueryRow(ctx, `SELECT order_key FROM webhook_outbox WHERE endpoint_id IS NOT NULL AND stream_id = 's'`).Scan(&key); err != nil || key != second {
		t.Fatalf("event 2's delivery has order key %d (%v), want %d", key, err, second)
	}
	for _, c := range []*claim.Claimer{a, b} {
		if rows := claimed(c); len(rows) != 0 {
			t.Fatalf("a claim took row %d (key %d) while event %d of its stream waits to be routed", rows[0].ID, rows[0].OrderKey, first)
		}
	}

	// b's lease lapses; a claims and routes event 1: its delivery is the head now.
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET lease_until = now() - interval '1 second' WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	route(claimed(a), first)
	rows := claimed(a)
	if len(rows) != 1 || rows[0].OrderKey != first {
		t.Fatalf("after event 1 was routed the claim took %d rows; want event 1's delivery (key %d)", len(rows), first)
	}
	if more := claimed(a); len(more) != 0 {
		t.Fatalf("a claim took key %d while the stream's head (key %d) is in flight", more[0].OrderKey, first)
	}
}

// TestOrderedClaimHeadsKeepTheirPlace: under WEBHOOK_ORDERING=stream, a stream's earlier row
// that is not due holds the stream's later rows back, whatever moved it ahead (its producer's
// schedule, a retry, a deferral, a stop); a replayed row waits while a later row of its stream
// is in flight, however many other replayed rows lie between (several dead letters of one
// stream replayed together).
func TestOrderedClaimHeadsKeepTheirPlace(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, earlier string }{ // attempt, created_at, deferred_reason
		{"scheduled by its producer", `1, now() + interval '1 hour', NULL`},
		{"a retry", `2, now() + interval '1 hour', NULL`},
		{"deferred by the gate", `1, now() + interval '1 hour', 'circuit open'`},
		{"a stopped stream's parked row", `1, 'infinity', 'stream stopped: status 500'`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, a := newRegistered(t, "a")
			ctx := deadline(t)
			if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload, attempt, created_at, deferred_reason)
				VALUES ('s', 'e.one', '{}', `+c.earlier+`)`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES ('s', 'e.two', '{}')`); err != nil {
				t.Fatal(err)
			}
			a.SetOrdering(claim.Ordering{Active: true, Default: true, Horizon: 1 << 62})
			res, err := a.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
			if err != nil || len(res.Rows) != 0 {
				t.Errorf("claimed %d rows (%v); want none: the stream's earlier row keeps its place", len(res.Rows), err)
			}
		})
	}
	t.Run("replayed rows behind a request in flight", func(t *testing.T) {
		t.Parallel()
		db, a := newRegistered(t, "a")
		ctx := deadline(t)
		// Keys 1 and 2 replayed; key 5 out (leased by another instance).
		if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (id, stream_id, event_type, payload, order_key, deferred_reason, lease_until, leased_by, lease_token)
			VALUES (11, 's', 'e', '{}', 1, 'rejoined', NULL, NULL, NULL), (12, 's', 'e', '{}', 2, 'rejoined', NULL, NULL, NULL),
			       (15, 's', 'e', '{}', 5, NULL, now() + interval '1 minute', 'b', 7)`); err != nil {
			t.Fatal(err)
		}
		a.SetOrdering(claim.Ordering{Active: true, Default: true, Horizon: 1 << 62})
		res, err := a.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
		if err != nil || len(res.Rows) != 0 {
			t.Fatalf("claimed %d rows (%v) while key 5 of their stream is out; want none", len(res.Rows), err)
		}
		if _, err := db.Pool.Exec(ctx, `DELETE FROM webhook_outbox WHERE id = 15`); err != nil { // settled
			t.Fatal(err)
		}
		res, err = a.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
		if err != nil || len(res.Rows) != 1 || res.Rows[0].ID != 11 {
			t.Errorf("after it settled: claimed %d rows (%v); want the first replayed row (id 11) alone", len(res.Rows), err)
		}
	})
}

// TestOrderedClaimKeepsAResumedHead: a stream's head deferred behind an open circuit and made
// due again (settle.Resume, a probe succeeded) after a claim's transaction began is not taken
// for a first attempt scheduled for later: the claim does not pass it by to take the stream's
// next row. (The claim's hold-back reading waits here on an ALTER SEQUENCE in an open
// transaction, which widens a window a loaded machine opens by itself.)
func TestOrderedClaimKeepsAResumedHead(t *testing.T) {
	t.Parallel()
	db, a := newRegistered(t, "a")
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload, attempt, created_at, deferred_reason)
		VALUES ('s', 'e.one', '{}', 1, now() + interval '1 hour', 'circuit breaker open')`); err != nil {
		t.Fatal(err)
	}
	var later int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES ('s', 'e.two', '{}') RETURNING id`).Scan(&later); err != nil {
		t.Fatal(err)
	}
	a.SetOrdering(claim.Ordering{Active: true, Default: true, Horizon: 1 << 62})
	lock, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := lock.Exec(ctx, `ALTER SEQUENCE webhook_outbox_id_seq CACHE 1`); err != nil {
		t.Fatal(err)
	}
	type out struct {
		res claim.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := a.Claim(ctx, 10, claim.Skip{}, true, claim.Cursor{}) // arming: reads the horizon first
		done <- out{res, err}
	}()
	for waiting := 0; waiting == 0; {
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'webhook_outbox_id_seq'::regclass`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // polling for the claim to wait on the lock
	}
	s := settle.New(db.Pool, settle.Config{InstanceID: "a", Jitter: -1})
	if n, err := s.Resume(ctx, settle.Resumption{Keys: []string{""}, Reasons: []string{"circuit breaker open"}}); err != nil || n != 1 {
		t.Fatalf("resume: %d, %v", n, err)
	}
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	for _, r := range o.res.Rows {
		if r.ID == later {
			t.Errorf("the claim took the stream's later row (id %d) before its head, resumed after the claim began", later)
		}
	}
}
