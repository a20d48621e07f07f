package dispatcher_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/dispatcher"
)

// The dispatcher's plans are generic and made once per connection. Made on an empty table
// they used to be sequential scans, kept as the table grew: every claim and settle then read
// the whole table. This test makes the plans on an almost empty table, grows it, has the
// same connections deliver more events, and checks in PostgreSQL's own counters that
// webhook_outbox was never scanned sequentially.
func TestPlansMadeOnAnEmptyTableStayOnIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	d := b.start(b.config(c.URL()))
	ctx := context.Background()

	// One delivery makes every statement of the delivery path prepare its plan now.
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the first delivery", func() bool { return c.received() == 1 })

	// Grow the table the way weeks of traffic did before schema 7 (processed rows kept in the
	// outbox for the retention, as an upgraded installation still has them), then give the
	// dispatcher due rows among them.
	if _, err := b.pool.Exec(ctx, `
		INSERT INTO webhook_outbox (event_type, payload, processed, processed_at)
		SELECT 'old.event', '{}', true, now() FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	const due = 300
	if _, err := b.pool.Exec(ctx, `
		INSERT INTO webhook_outbox (event_type, payload)
		SELECT 'test.event', '{"n": 1}' FROM generate_series(1, $1::int)`, due); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "every due row delivered", func() bool { return c.received() == 1+due })

	// Stopping closes the dispatcher's connections; their backends report their counters
	// as they exit. Every claim updates its rows and every settle deletes them (schema 7), so
	// once the writes of all 301 deliveries (a lease and a settle each) are counted, so are
	// the scans that found them.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := d.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	// Counted as rows read by sequential scans, not as scans: the migration's CREATE INDEX
	// statements count as sequential scans of the (then empty) table, reported whenever the
	// migrating connection flushes its statistics, which may be during this test.
	var seqRead, updates int64
	eventually(t, 20*time.Second, "the dispatcher's table statistics", func() bool {
		if err := b.pool.QueryRow(ctx, `
			SELECT seq_tup_read, n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE relname = 'webhook_outbox'`).
			Scan(&seqRead, &updates); err != nil {
			t.Fatal(err)
		}
		return updates >= 2*(1+due)
	})
	if seqRead != 0 {
		t.Fatalf("sequential scans read %d rows of webhook_outbox while %d rows were claimed and settled; "+
			"the dispatcher's generic plans must reach rows through indexes", seqRead, 1+due)
	}
}

// While a backlog drains, claims start after the previous batch (claim.Cursor). A row that
// turns up behind that position, here one whose due time lies an hour back (as a peer's
// expired lease or a long producer transaction's row would), must not wait for the drain to
// end: a claim from the head comes at least every claim.CursorMaxAge.
func TestRowBehindTheCursorIsDeliveredDuringADrain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(arrival, http.ResponseWriter) { time.Sleep(time.Millisecond) })
	cfg := b.config(c.URL())
	cfg.EndpointConcurrency = 4 // at most ~4,000 deliveries/s: the drain lasts seconds
	ctx := context.Background()
	const backlog = 15000
	if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload)
		SELECT 'test.event', '{}' FROM generate_series(1, $1::int)`, backlog); err != nil {
		t.Fatal(err)
	}
	b.start(cfg)
	eventually(t, 20*time.Second, "the drain to be under way", func() bool { return c.received() >= 500 })
	var late string
	if err := b.pool.QueryRow(ctx, `INSERT INTO webhook_outbox (event_type, payload, created_at)
		VALUES ('late.event', '{}', now() - interval '1 hour') RETURNING delivery_id::text`).Scan(&late); err != nil {
		t.Fatal(err)
	}
	inserted := time.Now()
	eventually(t, 60*time.Second, "the late row's delivery", func() bool { return len(c.byDelivery()[late]) > 0 })
	arrivedAfter := 0
	for i, a := range c.arrivals() {
		if a.DeliveryID == late {
			arrivedAfter = i
			break
		}
	}
	if left := backlog + 1 - (arrivedAfter + 1); left < 1000 {
		t.Fatalf("the row behind the cursor arrived %s after it was inserted, with only %d of the backlog left: "+
			"it waited for the drain instead of the next claim from the head", c.arrivals()[arrivedAfter].At.Sub(inserted), left)
	}
}

// With sequential scans off, a statement that must scan a table anyway (loading every
// endpoint) is costed past jit_above_cost, and PostgreSQL compiled it with LLVM: 155 ms to
// load 10 endpoints at every start and endpoint change. The dispatcher's sessions turn JIT
// off; the first half shows the compilation the setting prevents, where the server has JIT.
func TestSessionsNeverCompileStatementsWithJIT(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_endpoints (url, secret)
		SELECT 'http://127.0.0.1:1/ep/' || i, 's' FROM generate_series(1, 10) i`); err != nil {
		t.Fatal(err)
	}
	compiled := func(override map[string]string) bool {
		cfg, err := pgx.ParseConfig(db.URL)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range override {
			cfg.RuntimeParams[k] = v
		}
		dispatcher.SessionParams(cfg.RuntimeParams, false)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var plan string
		if err := conn.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM webhook_endpoints ORDER BY created_at, id`).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		return strings.Contains(plan, `"JIT"`)
	}
	var available bool
	if err := db.Pool.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if available && !compiled(map[string]string{"jit": "on"}) {
		t.Error("with JIT on, the endpoints' scan was not compiled: this test no longer shows what jit=off prevents")
	}
	if compiled(nil) {
		t.Error("the dispatcher's session compiled the endpoints' scan with JIT")
	}
}
