package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestTwoPhaseProducer: PostgreSQL refuses to PREPARE a transaction that sent a NOTIFY, which
// the insert trigger does while a dispatcher waits for work; a producer that runs
// `SET LOCAL fluxhook.dispatcher = on` first (as docs/configuration.md says) prepares and
// commits, and its event is delivered by the dispatcher's next claim. The test's own cluster
// allows prepared transactions (the shared test server does not).
func TestTwoPhaseProducer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster, db := migratedCluster(t, ctx, map[string]string{"max_prepared_transactions": "4"})
	pool := db.Pool

	c := newHookConsumer(t, nil)
	env := serveEnv(cluster.URL(), c.URL())
	env["WEBHOOK_POLL_INTERVAL_MS"] = "500" // the event without a NOTIFY is found by the poll at the latest
	p := startServe(t, "serve", env)
	p.instanceID()
	pollUntil(t, faultWait, "the dispatcher to wait for work, producers to NOTIFY", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_dispatcher WHERE armed`) == 1 &&
			queryInt(t, db, `SELECT CASE WHEN webhook_outbox_notify_wanted() THEN 1 ELSE 0 END`) == 1
	})

	prepare := func(name string, setLocal bool) error {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		stmts := []string{"BEGIN"}
		if setLocal {
			stmts = append(stmts, "SET LOCAL fluxhook.dispatcher = on")
		}
		stmts = append(stmts, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('test.2pc', '{"n": 1}')`,
			"PREPARE TRANSACTION '"+name+"'")
		for _, s := range stmts {
			if _, err := conn.Exec(ctx, s); err != nil {
				_, _ = conn.Exec(ctx, "ROLLBACK")
				return err
			}
		}
		_, err = conn.Exec(ctx, "COMMIT PREPARED '"+name+"'")
		return err
	}
	if err := prepare("plain", false); err == nil || !strings.Contains(err.Error(), "NOTIFY") {
		t.Fatalf("a two-phase producer without SET LOCAL prepared: %v; want PostgreSQL's refusal (the trigger sent a NOTIFY)", err)
	}
	if err := prepare("local", true); err != nil {
		t.Fatalf("a two-phase producer with SET LOCAL fluxhook.dispatcher = on: %v", err)
	}
	pollUntil(t, faultWait, "the two-phase producer's event delivered", func() bool {
		_, _, ok := c.counts()
		return ok == 1
	})
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_deliveries`); n != 1 {
		t.Errorf("%d outbox rows, want the one committed event (the refused one rolled back)", n)
	}
	p.stopCleanly()
}

// TestOrderedStreamAcrossAPreparedProducerAndARestart: under WEBHOOK_ORDERING=stream, a
// producer inserts event 1 of a stream and prepares its transaction (after SET LOCAL
// fluxhook.dispatcher = on, as docs/configuration.md says); a second producer commits event 2
// of the stream; PostgreSQL restarts, the prepared transaction with it (its lock now under
// another virtual transaction id). Event 2 waits until COMMIT PREPARED, and the consumer gets
// 1 then 2. Events without a stream meanwhile show the dispatcher claiming after the restart.
func TestOrderedStreamAcrossAPreparedProducerAndARestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster, db := migratedCluster(t, ctx, map[string]string{"max_prepared_transactions": "4"})
	c := newHookConsumer(t, nil)
	env := serveEnv(cluster.URL(), c.URL())
	env["WEBHOOK_ORDERING"] = "stream"
	env["WEBHOOK_POLL_INTERVAL_MS"] = "200"
	p := startServe(t, "serve", env)
	p.instanceID()

	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var first string
	for _, s := range []string{"BEGIN", "SET LOCAL fluxhook.dispatcher = on"} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := conn.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES ('s', 'test.first', '{}')
		RETURNING delivery_id::text`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	// A claim reads the horizon while the producer is an ordinary session, then it prepares.
	unordered := func(n int) {
		t.Helper()
		var id string
		if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('test.unordered', jsonb_build_object('n', $1::int))
			RETURNING delivery_id::text`, n).Scan(&id); err != nil {
			t.Fatal(err)
		}
		pollUntil(t, faultWait, "an event without a stream delivered", func() bool {
			for _, r := range c.requests() {
				if r.DeliveryID == id && r.Status == 200 {
					return true
				}
			}
			return false
		})
	}
	unordered(1)
	if _, err := conn.Exec(ctx, "PREPARE TRANSACTION 'first'"); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	var second string
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES ('s', 'test.second', '{}')
		RETURNING delivery_id::text`).Scan(&second); err != nil {
		t.Fatal(err)
	}
	unordered(2)
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	db.Pool.Reset()
	unordered(3)
	unordered(4)
	if _, err := db.Pool.Exec(ctx, "COMMIT PREPARED 'first'"); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, faultWait, "both events of the stream delivered", func() bool {
		_, _, ok := c.counts()
		return ok == 6
	})
	var order []string
	for _, r := range c.requests() {
		switch r.DeliveryID {
		case first:
			order = append(order, "first")
		case second:
			order = append(order, "second")
		}
	}
	if len(order) != 2 || order[0] != "first" {
		t.Errorf("the stream's events arrived as %v; want first, then second (the prepared producer's id is smaller)", order)
	}
	p.stopCleanly()
}
