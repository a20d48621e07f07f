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

// TestSharedRoundTripWhoseConnectionDies: the connection of a round trip a settle shares dies
// during the claim (killed from inside it), before the settle runs. The claim is undone and
// retried, the settle goes again alone, and every event is delivered once and settled once (not
// reported stale), without waiting for a lease.
func TestSharedRoundTripWhoseConnectionDies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `
		CREATE SEQUENCE kill_claim START 4;
		CREATE FUNCTION kill_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('kill_claim') <= 3 THEN
				PERFORM pg_terminate_backend(pg_backend_pid());
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER kill_claim BEFORE UPDATE ON webhook_outbox FOR EACH ROW
			WHEN (NEW.lease_token IS NOT NULL AND NEW.lease_token IS DISTINCT FROM OLD.lease_token)
			EXECUTE FUNCTION kill_claim();`); err != nil {
		t.Fatal(err)
	}
	const n = 60
	c := newConsumer(t, chain(b, n))
	cfg, logs := b.observedConfig(c.URL(), zapcore.WarnLevel)
	d := b.start(cfg)
	b.enqueue(outbox.Event{EventType: "test.chain"})
	// Armed once settles ride, so that the killed claims are, most likely, ones a settle rides.
	eventually(t, 30*time.Second, "a settle sharing a claim's round trip", func() bool { return d.Stats().SharedSettles.Load() > 0 })
	b.count(`SELECT count(*) FROM setval('kill_claim', 1, false)`)
	checkChain(t, b, c, n)
	if s := d.Stats(); s.Stale.Load() != 0 || s.SettleErrors.Load() != 0 {
		t.Errorf("%d outcomes reported stale and %d settles failed, want none", s.Stale.Load(), s.SettleErrors.Load())
	}
	if logs.FilterMessage("settle sent with a claim failed; it goes again alone").Len() == 0 {
		t.Skip("no killed claim carried a settle on this run")
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
