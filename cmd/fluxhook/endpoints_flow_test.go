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
