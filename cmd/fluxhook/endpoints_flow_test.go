package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestEndpointsReplayAfterReenable runs the whole lifecycle through the commands an operator
// uses: `endpoints add`, `serve` without WEBHOOK_URL, a 410 that disables the endpoint and
// dead-letters its delivery (with the endpoint recorded), `endpoints enable`, and
// `dlq replay`, which sends the event back to the same endpoint with the same delivery id.
func TestEndpointsReplayAfterReenable(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	var healthy atomic.Bool
	c := newHookConsumer(t, func(context.Context, *hookRequest) int {
		if healthy.Load() {
			return http.StatusOK
		}
		return http.StatusGone
	})
	add := runCLI(t, db.URL, "endpoints", "add", "--url", c.URL(), "--secret", serveSecret, "--json")
	if add.code != 0 {
		t.Fatalf("endpoints add exited %d: %s", add.code, add.stderr)
	}
	var ep struct{ ID string }
	if err := json.Unmarshal([]byte(add.stdout), &ep); err != nil || ep.ID == "" {
		t.Fatalf("endpoints add --json printed %q: %v", add.stdout, err)
	}
	env := faultEnv(db.URL, "")
	delete(env, "WEBHOOK_URL")
	p := startServe(t, "serve", env)
	p.instanceID()
	id := enqueueOne(t, db, outbox.Event{})
	pollUntil(t, faultWait, "the endpoint disabled by its 410", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_endpoints WHERE NOT enabled AND disabled_reason LIKE '%410%'`) == 1
	})
	pollUntil(t, faultWait, "the delivery dead-lettered with its endpoint", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1 AND endpoint_id = $2`, id, ep.ID) == 1
	})
	list := runCLI(t, db.URL, "endpoints", "list", "--json")
	var eps []struct {
		ID             string `json:"id"`
		Enabled        bool   `json:"enabled"`
		DisabledReason string `json:"disabled_reason"`
	}
	if err := json.Unmarshal([]byte(list.stdout), &eps); err != nil || len(eps) != 1 || eps[0].Enabled || eps[0].DisabledReason == "" {
		t.Fatalf("endpoints list --json = %q (%v); want the endpoint disabled with its reason", list.stdout, err)
	}

	healthy.Store(true)
	if r := runCLI(t, db.URL, "endpoints", "enable", ep.ID); r.code != 0 {
		t.Fatalf("endpoints enable exited %d: %s", r.code, r.stderr)
	}
	dl := queryInt(t, db, `SELECT id FROM webhook_dead_letter WHERE delivery_id = $1`, id)
	if r := runCLI(t, db.URL, "dlq", "replay", strconv.Itoa(dl)); r.code != 0 {
		t.Fatalf("dlq replay exited %d: %s", r.code, r.stderr)
	}
	pollUntil(t, faultWait, "the replayed event delivered to the re-enabled endpoint", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND endpoint_id = $2 AND status_code = 200`, id, ep.ID) == 1
	})
	var ids []string
	for _, r := range c.requests() {
		ids = append(ids, r.DeliveryID)
	}
	if len(ids) != 2 || ids[0] != id || ids[1] != id {
		t.Errorf("the consumer got %v, want the event twice (the 410, then the replay) with its one delivery id", ids)
	}
	p.stopCleanly()
}

// TestUpgradeFromSchema3WithPendingRows: a database on schema 3 with pending rows (due, leased
// by a dispatcher that is gone, and a retry scheduled shortly) is migrated in place to the
// current schema; serve then delivers every pending row exactly once, and nothing that was
// already delivered is sent again.
func TestUpgradeFromSchema3WithPendingRows(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigratedTo(t, 3)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, processed, processed_at, status_code, created_at, lease_until, leased_by, attempt) VALUES
		('done', '{"n": 0}', true, now(), 200, now() - interval '1 hour', NULL, NULL, 1),
		('due', '{"n": 1}', false, NULL, NULL, now() - interval '1 minute', NULL, NULL, 1),
		('leased', '{"n": 2}', false, NULL, NULL, now() - interval '1 minute', now() - interval '1 second', 'gone-instance', 1),
		('retry', '{"n": 3}', false, NULL, NULL, now() + interval '1 second', NULL, NULL, 2)`); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, db.URL, "migrate"); r.code != 0 {
		t.Fatalf("migrate exited %d: %s", r.code, r.stderr)
	}
	if v, err := fluxsql.CurrentVersion(ctx, db.Pool); err != nil || v != fluxsql.LatestVersion() {
		t.Fatalf("schema version %d, %v; want %d", v, err, fluxsql.LatestVersion())
	}
	c := newHookConsumer(t, nil)
	p := startServe(t, "serve", faultEnv(db.URL, c.URL()))
	p.instanceID()
	pollUntil(t, faultWait, "the three pending rows delivered", func() bool {
		_, _, ok := c.counts()
		return ok == 3
	})
	p.stopCleanly()
	seen := map[string]int{}
	for _, r := range c.requests() {
		seen[r.Event]++
	}
	for _, e := range []string{"due", "leased", "retry"} {
		if seen[e] != 1 {
			t.Errorf("%s delivered %d times, want once", e, seen[e])
		}
	}
	if seen["done"] != 0 {
		t.Error("a row delivered before the upgrade was sent again")
	}
}

