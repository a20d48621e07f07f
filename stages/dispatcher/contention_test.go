package dispatcher_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestUnsendableRowsNeverCountAgainstTheEndpoint: rows that can never be sent (a control
// character in event_type, which net/http refuses in a header; a whitespace-only or overlong
// event_type; an empty-string endpoint_url) are dead-lettered before any request, with a
// reason, and never reach the gate: a breaker with a threshold of 2 stays closed and the
// healthy rows behind them are delivered at once. Five such rows used to open the breaker of
// a healthy endpoint.
func TestUnsendableRowsNeverCountAgainstTheEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	cfg := b.config(c.URL())
	cfg.BreakerThreshold = 2
	d := b.start(cfg)
	ctx := context.Background()
	bad := map[string]string{ // event_type, endpoint_url ('' = NULL) → the reason's key words
		"line\r\nbreak|":               "control character",
		"tab\tok\x7f|":                 "control character",
		"   |":                         "empty or only whitespace",
		strings.Repeat("x", 257) + "|": "over the limit of 256",
		"fine.event|EMPTY":             "endpoint_url is an empty string",
	}
	for key := range bad {
		eventType, endpoint, _ := strings.Cut(key, "|")
		var url any
		if endpoint == "EMPTY" {
			url = ""
		}
		if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, endpoint_url) VALUES ($1, '{}', $2)`, eventType, url); err != nil {
			t.Fatal(err)
		}
	}
	var good []string
	for range 20 {
		good = append(good, b.enqueue(outbox.Event{}))
	}
	b.waitSettled(15 * time.Second)
	for key, want := range bad {
		eventType, _, _ := strings.Cut(key, "|")
		var reason string
		if err := b.pool.QueryRow(ctx, `SELECT reason FROM webhook_dead_letter WHERE event_type = $1`, eventType).Scan(&reason); err != nil {
			t.Fatalf("row with event_type %q not dead-lettered: %v", eventType, err)
		}
		if !strings.Contains(reason, want) {
			t.Errorf("event_type %q dead-lettered for %q, want a reason saying %q", eventType, reason, want)
		}
	}
	if n := c.received(); n != len(good) {
		t.Errorf("the consumer got %d requests, want exactly the %d good rows (no request for an unsendable row)", n, len(good))
	}
	if got := counterValue(t, d, "fluxora_webhook_circuit_breaker_transitions_total", "to_state", "open"); got != 0 {
		t.Errorf("the breaker opened %v times on a healthy endpoint", got)
	}
}

// TestLockedDueRowBacksOff: a due row locked by another session (an operator's transaction)
// is skipped by the claim, which reports it as claimable now. The claiming loop must not look
// again every 20 ms for as long as the lock is held (it did: about 50 claims a second); it
// backs off, doubling to a second, and takes the row soon after the lock goes.
func TestLockedDueRowBacksOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	cfg := b.config(c.URL())
	d := b.start(cfg)
	ctx := context.Background()
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the first event delivered", func() bool { return c.received() == 1 })

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Commit a row, then lock it from this transaction before the dispatcher can claim it:
	// inserted with a due time a moment ahead so that the lock is taken first.
	var id int64
	if err := b.pool.QueryRow(ctx, `INSERT INTO webhook_outbox (event_type, payload, created_at)
		VALUES ('test.locked', '{}', now() + interval '300 milliseconds') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM webhook_outbox WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	before := d.Stats().Claims.Load()
	// The lock is the fault under test: held for a fixed 2 s, while the claims are counted.
	time.Sleep(2 * time.Second)
	claims := d.Stats().Claims.Load() - before
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the locked row delivered once the lock is gone", func() bool { return c.received() == 2 })
	// 20 ms, 40, 80, ... capped at 1 s: about 8 looks in 2 s; every 20 ms would be 100.
	if claims > 20 {
		t.Errorf("%d claims while one due row was locked for 2 s; want a back-off (at most 20)", claims)
	}
}

// TestLapsedSwitchIsConfirmedWithAClaim: while the dispatcher waits armed, the producers'
// NOTIFY switch runs out (here: set back by hand, as a renewal that came late would find it),
// and a producer commits in the lapse without a NOTIFY. The next renewal finds the lapse and
// claims at once: the row is delivered within a renewal period, not at the backstop poll (an
// hour in this test).
func TestLapsedSwitchIsConfirmedWithAClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	d := b.start(b.config(c.URL()))
	ctx := context.Background()
	// Armed (by its claim) and announced (the switch set just after that claim): setting the
	// switch back before the announcement would only be overwritten by it.
	eventually(t, 10*time.Second, "the dispatcher to arm and announce", func() bool {
		return b.armedAndAnnounced(500 * time.Millisecond)
	})
	if _, err := b.pool.Exec(ctx, `SELECT setval('webhook_outbox_notify_until', 1)`); err != nil {
		t.Fatal(err)
	}
	b.enqueue(outbox.Event{}) // no NOTIFY: the switch is off
	eventually(t, 10*time.Second, "the row committed in the lapse delivered", func() bool { return c.received() == 1 })
	// The looks after arming may find the row first when other transactions were in progress
	// at arming (any database's: the suite runs in parallel); the renewal must still notice
	// the lapse and confirm with a claim.
	eventually(t, 10*time.Second, "the renewal to find the lapse (wakeups_total{source=\"lapse\"})", func() bool {
		return counterValue(t, d, "fluxora_webhook_wakeups_total", "source", "lapse") >= 1
	})
}

