package sql_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestTriggerNotifiesOnlyWhileArmed checks the trigger directly: producers' inserts NOTIFY
// only while some dispatcher is armed (idle), once per statement, and never while every
// dispatcher is busy, which is what keeps NOTIFY's commit lock off the producers under load.
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

	exec(insert) // no dispatcher at all: no NOTIFY
	exec(`INSERT INTO webhook_dispatcher (instance_id, armed) VALUES ('busy', false)`)
	exec(insert) // a busy dispatcher: no NOTIFY
	exec(`INSERT INTO webhook_dispatcher (instance_id, armed) VALUES ('idle', true)`)
	exec(insert)     // armed: one NOTIFY
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
	exec(`UPDATE webhook_dispatcher SET armed = false`)
	exec(insert) // disarmed again: none
	// A sentinel of our own marks the end: notifications arrive in commit order, so every
	// trigger NOTIFY sent above has been received by the time the sentinel is.
	exec(`SELECT pg_notify('webhook_outbox', 'sentinel')`)

	var fromTrigger int
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
		if n.Payload != "" {
			t.Fatalf("trigger payload %q, want the constant empty payload", n.Payload)
		}
		fromTrigger++
	}
	if fromTrigger != 2 {
		t.Fatalf("trigger sent %d notifications, want 2 (one per statement while armed)", fromTrigger)
	}
}
