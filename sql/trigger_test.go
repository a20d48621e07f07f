package sql_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestTriggerNotifiesOnlyWhileArmed checks the trigger directly: producers' inserts NOTIFY
// only while the switch an idle dispatcher sets (webhook_outbox_notify_until) lies in the
// future, once per statement, and never once it has lapsed (every dispatcher busy), which is
// what keeps NOTIFY's commit lock off the producers under load.
func TestTriggerNotifiesOnlyWhileArmed(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN webhook_outbox"); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	insert := `INSERT INTO webhook_outbox (event_type, payload) VALUES ('e', '{}')`
	insertMany := `INSERT INTO webhook_outbox (event_type, payload) SELECT 'e', '{}' FROM generate_series(1, 5)`

	announce := func(ms int) {
		t.Helper()
		exec(`SELECT setval('webhook_outbox_notify_until', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + ` + strconv.Itoa(ms) + `)`)
	}
	exec(insert)     // no dispatcher ever announced: no NOTIFY
	announce(-1000)  // a switch that lapsed a second ago (the dispatcher turned busy)
	exec(insert)     // no NOTIFY
	announce(60_000) // an idle dispatcher waiting for work
	exec(insert)     // one NOTIFY
	exec(insertMany) // statement-level: one NOTIFY for five rows
	// A dispatcher's own inserts (retries, deferrals) notify no one.
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL fluxhook.dispatcher = 'on'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insert)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	announce(-1) // lapsed again: none
	exec(insert)
	// A sentinel of our own marks the end: notifications arrive in commit order, so every
	// trigger NOTIFY sent above has been received by the time the sentinel is.
	exec(`SELECT pg_notify('webhook_outbox', 'sentinel')`)

	var fromTrigger int
	seen := map[string]bool{}
	for {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := listener.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for notifications: %v", err)
		}
		if n.Payload == "sentinel" {
			break
		}
		// The payload is the producer's transaction id, which the dispatcher compares with its
		// claims' snapshots; one id per transaction.
		if xid, err := strconv.ParseUint(n.Payload, 10, 64); err != nil || xid == 0 {
			t.Fatalf("trigger payload %q, want the producer's transaction id", n.Payload)
		}
		if seen[n.Payload] {
			t.Fatalf("two notifications with payload %q: one transaction notified twice", n.Payload)
		}
		seen[n.Payload] = true
		fromTrigger++
	}
	if fromTrigger != 2 {
		t.Fatalf("trigger sent %d notifications, want 2 (one per statement while the switch was set)", fromTrigger)
	}
}

// TestTriggerNeedsNoGrantBeyondInsert inserts as a role that may only insert into the outbox:
// the trigger's WHEN reads the NOTIFY switch, and a producer must never fail because of it.
func TestTriggerNeedsNoGrantBeyondInsert(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	role := sqltest.NewRole(t, db)
	exec := func(sql string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`GRANT INSERT ON webhook_outbox TO ` + role)
	exec(`SELECT setval('webhook_outbox_notify_until', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 60000)`)
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('e', '{}')`)
		return err
	})
	if err != nil {
		t.Fatalf("insert as a role with only INSERT on webhook_outbox: %v", err)
	}
	// A producer whose search_path does not include fluxhook's schema names the table with
	// its schema; the trigger's condition must still find the switch.
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL search_path = pg_catalog`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO public.webhook_outbox (event_type, payload) VALUES ('e', '{}')`)
		return err
	})
	if err != nil {
		t.Fatalf("insert from a session whose search_path lacks fluxhook's schema: %v", err)
	}
}