// TestHungEndpointIsNotChurned: an endpoint that hangs holds its slots, and its backlog stays
// in the table, unclaimed, for as long as it hangs: no row is claimed only to be released
// again (a hung endpoint used to cost hundreds of claim-then-release cycles a second), while a
// second endpoint's rows keep flowing.
func TestHungEndpointIsNotChurned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	hung := newConsumer(t, func(a arrival, w http.ResponseWriter) { hang(a, release) })
	fast := newConsumer(t, nil)
	cfg := b.config(fast.URL())
	cfg.EndpointConcurrency = 2
	cfg.MaxInFlight = 16
	cfg.Timeout = 60 * time.Second // the hanging requests must not time out during the test
	d := b.start(cfg)
	for range 50 {
		b.enqueue(outbox.Event{EndpointURL: hung.URL()})
	}
	eventually(t, 10*time.Second, "two requests hanging at the hung endpoint", func() bool { return len(hung.arrivals()) == 2 })
	// Once the saturation has been seen (the claims skip the endpoint from then on), count.
	eventually(t, 10*time.Second, "the hung endpoint's rows left unleased", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE NOT processed AND lease_until > now()`) == 2
	})
	released, claimed := d.Stats().Released.Load(), d.Stats().Claimed.Load()
	for i := range 40 {
		b.enqueue(outbox.Event{Payload: map[string]int{"n": i}})
	}
	eventually(t, 10*time.Second, "40 deliveries to the other endpoint", func() bool { return len(fast.arrivals()) == 40 })
	if n := d.Stats().Released.Load() - released; n != 0 {
		t.Errorf("%d rows released while the endpoint hung: claimed only to be put back", n)
	}
	if n := d.Stats().Claimed.Load() - claimed; n != 40 {
		t.Errorf("%d rows claimed while the endpoint hung, want only the other endpoint's 40", n)
	}
	close(release)
	b.waitSettled(30 * time.Second)
}

// TestOpenCircuitRowsAreNotClaimed: once a claim's row has been deferred for an open circuit,
// the instance knows the endpoint is gated, and rows for it that arrive while the circuit is
// open stay in the table, unclaimed and unwritten, until the reset: they used to be claimed
// and deferred one by one (a row write each, and a claim/settle cycle each).
func TestOpenCircuitRowsAreNotClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	cfg := b.config(c.URL())
	cfg.BreakerThreshold = 1
	cfg.BreakerReset = time.Minute
	cfg.RetrySchedule = []time.Duration{50 * time.Millisecond, time.Hour}
	d := b.start(cfg)
	// The failure opens the circuit; its retry, due 50 ms later, is deferred for it: from
	// then on the instance skips the endpoint.
	b.enqueue(outbox.Event{})
	// The counter too: it moves after the instance noted the gated endpoint, which the
	// database's row precedes (on a loaded machine, long enough for a claim in between).
	eventually(t, 10*time.Second, "the retry deferred for the open circuit", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE deferred_reason = 'circuit breaker open'`) == 1 &&
			d.Stats().Deferred.Load() == 1
	})
	deferred := d.Stats().Deferred.Load()
	claims := d.Stats().Claims.Load()
	var held []string
	for i := range 10 {
		held = append(held, b.enqueue(outbox.Event{Payload: map[string]int{"held": i}}))
	}
	// Each insert wakes the dispatcher; wait until it has claimed after the last one.
	eventually(t, 10*time.Second, "claims after the inserts", func() bool { return d.Stats().Claims.Load() > claims })
	last := d.Stats().Claims.Load()
	b.enqueue(outbox.Event{EventType: "marker"})
	eventually(t, 10*time.Second, "a claim after the marker", func() bool { return d.Stats().Claims.Load() > last })
	if n := d.Stats().Deferred.Load() - deferred; n != 0 {
		t.Errorf("%d rows claimed and deferred while the circuit was known open, want 0", n)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = ANY($1::uuid[]) AND lease_until IS NULL
		AND deferred_reason IS NULL AND NOT processed`, held); n != len(held) {
		t.Errorf("%d of %d rows left untouched in the table", n, len(held))
	}
	if n := len(c.arrivals()); n != 1 {
		t.Errorf("the consumer got %d requests, want only the first", n)
	}
}
