package claim_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/settle"
)

// TestRouteProperty drives random endpoints (tenants, filters, enabled or not) and random
// events (tenants, types) through claim and Route, and checks every event reached exactly the
// endpoints the rule names: enabled, the same tenant (both none, or equal: never across
// tenants), existing when the event was enqueued, and a filter that matches (endpoints.Matches,
// the rule in Go). Events that match nothing and have no default consumer are settled as
// unrouted; with a default consumer, events without a tenant stay pending for it.
func TestRouteProperty(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 42))
			db, c := newRegistered(t, "a")
			ctx := deadline(t)
			tenants := []string{"", "acme", "globex", "initech"}
			types := []string{"stream.created", "stream.updated", "stream.cancelled", "payment.settled", "payment.failed", "streamx.created", "stream"}
			filters := [][]string{{}, {"stream.*"}, {"payment.settled"}, {"stream.created", "payment.*"}, {"nothing.*"}, {"stream"}}
			type ep struct {
				id, tenant string
				filter     []string
				enabled    bool
			}
			var eps []ep
			for range 12 {
				e := ep{tenant: tenants[rng.IntN(len(tenants))], filter: filters[rng.IntN(len(filters))], enabled: rng.IntN(5) > 0}
				var tenant any
				if e.tenant != "" {
					tenant = e.tenant
				}
				if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, tenant, event_types, secret, enabled, created_at)
					VALUES ('http://127.0.0.1:1/hook', $1, $2, 's', $3, now() - interval '1 minute') RETURNING id::text`,
					tenant, e.filter, e.enabled).Scan(&e.id); err != nil {
					t.Fatal(err)
				}
				eps = append(eps, e)
			}
			// One endpoint added after the events were enqueued: it must receive none of them.
			late := ep{filter: []string{}, enabled: true}
			keepDefault := seed%2 == 0
			type ev struct{ tenant, typ, payload string }
			events := map[string]ev{} // by delivery id
			for i := range 60 {
				// Each event its own payload: an event's deliveries share one compacted copy,
				// which must never be another event's.
				e := ev{tenant: tenants[rng.IntN(len(tenants))], typ: types[rng.IntN(len(types))], payload: fmt.Sprintf(`{"n":%d}`, i)}
				var tenant any
				if e.tenant != "" {
					tenant = e.tenant
				}
				var id string
				if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (event_type, payload, tenant, enqueued_at)
					VALUES ($1, jsonb_build_object('n', $3::int), $2, now() - interval '10 seconds') RETURNING delivery_id::text`,
					e.typ, tenant, i).Scan(&id); err != nil {
					t.Fatal(err)
				}
				events[id] = e
			}
			if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret) VALUES ('http://127.0.0.1:1/late', 's') RETURNING id::text`).Scan(&late.id); err != nil {
				t.Fatal(err)
			}
			res, err := c.Claim(ctx, 100, claim.Skip{}, false, claim.Cursor{})
			if err != nil || len(res.Rows) != len(events) {
				t.Fatalf("claimed %d of %d events: %v", len(res.Rows), len(events), err)
			}
			if res.EndpointsVersion == 0 {
				t.Error("the claim did not report the endpoints' version")
			}
			for _, d := range res.Rows {
				if !claim.NeedsRouting(d) {
					t.Fatalf("event %s not marked for routing", d.DeliveryID)
				}
			}
			routed, err := c.Route(ctx, res.Rows, keepDefault)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			for _, d := range routed.Deliveries {
				got[d.DeliveryID] = append(got[d.DeliveryID], d.EndpointID)
				if e := events[d.DeliveryID]; d.Tenant != e.tenant || d.EventType != e.typ || string(d.Payload) != e.payload ||
					d.Attempt != 1 || d.LeaseToken == 0 {
					t.Errorf("delivery %+v does not carry its event (%+v) or a lease token", d, e)
				}
			}
			unrouted, kept := 0, 0
			for id, e := range events {
				var want []string
				for _, p := range eps {
					if p.enabled && p.tenant == e.tenant && endpoints.Matches(p.filter, e.typ) {
						want = append(want, p.id)
					}
				}
				slices.Sort(want)
				have := got[id]
				slices.Sort(have)
				if !slices.Equal(want, have) {
					t.Errorf("event %+v went to %v, want %v", e, have, want)
				}
				if keepDefault && e.tenant == "" {
					kept++
				} else if len(want) == 0 {
					unrouted++
				}
			}
			if len(routed.Kept) != kept || routed.Unrouted != unrouted || len(routed.Kept)+len(routed.Settled) != len(events) {
				t.Errorf("kept %d (want %d), unrouted %d (want %d), settled %d", len(routed.Kept), kept, routed.Unrouted, unrouted, len(routed.Settled))
			}
			var leased int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE endpoint_id IS NOT NULL
				AND leased_by = 'a' AND lease_until > now() AND NOT processed`).Scan(&leased); err != nil {
				t.Fatal(err)
			}
			if leased != len(routed.Deliveries) {
				t.Errorf("%d delivery rows leased to the router, want %d", leased, len(routed.Deliveries))
			}
			// Routing twice does nothing: the events are routed once.
			again, err := c.Route(ctx, res.Rows, keepDefault)
			if err != nil || len(again.Deliveries)+len(again.Kept)+len(again.Settled) != 0 {
				t.Errorf("second Route = %+v, %v; want nothing", again, err)
			}
		})
	}
}

