package main

import (
	"context"
	"testing"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestUpgradeToTheDeliveryLog: a database on schema 6, whose outbox holds the delivery log
// (processed rows, one of them past retention) next to pending rows (due, leased by a
// dispatcher that is gone, a retry due shortly), is migrated in place to schema 7. serve then
// delivers every pending row exactly once into the new log, sends nothing that was delivered
// before, leaves the queue empty, shows the old rows through webhook_deliveries, and its
// janitor deletes the old row past retention.
func TestUpgradeToTheDeliveryLog(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigratedTo(t, 6)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, processed, processed_at, status_code, created_at, lease_until, leased_by, attempt) VALUES
		('done', '{"n": 0}', true, now() - interval '1 minute', 200, now() - interval '1 hour', NULL, NULL, 1),
		('expired', '{"n": 1}', true, now() - interval '2 hours', 200, now() - interval '3 hours', NULL, NULL, 1),
		('due', '{"n": 2}', false, NULL, NULL, now() - interval '1 minute', NULL, NULL, 1),
		('leased', '{"n": 3}', false, NULL, NULL, now() - interval '1 minute', now() - interval '1 second', 'gone-instance', 1),
		('retry', '{"n": 4}', false, NULL, NULL, now() + interval '1 second', NULL, NULL, 2)`); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, db.URL, "migrate"); r.code != 0 {
		t.Fatalf("migrate exited %d: %s", r.code, r.stderr)
	}
	if v, err := fluxsql.CurrentVersion(ctx, db.Pool); err != nil || v != fluxsql.LatestVersion() {
		t.Fatalf("schema version %d, %v; want %d", v, err, fluxsql.LatestVersion())
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_deliveries`); n != 5 {
		t.Fatalf("webhook_deliveries shows %d rows after the upgrade, want the 5 rows of the old table", n)
	}

	c := newHookConsumer(t, nil)
	env := faultEnv(db.URL, c.URL())
	env["WEBHOOK_RETENTION"] = "1h"
	p := startServe(t, "serve", env)
	p.instanceID()
	pollUntil(t, faultWait, "the three pending rows delivered and the expired row pruned", func() bool {
		_, _, ok := c.counts()
		return ok == 3 && queryInt(t, db, `SELECT count(*) FROM webhook_outbox WHERE event_type = 'expired'`) == 0
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
	if seen["done"]+seen["expired"] != 0 {
		t.Error("a row delivered before the upgrade was sent again")
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_outbox WHERE NOT processed`); n != 0 {
		t.Errorf("%d rows left in the queue, want none", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE status_code = 200 AND event_type IN ('due', 'leased', 'retry')`); n != 3 {
		t.Errorf("the new log holds %d of the 3 deliveries", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE processed AND event_type = 'done' AND status_code = 200`); n != 1 {
		t.Errorf("the row delivered before the upgrade: %d in webhook_deliveries, want 1 (kept until its retention)", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_delivery_log_default`); n != 0 {
		t.Errorf("%d rows in the default partition: serve creates the partitions before its first settle", n)
	}
}
