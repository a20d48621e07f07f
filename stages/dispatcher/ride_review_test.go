package dispatcher_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/dispatcher"
)

// TestSettleDoesNotWaitForAClaimThatWaitsForItsSlots: with WEBHOOK_MAX_IN_FLIGHT=1 the
// claiming loop, once it holds its one row, waits for that row's settle to free the slot; a
// settle that waits for the next claim meanwhile waits for nothing (no claim can come before
// it frees the slot), and every event of a backlog pays rideWait: at the real 5 ms, a drain
// with MaxInFlight 1 went from 1.7–3.6 ms per event to 9–10 ms on the shared 2-core test
// machine. rideWait is lengthened here so that the stall stands out from the machine's noise.
func TestSettleDoesNotWaitForAClaimThatWaitsForItsSlots(t *testing.T) {
	wait := 200 * time.Millisecond
	t.Cleanup(dispatcher.SetRideWait(wait)) // not parallel: every dispatcher reads it
	b := setup(t)
	const n = 15
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_outbox (event_type, payload) SELECT 'test.event', '{"n": 1}' FROM generate_series(1, $1)`, n); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) })
	cfg := b.config(c.URL())
	cfg.MaxInFlight, cfg.BatchSize = 1, 1
	d := b.start(cfg)
	// Timed from the first arrival: starting (partitions, warm-up) is not the drain.
	eventually(t, 10*time.Second, "the first delivery", func() bool { return c.received() > 0 })
	began := time.Now()
	b.waitSettled(60 * time.Second)
	took := time.Since(began)
	if limit := n * wait / 2; took >= limit {
		t.Fatalf("%d events drained with MaxInFlight 1 in %s, want under %s: each settle waited rideWait (%s) for a claim that waited for its slot (%d settles, %d shared)",
			n, took, limit, wait, d.Stats().Settles.Load(), d.Stats().SharedSettles.Load())
	}
}

// TestOrderedStreamDoesNotWaitForAClaimItsSettleWakes: one ordered stream's backlog goes one
// event at a time, and the claim that takes the next event is woken by the settle of the one
// before (its stream moved). A settle that first waits for a claim to ride waits for one that
// it alone would wake, and every event of the stream pays rideWait: at the real 5 ms, one
// stream's drain went from 2.5–2.7 ms per event to 9.1–9.3 ms (no race detector), and no
// settle shared a claim. rideWait is lengthened here so that the stall stands out.
func TestOrderedStreamDoesNotWaitForAClaimItsSettleWakes(t *testing.T) {
	wait := 200 * time.Millisecond
	t.Cleanup(dispatcher.SetRideWait(wait)) // not parallel: every dispatcher reads it
	b := setup(t)
	const n = 15
	b.insertStreams("o", 1, n)
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) })
	cfg := b.config(c.URL())
	cfg.Ordering = true
	d := b.start(cfg)
	eventually(t, 10*time.Second, "the first delivery", func() bool { return c.received() > 0 })
	began := time.Now()
	b.waitSettled(60 * time.Second)
	took := time.Since(began)
	checkStreamOrder(t, c, false, func(arrival) bool { return false })
	if limit := n * wait / 2; took >= limit {
		t.Fatalf("one stream of %d events drained in %s, want under %s: each head's settle waited rideWait (%s) for a claim that only it wakes (%d settles, %d shared)",
			n, took, limit, wait, d.Stats().Settles.Load(), d.Stats().SharedSettles.Load())
	}
}

// TestSharedRoundTripWhoseClaimFails: the claim part of a shared round trip fails (a
// statement timeout, or its connection killed), which undoes the settle before it. The settle
// must go again alone and the claim again, so that every event is delivered once, settled
// once (not reported stale), and nothing waits for a lease.
func TestSharedRoundTripWhoseClaimFails(t *testing.T) {
	for _, tc := range []struct{ name, fail string }{
		{"statement timeout", `RAISE EXCEPTION 'canceling statement due to statement timeout' USING ERRCODE = '57014';`},
		{"connection killed", `PERFORM pg_terminate_backend(pg_backend_pid());`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// A delivery log row marks its transaction; a claim (an update that sets a lease
			// token) in a transaction so marked is a claim sharing a settle's round trip: the
			// first three such claims fail.
			if _, err := b.pool.Exec(context.Background(), `
				CREATE SEQUENCE fail_shared;
				CREATE FUNCTION mark_settle() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					PERFORM set_config('review.settled', 'on', true);
					RETURN NULL;
				END $$;
				CREATE TRIGGER mark_settle AFTER INSERT ON webhook_delivery_log FOR EACH ROW EXECUTE FUNCTION mark_settle();
				CREATE FUNCTION fail_shared() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					IF current_setting('review.settled', true) = 'on' AND nextval('fail_shared') <= 3 THEN
						`+tc.fail+`
					END IF;
					RETURN NEW;
				END $$;
				CREATE TRIGGER fail_shared BEFORE UPDATE ON webhook_outbox FOR EACH ROW
					WHEN (NEW.lease_token IS NOT NULL AND NEW.lease_token IS DISTINCT FROM OLD.lease_token)
					EXECUTE FUNCTION fail_shared();`); err != nil {
				t.Fatal(err)
			}
			const n = 60
			c := newConsumer(t, chain(b, n))
			cfg, logs := b.observedConfig(c.URL(), zapcore.WarnLevel)
			d := b.start(cfg)
			b.enqueue(outbox.Event{EventType: "test.chain"})
			eventually(t, 30*time.Second, "every chained event delivered", func() bool { return len(c.byDelivery()) == n })
			b.waitSettled(10 * time.Second) // well inside the rows' lease (2 × 5 s + 30 s)
			if b.count(`SELECT count(*) FROM pg_sequences WHERE sequencename = 'fail_shared' AND last_value >= 1`) == 0 {
				t.Skip("no claim shared a settle's round trip on this run")
			}
			failed := logs.FilterMessage("settle and claim failed together; each goes again alone").Len()
			if failed == 0 {
				t.Errorf("a shared claim failed, but the dispatcher did not say so")
			}
			t.Logf("%d shared round trips failed; %d settles shared a claim's round trip", failed, d.Stats().SharedSettles.Load())
			for id, got := range c.byDelivery() {
				if len(got) != 1 {
					t.Errorf("delivery %s arrived %d times", id, len(got))
				}
			}
			if got := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE status_code = 204`); got != n {
				t.Errorf("%d deliveries logged, want %d", got, n)
			}
			if got := b.count(`SELECT count(*) FROM webhook_dead_letter`); got != 0 {
				t.Errorf("%d dead letters, want none", got)
			}
			if s := d.Stats(); s.Stale.Load() != 0 || s.SettleErrors.Load() != 0 {
				t.Errorf("%d outcomes reported stale and %d settles failed, want none", s.Stale.Load(), s.SettleErrors.Load())
			}
		})
	}
}

// TestStopWhileASettleWaitsToRide: Stop under live traffic, while settles wait to ride the
// claiming loop's claims, drains promptly and settles every delivery that was sent.
func TestStopWhileASettleWaitsToRide(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var answered atomic.Int64
	inner := chain(b, 100000)
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		inner(a, w)
		answered.Add(1)
	})
	d := b.start(b.config(c.URL()))
	b.enqueue(outbox.Event{EventType: "test.chain"})
	eventually(t, 30*time.Second, "50 chained deliveries", func() bool { return answered.Load() >= 50 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	began := time.Now()
	if err := d.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("Stop took %s under light traffic, want under 1 s", took)
	}
	arrived := len(c.byDelivery())
	if got := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE status_code = 204`); got != arrived {
		t.Errorf("%d deliveries logged after Stop, %d arrived", got, arrived)
	}
	if got := b.count(`SELECT count(*) FROM webhook_outbox WHERE lease_until > now()`); got != 0 {
		t.Errorf("%d rows still leased after a drain that finished", got)
	}
	if s := d.Stats(); s.Stale.Load() != 0 || s.SettleErrors.Load() != 0 {
		t.Errorf("%d stale, %d settle errors", s.Stale.Load(), s.SettleErrors.Load())
	}
}