// TestReplayWaivesTheFilterAndCreationTime: dead letters of an acme event enqueued an hour
// ago, of a type no endpoint's filter names now, are replayed by the commands: one to its own
// endpoint, whose filter no longer names it, the other with --to-endpoint to an endpoint
// created after the event. serve delivers both, each once: the request for a managed endpoint
// is built only for an event its filter and creation time admit, except a replay, which an
// operator sends on purpose (the tenant still has to match).
func TestReplayWaivesTheFilterAndCreationTime(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	c := newHookConsumer(t, func(context.Context, *hookRequest) int { return http.StatusOK })
	var ids [2]string
	for i := range ids {
		r := runCLI(t, db.URL, "endpoints", "add", "--url", c.URL(), "--secret", serveSecret, "--tenant", "acme",
			"--event-types", "shipping.*", "--json")
		var ep struct{ ID string }
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ep) != nil || ep.ID == "" {
			t.Fatalf("endpoints add exited %d: %s%s", r.code, r.stdout, r.stderr)
		}
		ids[i] = ep.ID
	}
	own, other := ids[0], ids[1]
	var toOwn, toOther int64
	var ownDelivery, otherDelivery string
	for _, d := range []struct {
		id       *int64
		delivery *string
	}{{&toOwn, &ownDelivery}, {&toOther, &otherDelivery}} {
		if err := db.Pool.QueryRow(context.Background(), `
			INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, reason, enqueued_at, tenant, endpoint_id)
			VALUES (gen_random_uuid(), 'invoice.paid', '{"n": 1}', 3, 'attempts exhausted', now() - interval '1 hour', 'acme', $1::uuid)
			RETURNING id, delivery_id::text`, own).Scan(d.id, d.delivery); err != nil {
			t.Fatal(err)
		}
	}
	env := faultEnv(db.URL, "")
	delete(env, "WEBHOOK_URL")
	p := startServe(t, "serve", env)
	p.instanceID()
	for _, args := range [][]string{{strconv.FormatInt(toOwn, 10)}, {"--to-endpoint", other, strconv.FormatInt(toOther, 10)}} {
		if r := runCLI(t, db.URL, append([]string{"dlq", "replay"}, args...)...); r.code != 0 {
			t.Fatalf("dlq replay %v exited %d: %s%s", args, r.code, r.stdout, r.stderr)
		}
	}
	pollUntil(t, faultWait, "both replays delivered", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND endpoint_id = $2 AND status_code = 200`, ownDelivery, own) == 1 &&
			queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND endpoint_id = $2 AND status_code = 200`, otherDelivery, other) == 1
	})
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE replayed_at IS NULL`); n != 0 {
		t.Errorf("%d replays were dead-lettered again, want none", n)
	}
	if n := len(c.requests()); n != 2 {
		t.Errorf("the consumer got %d requests, want the two replays", n)
	}
	p.stopCleanly()
}