// Two events of one batch may carry the same delivery id (a producer may set its own): each
// delivery still carries its own event's payload, never the other's.
func TestRouteKeepsPayloadsApartUnderOneDeliveryID(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (url, secret, created_at)
		SELECT 'http://127.0.0.1:1/ep/' || i, 's', now() - interval '1 minute' FROM generate_series(1, 2) i;
		INSERT INTO webhook_outbox (event_type, payload, delivery_id, enqueued_at)
		SELECT 'e', jsonb_build_object('n', i), '6f1c2b4e-0000-4000-8000-000000000001', now() FROM generate_series(1, 2) i`); err != nil {
		t.Fatal(err)
	}
	res, err := c.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(res.Rows) != 2 {
		t.Fatalf("claimed %d events: %v", len(res.Rows), err)
	}
	routed, err := c.Route(ctx, res.Rows, false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, d := range routed.Deliveries {
		got[string(d.Payload)]++
	}
	if want := map[string]int{`{"n":1}`: 2, `{"n":2}`: 2}; !maps.Equal(got, want) {
		t.Errorf("payloads of the deliveries %v, want %v: each event's own, to both endpoints", got, want)
	}
}

// TestRouteIsFencedWhileItWaitsForTheRow: a claim whose lease on an event ran out, and whose
// event another claim re-leased and committed while the routing statement waited for the row,
// routes nothing: no delivery is made, and the other claim's row is left as it holds it. The
// statement's read of the event does not lock it; its write sees the other claim's version of
// the row, and only the write's own conditions are checked on that version.
func TestRouteIsFencedWhileItWaitsForTheRow(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	ev, _ := claimOneFencedEvent(t, ctx, db, c)

	// Another instance's claim re-leases the row (as after the lease ran out), uncommitted
	// while the routing statement starts.
	other, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := other.Exec(ctx, `UPDATE webhook_outbox SET leased_by = 'b', lease_token = 777,
		lease_until = now() + interval '1 minute' WHERE id = $1`, ev.ID); err != nil {
		t.Fatal(err)
	}
	var otherPID int
	if err := other.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&otherPID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   claim.Routed
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := c.Route(ctx, []*delivery.Delivery{ev}, false)
		done <- result{r, err}
	}()
	// Wait until the routing statement waits for the other claim's row lock.
	deadlineAt := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE $1 = ANY (pg_blocking_pids(pid)))`, otherPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the routing statement finished before the other claim committed: %+v, %v", r.r, r.err)
		default:
		}
		if time.Now().After(deadlineAt) {
			t.Fatal("the routing statement never waited for the other claim's row")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.r.Deliveries) != 0 || r.r.Queued != 0 || len(r.r.Settled) != 0 || len(r.r.Kept) != 0 {
		t.Errorf("routing by a claim that lost the event's lease returned %d deliveries, %d queued, settled %v, kept %v; want nothing",
			len(r.r.Deliveries), r.r.Queued, r.r.Settled, r.r.Kept)
	}
	var rows, logged int
	var leasedBy string
	var token int64
	var routed bool
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM webhook_outbox), (SELECT count(*) FROM webhook_delivery_log),
		(SELECT leased_by FROM webhook_outbox WHERE id = $1), (SELECT lease_token FROM webhook_outbox WHERE id = $1),
		(SELECT routed_at IS NOT NULL FROM webhook_outbox WHERE id = $1)`, ev.ID).Scan(&rows, &logged, &leasedBy, &token, &routed); err != nil {
		t.Fatalf("the event row is gone (routed by a claim that no longer held it): %v", err)
	}
	if rows != 1 || logged != 0 || leasedBy != "b" || token != 777 || routed {
		t.Errorf("after the fenced routing: %d outbox rows, %d logged, the event leased by %q with token %d, routed %v; want only the event, as the other claim holds it (b, 777, unrouted)",
			rows, logged, leasedBy, token, routed)
	}
}

// TestRouteIsFencedByTheLeaseToken: an event whose lease lapsed and was claimed again by the
// same instance (a new lease token, the same leased_by) routes nothing with the old claim's
// rows: no delivery row is inserted, nothing is logged, and the event stays as the new claim
// holds it (its token, unrouted). Only the token tells the two claims apart here, since both
// are this instance's: without its check in route.sql, the late router fans the event out
// (or keeps it for WEBHOOK_URL) under the new claim's feet, and the event is delivered twice
// or routed while the new holder routes it too. TestRouteIsFencedWhileItWaitsForTheRow fences
// another instance, which leased_by alone already stops.
func TestRouteIsFencedByTheLeaseToken(t *testing.T) {
	t.Parallel()
	for _, keepDefault := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepDefault=%v", keepDefault), func(t *testing.T) {
			t.Parallel()
			db, c := newRegistered(t, "a")
			ctx := deadline(t)
			ev, old := claimOneFencedEvent(t, ctx, db, c)
			// The old claim's lease lapses (as during a stall of this instance), and the same
			// instance claims the event again.
			if _, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET lease_until = now() - interval '1 second' WHERE id = $1`, ev.ID); err != nil {
				t.Fatal(err)
			}
			again, err := c.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
			if err != nil || len(again.Rows) != 1 || again.Rows[0].ID != ev.ID {
				t.Fatalf("the second claim took %d rows: %v; want the event whose lease lapsed", len(again.Rows), err)
			}
			newToken := again.Rows[0].LeaseToken
			if newToken == ev.LeaseToken {
				t.Fatalf("the second claim reused the first's lease token %d", newToken)
			}

			r, err := c.Route(ctx, old.Rows, keepDefault)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Deliveries) != 0 || r.Queued != 0 || len(r.Settled) != 0 || len(r.Kept) != 0 {
				t.Errorf("routing with the lapsed claim's token returned %d deliveries, %d queued, settled %v, kept %v; want nothing",
					len(r.Deliveries), r.Queued, r.Settled, r.Kept)
			}
			var rows, logged int
			var leasedBy string
			var token int64
			var routed bool
			if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM webhook_outbox), (SELECT count(*) FROM webhook_delivery_log),
				(SELECT leased_by FROM webhook_outbox WHERE id = $1), (SELECT lease_token FROM webhook_outbox WHERE id = $1),
				(SELECT routed_at IS NOT NULL FROM webhook_outbox WHERE id = $1)`, ev.ID).Scan(&rows, &logged, &leasedBy, &token, &routed); err != nil {
				t.Fatalf("the event row is gone (routed with a lapsed claim's token): %v", err)
			}
			if rows != 1 || logged != 0 || leasedBy != "a" || token != newToken || routed {
				t.Errorf("after routing with the lapsed token: %d outbox rows, %d logged, the event leased by %q with token %d, routed %v; want only the event, as the new claim holds it (a, %d, unrouted)",
					rows, logged, leasedBy, token, routed, newToken)
			}

			// The new claim's rows still route it.
			r, err = c.Route(ctx, again.Rows, keepDefault)
			if err != nil || len(r.Deliveries) != 1 {
				t.Fatalf("routing with the new claim's token made %d deliveries: %v; want 1", len(r.Deliveries), err)
			}
		})
	}
}

// claimOneFencedEvent adds an endpoint and an event for it (the endpoint older than the event)
// and claims the event with c, for the routing fence tests.
func claimOneFencedEvent(t *testing.T, ctx context.Context, db *sqltest.DB, c *claim.Claimer) (*delivery.Delivery, claim.Result) {
	t.Helper()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, created_at)
		VALUES ('http://127.0.0.1:1/hook', 's', now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, enqueued_at)
		VALUES ('t.fenced', '{}', now() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	res, err := c.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(res.Rows) != 1 {
		t.Fatalf("claimed %d rows: %v; want the event", len(res.Rows), err)
	}
	return res.Rows[0], res
}

// TestRouteParksBehindAWaitingHead: an ordered delivery routed while its stream's head for
// that endpoint waits for a retry an hour away is due when the head is, marked 'behind its
// stream' (left due, every claim would read it until then), and behind a stream stopped at a
// dead letter for an hour (park.sql parks it again then); nothing parks behind a head due
// within a second, or for an endpoint whose head is not waiting.
func TestRouteParksBehindAWaitingHead(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	const waiting, free = "6f2a3c1e-0000-4000-8000-0000000000b1", "6f2a3c1e-0000-4000-8000-0000000000b2"
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (id, url, secret, ordering, created_at) VALUES
			($1, 'http://127.0.0.1:1/waiting', 's', 'stream', now() - interval '1 minute'),
			($2, 'http://127.0.0.1:1/free', 's', 'stream', now() - interval '1 minute')`, waiting, free); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_outbox (id, stream_id, event_type, payload, endpoint_id, routed_at, order_key, attempt, created_at, deferred_reason)
		VALUES (900001, 'hour', 'e', '{}', $1, now(), 1, 2, now() + interval '1 hour', NULL),
		       (900002, 'soon', 'e', '{}', $1, now(), 2, 2, now() + interval '500 milliseconds', NULL),
		       (900003, 'stopped', 'e', '{}', $1, now(), 3, 1, 'infinity', 'stream stopped: HTTP 410')`, waiting); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_outbox (id, stream_id, event_type, payload, enqueued_at)
		VALUES (1000010, 'hour', 'e', '{}', now()), (1000011, 'soon', 'e', '{}', now()), (1000012, 'stopped', 'e', '{}', now())`); err != nil {
		t.Fatal(err)
	}
	res, err := c.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(res.Rows) != 3 {
		t.Fatalf("claimed %d events: %v; want the three", len(res.Rows), err)
	}
	if _, err := c.Route(ctx, res.Rows, false); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `
		SELECT order_key, endpoint_id::text, created_at > now() + interval '59 minutes', coalesce(deferred_reason, '')
		FROM webhook_outbox WHERE order_key >= 1000000 ORDER BY order_key, endpoint_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var key int64
		var ep, reason string
		var late bool
		err := r.Scan(&key, &ep, &late, &reason)
		return fmt.Sprintf("%d %s late=%v %q", key-1000000, ep[len(ep)-2:], late, reason), err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`10 b1 late=true "behind its stream"`, `10 b2 late=false ""`,
		`11 b1 late=false ""`, `11 b2 late=false ""`,
		`12 b1 late=true "behind its stream"`, `12 b2 late=false ""`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("routed deliveries\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRouteBesideASettleOfTheHeads: routing the next events of many ordered streams while a
// settle deletes their in-flight heads, in the opposite order, neither waits for the other nor
// deadlocks: routing reads the heads it parks behind without locking them (a lock on each
// deadlocked with such settles: 22 in 100 rounds, each a second lost and a failed routing or a
// settle redone row by row). A row it parks behind a head settled meanwhile is released by the
// park pass (TestParkReleasesRowsWhoseHeadLeft).
func TestRouteBesideASettleOfTheHeads(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	const ep = "6f2a3c1e-0000-4000-8000-0000000000e1"
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (id, url, secret, ordering, created_at) VALUES
		($1, 'http://127.0.0.1:9/a', 's', 'stream', now() - interval '1 minute')`, ep); err != nil {
		t.Fatal(err)
	}
	s := settle.New(db.Pool, settle.Config{InstanceID: "a"})
	const streams, rounds = 20, 30
	for round := range rounds {
		base := int64(10_000_000 + round*1000)
		// The heads, in flight; then the next event of each stream, claimed.
		if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (id, stream_id, event_type, payload, endpoint_id, routed_at,
				order_key, created_at, leased_by, lease_token, lease_until)
			SELECT $2::bigint + i, 's' || $3::int || '-' || i, 'e', '{}', $1, now(), $2::bigint + i, now() - interval '1 second',
			       'a', 77, now() + interval '1 minute'
			FROM generate_series(0, $4::int - 1) i`, ep, base, round, streams); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (id, stream_id, event_type, payload, enqueued_at)
			SELECT $1::bigint + 500 + i, 's' || $2::int || '-' || i, 'e', '{}', now() FROM generate_series(0, $3::int - 1) i`,
			base, round, streams); err != nil {
			t.Fatal(err)
		}
		res, err := c.Claim(ctx, 100, claim.Skip{}, false, claim.Cursor{})
		if err != nil || len(res.Rows) != streams {
			t.Fatalf("round %d: claimed %d events: %v; want %d", round, len(res.Rows), err, streams)
		}
		var heads []*delivery.Delivery
		for i := streams - 1; i >= 0; i-- {
			heads = append(heads, &delivery.Delivery{ID: base + int64(i), LeaseToken: 77, OrderKey: base + int64(i),
				EndpointID: ep, Attempt: 1, Outcome: delivery.Outcome{Kind: delivery.Delivered, Status: 200}})
		}
		start := make(chan struct{})
		settled := make(chan settle.Result, 1)
		go func() {
			<-start
			r, err := s.Settle(ctx, heads)
			if err != nil {
				t.Error(err)
			}
			settled <- r
		}()
		close(start)
		if _, err := c.Route(ctx, res.Rows, false); err != nil {
			t.Fatalf("round %d: routing beside the settle of the heads failed: %v", round, err)
		}
		if r := <-settled; r.Fallback > 0 || r.Settled != streams {
			t.Fatalf("round %d: the settle of the heads beside routing = %+v; want its %d rows in one statement", round, r, streams)
		}
		if _, err := db.Pool.Exec(ctx, `DELETE FROM webhook_outbox WHERE stream_id IS NOT NULL`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRouteLeavesLockedEventsToTheirLease: claimed events whose rows a session outside fluxhook
// holds locked (an operator's open SELECT ... FOR UPDATE) are left to their lease, in no list
// of the result but Locked, after one wait of the bound; the others of the batch are routed.
// Waiting for the lock stopped every claim of the instance, and failing the whole statement
// held every event of the batch back for a lease.
func TestRouteLeavesLockedEventsToTheirLease(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret, created_at)
		VALUES ('http://127.0.0.1:1/hook', 's', now() - interval '1 minute');
		INSERT INTO webhook_outbox (event_type, payload, enqueued_at)
		SELECT 't.locked', '{}', now() - interval '1 second' FROM generate_series(1, 3)`); err != nil {
		t.Fatal(err)
	}
	res, err := c.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(res.Rows) != 3 {
		t.Fatalf("claimed %d rows: %v; want the 3 events", len(res.Rows), err)
	}
	locked := res.Rows[1].ID
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM webhook_outbox WHERE id = $1 FOR UPDATE`, locked); err != nil {
		t.Fatal(err)
	}
	r, err := c.Route(ctx, res.Rows, false)
	if err != nil {
		t.Fatalf("Route: %v", err)
	}
	if len(r.Locked) != 1 || r.Locked[0] != locked || len(r.Deliveries) != 2 || len(r.Settled) != 2 {
		t.Errorf("routed %d deliveries, settled %v, locked %v; want the 2 unlocked events routed and %d left locked",
			len(r.Deliveries), r.Settled, r.Locked, locked)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var routed bool
	if err := db.Pool.QueryRow(ctx, `SELECT routed_at IS NOT NULL FROM webhook_outbox WHERE id = $1 AND leased_by = 'a'`, locked).Scan(&routed); err != nil || routed {
		t.Errorf("the locked event: routed %v, %v; want it in the queue, leased and unrouted", routed, err)
	}
}
