package sql_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestWakeNotifiesOnlyWhileArmed checks the wake-up directly (schema 4: the DEFAULT of
// wake_notified): producers' inserts NOTIFY only while the switch an idle dispatcher sets
// (webhook_outbox_notify_until) lies in the future, once per transaction however many rows it
// inserts and by whichever statement (INSERT, INSERT … SELECT, COPY), and never once the switch
// has lapsed (every dispatcher busy), which is what keeps NOTIFY's commit lock off the
// producers under load. Only the rows whose insert sent a NOTIFY are marked.
func TestWakeNotifiesOnlyWhileArmed(t *testing.T) {
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
	insert := func(eventType string) string {
		return `INSERT INTO webhook_outbox (event_type, payload) VALUES ('` + eventType + `', '{}')`
	}
	announce := func(ms int) {
		t.Helper()
		exec(`SELECT setval('webhook_outbox_notify_until', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + ` + strconv.Itoa(ms) + `)`)
	}
	exec(insert("never-armed")) // no dispatcher ever announced: no NOTIFY
	announce(-1000)             // a switch that lapsed a second ago (the dispatcher turned busy)
	exec(insert("lapsed"))      // no NOTIFY
	announce(60_000)            // an idle dispatcher waiting for work
	exec(insert("armed"))       // one NOTIFY
	// Five rows in one statement: evaluated per row, but one transaction notifies once.
	exec(`INSERT INTO webhook_outbox (event_type, payload) SELECT 'armed-many', '{}' FROM generate_series(1, 5)`)
	// Two statements and a COPY in one transaction: still one NOTIFY.
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for _, et := range []string{"armed-tx", "armed-tx"} {
			if _, err := tx.Exec(ctx, insert(et)); err != nil {
				return err
			}
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"webhook_outbox"}, []string{"event_type", "payload"},
			pgx.CopyFromRows([][]any{{"armed-tx", "{}"}, {"armed-tx", "{}"}}))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// A producer that names the column supplies its own value: no NOTIFY (documented).
	exec(`INSERT INTO webhook_outbox (event_type, payload, wake_notified) VALUES ('named', '{}', NULL)`)
	// A dispatcher's own inserts (retries, deferrals) notify no one.
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL fluxhook.dispatcher = 'on'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insert("dispatcher"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	announce(-1) // lapsed again: none
	exec(insert("lapsed-again"))
	// A sentinel of our own marks the end: notifications arrive in commit order, so every
	// wake-up NOTIFY sent above has been received by the time the sentinel is.
	exec(`SELECT pg_notify('webhook_outbox', 'sentinel')`)

	var woken int
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
			t.Fatalf("wake-up payload %q, want the producer's transaction id", n.Payload)
		}
		if seen[n.Payload] {
			t.Fatalf("two notifications with payload %q: one transaction notified twice", n.Payload)
		}
		seen[n.Payload] = true
		woken++
	}
	if woken != 3 {
		t.Fatalf("the wake-up sent %d notifications, want 3 (one per transaction while the switch was set)", woken)
	}
	// The column says which rows' inserts notified: exactly the armed producers' ones.
	rows, err := db.Pool.Query(ctx, `SELECT event_type, count(*), count(*) FILTER (WHERE wake_notified) FROM webhook_outbox GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var et string
		var n, marked int
		err := r.Scan(&et, &n, &marked)
		return et + "=" + strconv.Itoa(marked) + "/" + strconv.Itoa(n), err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "[armed=1/1 armed-many=5/5 armed-tx=4/4 dispatcher=0/1 lapsed=0/1 lapsed-again=0/1 named=0/1 never-armed=0/1]"
	if fmt.Sprint(got) != want {
		t.Errorf("rows marked as notifying (marked/rows by event type) = %v, want %s", got, want)
	}
}

// fluxhookCall matches a call of one of fluxhook's own functions in a plan.
var fluxhookCall = regexp.MustCompile(`webhook_\w+\(`)

// TestWakeNeedsNoGrantBeyondInsert inserts as a role that may only insert into the outbox: the
// wake-up reads the NOTIFY switch, and a producer must never fail because of it.
func TestWakeNeedsNoGrantBeyondInsert(t *testing.T) {
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
	// The wake-up is cheap because it is an expression of the producer's own plan: built-in
	// functions evaluated per row, nothing of fluxhook's called. A function in the DEFAULT
	// would still work, only slower (README, Measurements); this is what notices.
	var plan []string
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `EXPLAIN (VERBOSE) INSERT INTO webhook_outbox (event_type, payload) VALUES ('e', '{}')`)
		if err != nil {
			return err
		}
		plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatalf("explaining a producer's insert: %v", err)
	}
	if text := strings.Join(plan, "\n"); !strings.Contains(text, "pg_notify(") || fluxhookCall.MatchString(text) {
		t.Errorf("the producer's plan does not hold the wake-up as an expression of built-in functions:\n%s", text)
	}
	// A producer whose search_path does not include fluxhook's schema names the table with
	// its schema; the wake-up must still find the switch.
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
