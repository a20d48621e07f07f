package dispatcher_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/sql/outbox"
)

// chain is a consumer's answer that, once a delivery is answered, commits the next event, up
// to n in all (the test commits the first): the answered delivery's settle then waits while
// the next event's claim runs, as under live traffic.
func chain(b *bundle, n int) func(a arrival, w http.ResponseWriter) {
	var made atomic.Int64
	made.Store(1)
	return func(a arrival, w http.ResponseWriter) {
		w.WriteHeader(http.StatusNoContent)
		w.(http.Flusher).Flush()
		if made.Add(1) > int64(n) {
			return
		}
		if _, err := outbox.Enqueue(context.Background(), b.pool, outbox.Event{EventType: "test.chain", Payload: map[string]any{"n": 1}}); err != nil {
			b.t.Errorf("enqueue: %v", err)
		}
	}
}

// checkChain waits until the chain's n events are delivered and settled, and fails the test
// unless each arrived once, was logged once as delivered, and nothing was dead-lettered.
func checkChain(t *testing.T, b *bundle, c *consumer, n int) {
	t.Helper()
	eventually(t, 30*time.Second, "every chained event delivered", func() bool { return len(c.byDelivery()) == n })
	b.waitSettled(10 * time.Second) // well inside the rows' lease (2 × 5 s + 30 s)
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
}

// TestSettlesShareTheNextClaimsRoundTrip: under live traffic a settle goes with the next
// claim in one round trip, and every event is still delivered once and logged once.
func TestSettlesShareTheNextClaimsRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 60
	c := newConsumer(t, chain(b, n))
	d := b.start(b.config(c.URL()))
	b.enqueue(outbox.Event{EventType: "test.chain"})
	checkChain(t, b, c, n)
	// Each next event is committed while the answered one's settle waits to ride (rideWait):
	// on a machine that keeps up most ride; one is enough to show the path works.
	if s := d.Stats(); s.SharedSettles.Load() == 0 {
		t.Fatalf("no settle shared a claim's round trip (%d settles, %d claims)", s.Settles.Load(), s.Claims.Load())
	}
}

// TestRefusedSharedSettleGoesAgainAlone: a settle that shares a claim's round trip and is
// refused (here by the delivery log, once) is undone alone: the claim sent with it keeps its
// rows, and the settle goes again on its own, so that nothing is lost or sent twice.
func TestRefusedSharedSettleGoesAgainAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `
		CREATE SEQUENCE refuse_once START 2;
		CREATE FUNCTION refuse_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			-- nextval is not undone with the refused transaction: each arming refuses once.
			IF nextval('refuse_once') = 1 THEN
				RAISE EXCEPTION 'refused once' USING ERRCODE = '40001';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_once BEFORE INSERT ON webhook_delivery_log FOR EACH ROW EXECUTE FUNCTION refuse_once();`); err != nil {
		t.Fatal(err)
	}
	const n = 40
	c := newConsumer(t, chain(b, n))
	cfg, logs := b.observedConfig(c.URL(), zapcore.WarnLevel)
	d := b.start(cfg)
	b.enqueue(outbox.Event{EventType: "test.chain"})
	// Armed once settles ride, so that the refused settle is, most likely, one that rides (a
	// lone one meets it too: its own fallback takes care of it, and the test has nothing to
	// judge). Armed once only: armed again, it could refuse a lone settle's fallback too,
	// leaving its row to the lease.
	eventually(t, 30*time.Second, "a settle sharing a claim's round trip", func() bool { return d.Stats().SharedSettles.Load() > 0 })
	b.count(`SELECT count(*) FROM setval('refuse_once', 1, false)`)
	checkChain(t, b, c, n)
	if logs.FilterMessage("settle sent with a claim failed; it goes again alone").Len() == 0 {
		t.Skip("the refusal met a settle that went alone on this run")
	}
}

// TestRefusedSharedClaimKeepsItsSettle: a claim that is refused while a settle shares its
// round trip undoes only itself: the settle, in a transaction of its own, is kept, and the
// claims after it deliver every event once.
func TestRefusedSharedClaimKeepsItsSettle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `
		CREATE SEQUENCE refuse_claim START 2;
		CREATE FUNCTION refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			-- A claim leases the row; nextval is not undone with the refused transaction.
			IF NEW.lease_token IS DISTINCT FROM OLD.lease_token AND nextval('refuse_claim') = 1 THEN
				RAISE EXCEPTION 'claim refused once' USING ERRCODE = '40001';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_claim BEFORE UPDATE ON webhook_outbox FOR EACH ROW EXECUTE FUNCTION refuse_claim();`); err != nil {
		t.Fatal(err)
	}
	const n = 40
	c := newConsumer(t, chain(b, n))
	cfg, logs := b.observedConfig(c.URL(), zapcore.WarnLevel)
	d := b.start(cfg)
	refused := func() int { return logs.FilterMessage("claim failed").Len() }
	b.enqueue(outbox.Event{EventType: "test.chain"})
	// Armed once the chain is under way, so that the refused claim is one a settle rides.
	eventually(t, 30*time.Second, "a settle sharing a claim's round trip", func() bool { return d.Stats().SharedSettles.Load() > 0 })
	b.count(`SELECT count(*) FROM setval('refuse_claim', 1, false)`)
	checkChain(t, b, c, n)
	if refused() == 0 {
		t.Fatal("no claim was refused: the test proves nothing")
	}
	if got := logs.FilterMessage("settle sent with a claim failed; it goes again alone").Len(); got != 0 {
		t.Errorf("%d settles sent with a claim were undone with it", got)
	}
}
