package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestRideClaimRefusedAtCommit: a claim sharing a round trip whose transaction fails at its
// commit (the Sync after it: here a deferred constraint trigger, once) must undo only itself.
// The settle sent after it committed in a transaction of its own: its answer must be read, not
// lost (going again alone then finds its own rows settled and reports them stale).
func TestRideClaimRefusedAtCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `
		CREATE SEQUENCE refuse_commit START 100;
		CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			-- Every other claim, eight times (each a claim's own, so that backoff resets):
			-- most likely at least one carries a settle.
			IF nextval('refuse_commit') IN (2, 4, 6, 8, 10, 12, 14, 16) THEN
				RAISE EXCEPTION 'claim refused at commit' USING ERRCODE = '40001';
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER refuse_commit AFTER UPDATE ON webhook_outbox
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
			WHEN (NEW.lease_token IS NOT NULL AND NEW.lease_token IS DISTINCT FROM OLD.lease_token)
			EXECUTE FUNCTION refuse_commit();`); err != nil {
		t.Fatal(err)
	}
	const n = 40
	c := newConsumer(t, chain(b, n))
	cfg, logs := b.observedConfig(c.URL(), zapcore.WarnLevel)
	d := b.start(cfg)
	b.enqueue(outbox.Event{EventType: "test.chain"})
	eventually(t, 30*time.Second, "a settle sharing a claim's round trip", func() bool { return d.Stats().SharedSettles.Load() > 0 })
	b.count(`SELECT count(*) FROM setval('refuse_commit', 1, false)`)
	checkChain(t, b, c, n)
	if logs.FilterMessage("claim failed").Len() == 0 {
		t.Fatal("no claim was refused: the test proves nothing")
	}
	for _, e := range logs.FilterMessage("settle sent with a claim failed; it goes again alone").All() {
		t.Errorf("shared settle failed after its claim was refused at commit: %v", e.ContextMap())
	}
	if s := d.Stats(); s.Stale.Load() != 0 || s.SettleErrors.Load() != 0 {
		t.Errorf("%d outcomes reported stale and %d settles failed, want none", s.Stale.Load(), s.SettleErrors.Load())
	}
}

// TestStopDuringASlowSharedSettle: Stop while a settle that shares a claim's round trip is
// still running. The claiming loop ends (its context, the pipeline's, is cancelled) before the
// settling stage has read the settle's answer: that must not cut the settle's read short, or
// the settle goes again alone, finds its rows settled, and reports them stale.
func TestStopDuringASlowSharedSettle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `
		CREATE TABLE slow_settle (on_ boolean NOT NULL);
		INSERT INTO slow_settle VALUES (false);
		CREATE FUNCTION slow_settle() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT on_ FROM slow_settle) THEN
				PERFORM pg_sleep(0.4);
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER slow_settle BEFORE INSERT ON webhook_delivery_log FOR EACH STATEMENT EXECUTE FUNCTION slow_settle();`); err != nil {
		t.Fatal(err)
	}
	inner := chain(b, 100000)
	c := newConsumer(t, inner)
	cfg, logs := b.observedConfig(c.URL(), zapcore.WarnLevel)
	d := b.start(cfg)
	b.enqueue(outbox.Event{EventType: "test.chain"})
	eventually(t, 30*time.Second, "a settle sharing a claim's round trip", func() bool { return d.Stats().SharedSettles.Load() > 0 })
	b.count(`WITH u AS (UPDATE slow_settle SET on_ = true RETURNING 1) SELECT count(*) FROM u`)
	time.Sleep(600 * time.Millisecond) // a slow settle is under way
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for _, e := range logs.FilterMessage("settle sent with a claim failed; it goes again alone").All() {
		t.Errorf("shared settle failed at Stop: %v", e.ContextMap())
	}
	arrived := len(c.byDelivery())
	if got := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE status_code = 204`); got != arrived {
		t.Errorf("%d deliveries logged after Stop, %d arrived", got, arrived)
	}
	if s := d.Stats(); s.Stale.Load() != 0 || s.SettleErrors.Load() != 0 {
		t.Errorf("%d outcomes reported stale and %d settles failed, want none", s.Stale.Load(), s.SettleErrors.Load())
	}
}

// TestRideAcrossAddedColumns: columns are added and dropped under live traffic (the
// prepared statements are replanned): the
// dispatcher recovers (the pipeline's statements are prepared afresh) and delivers every event
// once, with a bounded number of failed claims.
func TestRideAcrossAddedColumns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 80
	c := newConsumer(t, chain(b, n))
	cfg, logs := b.observedConfig(c.URL(), zapcore.WarnLevel)
	d := b.start(cfg)
	b.enqueue(outbox.Event{EventType: "test.chain"})
	eventually(t, 30*time.Second, "a settle sharing a claim's round trip", func() bool { return d.Stats().SharedSettles.Load() > 0 })
	for _, ddl := range []string{
		`ALTER TABLE webhook_outbox ADD COLUMN review_extra text`,
		`ALTER TABLE webhook_outbox DROP COLUMN review_extra`,
		`ALTER TABLE webhook_delivery_log ADD COLUMN review_extra text DEFAULT 'x'`,
	} {
		if _, err := b.pool.Exec(context.Background(), ddl); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	checkChain(t, b, c, n)
	if got := logs.FilterMessage("claim failed").Len(); got > 0 {
		t.Errorf("%d claims failed after the type change, want a few at most", got)
	}
	t.Logf("claim failed %d, shared failed %d, shared %d", logs.FilterMessage("claim failed").Len(),
		logs.FilterMessage("settle sent with a claim failed; it goes again alone").Len(), d.Stats().SharedSettles.Load())
}
