package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/dispatcher"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/memstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// transitions records breaker transitions with the time they were reported.
type transitions struct {
	mu  sync.Mutex
	got []transition
}

type transition struct {
	name string // "from>to"
	at   time.Time
}

func (r *transitions) add(from, to string) {
	r.mu.Lock()
	r.got = append(r.got, transition{from + ">" + to, time.Now()})
	r.mu.Unlock()
}

// first returns when name was first reported.
func (r *transitions) first(name string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.got {
		if t.name == name {
			return t.at, true
		}
	}
	return time.Time{}, false
}

func (r *transitions) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, t := range r.got {
		out = append(out, t.name)
	}
	return out
}

// observedGate records what the real gate deferred, for assertions on delays and reasons.
type observedGate struct {
	gate.Gate
	mu       sync.Mutex
	deferred []deferral
}

// deferral is one row the gate held back. The store computed its delay at some moment between
// checked and at, so the row is due between checked+delay and at+delay.
type deferral struct {
	deliveryID string
	checked    time.Time
	at         time.Time
	delay      time.Duration
	reason     string
}

func (o *observedGate) Check(ctx context.Context, batch []*delivery.Delivery) {
	checked := time.Now()
	o.Gate.Check(ctx, batch)
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, d := range batch {
		if d.Outcome.Kind == delivery.Defer {
			o.deferred = append(o.deferred, deferral{d.DeliveryID, checked, now, d.Outcome.Delay, d.Outcome.Reason})
		}
	}
}

// Inspect reads the observed gate's breakers when it can (gate.Inspector), as the dispatcher
// does with an unwrapped gate.
func (o *observedGate) Inspect(ctx context.Context, hashes []string) ([]gate.Snapshot, error) {
	if ins, ok := o.Gate.(gate.Inspector); ok {
		return ins.Inspect(ctx, hashes)
	}
	return nil, errors.New("the observed gate cannot be read")
}

func (o *observedGate) deferrals() []deferral {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]deferral(nil), o.deferred...)
}

// TestBreakerEndToEnd: two dispatcher instances, each with its own gate and store handle on
// one shared state. A consumer failing with 503 opens the circuit; while it is open no
// request reaches the consumer, on either instance, and rows are deferred to the reset time;
// the rows whose failures tripped the breaker are delivered later, not dropped; after the
// reset one probe closes the circuit and the backlog drains.
func TestBreakerEndToEnd(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		prefix := redistest.Prefix(t)
		testBreakerEndToEnd(t, func() gate.Store { return redistest.Open(t, prefix) })
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		shared := memstore.New(memstore.Options{})
		testBreakerEndToEnd(t, func() gate.Store { return shared })
	})
}

func testBreakerEndToEnd(t *testing.T, newStore func() gate.Store) {
	b := setup(t)
	var healthy atomic.Bool
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	const reset = 1500 * time.Millisecond
	trans := &transitions{}
	var gates []*observedGate
	for range 2 {
		cfg := b.config(c.URL())
		cfg.RetrySchedule = []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond}
		g, err := gate.NewBreakerGate(newStore(), gate.Params{
			Threshold: 3, Reset: reset, RetryRPS: 100, ProbeTimeout: cfg.Timeout + 5*time.Second,
		}, gate.Hooks{OnTransition: trans.add, OnFailOpen: func() { t.Error("gate failed open") }, Logger: cfg.Logger})
		if err != nil {
			t.Fatal(err)
		}
		og := &observedGate{Gate: g}
		gates = append(gates, og)
		cfg.Gate = og
		b.start(cfg)
	}

	var ids []string
	for i := range 3 {
		ids = append(ids, b.enqueue(outbox.Event{Payload: map[string]int{"trip": i}}))
	}
	eventually(t, 10*time.Second, "the circuit to open", func() bool { _, ok := trans.first("closed>open"); return ok })
	opened, _ := trans.first("closed>open")
	healthy.Store(true) // the consumer recovers; only the probe may find out

	// Rows enqueued while the circuit is open get no request (checkOnlyTheProbe below): each
	// is deferred to the reset time by a claim that took it, or left in the table by claims
	// that skip an endpoint the instance knows to be gated, until the reset.
	var backlog []string
	for i := range 5 {
		backlog = append(backlog, b.enqueue(outbox.Event{Payload: map[string]int{"backlog": i}}))
	}
	ids = append(ids, backlog...)
	eventually(t, 30*time.Second, "every event delivered after recovery", func() bool {
		return b.count(`SELECT count(DISTINCT delivery_id) FROM webhook_deliveries WHERE status_code = 200`) == len(ids)
	})
	b.waitSettled(10 * time.Second)

	if got := trans.names(); fmt.Sprint(got) != "[closed>open open>half_open half_open>closed]" {
		t.Fatalf("transitions %v, want each one exactly once, in order, across both instances", got)
	}
	closed, _ := trans.first("half_open>closed")
	// Deferred to the reset time: every deferral for the open circuit ends when it resets. The
	// row is due somewhere in [checked+delay, at+delay] (the store's moment is not observable),
	// and the opening was reported after the store made it, so the margin covers only the
	// scheduling of one hook call; 300 ms is generous for a loaded 2-core machine under -race
	// and still tells the reset time (1.5 s after the opening) from a deferral of one window or
	// the probe wait or of nothing.
	const margin = 300 * time.Millisecond
	for _, g := range gates {
		for _, d := range g.deferrals() {
			if d.reason != gate.DeferOpen.String() {
				continue
			}
			want := opened.Add(reset)
			if early, late := d.checked.Add(d.delay), d.at.Add(d.delay); late.Before(want.Add(-margin)) || early.After(want.Add(margin)) {
				t.Errorf("row %s deferred until %s–%s after the opening, want the reset time (%s ± %s)",
					d.deliveryID, early.Sub(opened), late.Sub(opened), reset, margin)
			}
		}
	}
	// While open the consumer got nothing; from the reset to the closing, only the probe.
	checkOnlyTheProbe(t, c, opened, opened, reset, closed)
	// Nothing was dropped: the tripping events were retried and delivered.
	for _, id := range ids[:3] {
		if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND status_code = 200`, id); n != 1 {
			t.Errorf("tripping event %s delivered %d times", id, n)
		}
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestGateSurvivesRedisOutage stops a real Redis mid-run: deliveries continue (fail open, and
// the counter rises), nothing is lost; after Redis is back on the same port (empty, as after
// a crash without persistence), the breaker works again without a restart.
func TestGateSurvivesRedisOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := redistest.StartServer(t)
	store, err := redisstore.Open(srv.URL(), redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })

	var failing atomic.Bool
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) {
		if failing.Load() {
			w.WriteHeader(http.StatusBadGateway)
		}
	})
	var failOpen atomic.Int64
	trans := &transitions{}
	cfg := b.config(c.URL())
	cfg.RetrySchedule = slices.Repeat([]time.Duration{100 * time.Millisecond}, 10)
	const reset = time.Second
	g, err := gate.NewBreakerGate(store, gate.Params{
		Threshold: 2, Reset: reset, RetryRPS: 100, ProbeTimeout: cfg.Timeout,
		StoreRetry: 100 * time.Millisecond, StoreTimeout: time.Second,
	}, gate.Hooks{OnTransition: trans.add, OnFailOpen: func() { failOpen.Add(1) }, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	og := &observedGate{Gate: g}
	cfg.Gate = og
	b.start(cfg)

	enqueued := 0
	enqueue := func(n int) []string {
		var ids []string
		for range n {
			ids = append(ids, b.enqueue(outbox.Event{}))
		}
		enqueued += n
		return ids
	}
	delivered := func() int {
		return b.count(`SELECT count(DISTINCT delivery_id) FROM webhook_deliveries WHERE status_code = 200`)
	}

	enqueue(5)
	eventually(t, 10*time.Second, "deliveries with Redis up", func() bool { return delivered() == enqueued })
	if n := failOpen.Load(); n != 0 {
		t.Fatalf("failed open %d times with Redis up", n)
	}

	srv.Stop()
	enqueue(20)
	eventually(t, 10*time.Second, "deliveries with Redis down", func() bool { return delivered() == enqueued })
	if failOpen.Load() == 0 {
		t.Fatal("deliveries went through with Redis down but the fail-open counter did not rise")
	}

	srv.Start()
	failing.Store(true)
	// Failures recorded while the gate still fails open (until its next try) are lost, so
	// keep failing until the breaker, on the new Redis, opens.
	eventually(t, 10*time.Second, "the breaker to open on the restarted Redis", func() bool {
		if _, ok := trans.first("closed>open"); ok {
			return true
		}
		enqueue(1)
		return false
	})
	// Rows enqueued while the circuit is open get no request until it half-opens: deferred
	// to the reset time, or skipped by claims while the instance knows the endpoint is gated.
	held := enqueue(3)
	eventually(t, 10*time.Second, "the circuit to half-open", func() bool { _, ok := trans.first("open>half_open"); return ok })
	halfOpen, _ := trans.first("open>half_open")
	for _, a := range c.arrivals() {
		if contains(held, a.DeliveryID) && a.At.Before(halfOpen) {
			t.Fatalf("a row enqueued while the circuit was open reached the consumer before it half-opened")
		}
	}
	failing.Store(false)
	eventually(t, 15*time.Second, "every event delivered, none lost", func() bool { return delivered() == enqueued })
	b.waitSettled(10 * time.Second)
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	if _, ok := trans.first("half_open>closed"); !ok {
		t.Fatalf("the circuit did not close after the consumer recovered: %v", trans.names())
	}
}

// TestRateLimitEndToEnd: several events to one consumer fail their first attempt and succeed
// on their retry, under a retry rate limit of 2 per second. The refused retries are deferred
// (counted as rate_limited) with no HTTP request and no attempt used, every event is delivered
// exactly once after its retry, nothing is dead-lettered, and the consumer never receives more
// retries than the limit within one window.
func TestRateLimitEndToEnd(t *testing.T) {
	t.Parallel()
	onEachStore(t, testRateLimitEndToEnd)
}

// onEachStore runs test in parallel subtests, once on Redis (a prefix of its own) and once on
// the in-process store: the gate's behaviour through the dispatcher is the same on both.
func onEachStore(t *testing.T, test func(*testing.T, gate.Store)) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		test(t, redistest.Open(t, redistest.Prefix(t)))
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		test(t, memstore.New(memstore.Options{}))
	})
}

func testRateLimitEndToEnd(t *testing.T, store gate.Store) {
	const (
		events = 6
		rps    = 2
		window = time.Second
		// slack bounds how much later than its admission by the gate a request may reach the
		// consumer (sign, send, a loaded machine under -race). Retries arriving within
		// window-slack of each other were admitted within one window, so at most rps of them
		// may do so; the bound is sound for any delay up to slack, and still fails if the
		// limiter admits one retry too many.
		slack = 300 * time.Millisecond
	)
	b := setup(t)
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		if a.Attempt == "1" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	cfg := b.config(c.URL())
	cfg.RetrySchedule = []time.Duration{100 * time.Millisecond, 100 * time.Millisecond}
	g, err := gate.NewBreakerGate(store, gate.Params{RetryRPS: rps, Window: window},
		gate.Hooks{OnFailOpen: func() { t.Error("gate failed open") }, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	og := &observedGate{Gate: g}
	cfg.Gate = og
	d := b.start(cfg)

	var ids []string
	for i := range events {
		ids = append(ids, b.enqueue(outbox.Event{Payload: map[string]int{"n": i}}))
	}
	eventually(t, 30*time.Second, "every event delivered", func() bool {
		return b.count(`SELECT count(DISTINCT delivery_id) FROM webhook_deliveries WHERE status_code = 200`) == events
	})
	b.waitSettled(10 * time.Second)

	// Exactly two requests per event: the failed first attempt and the successful retry. A
	// refused retry that had been sent anyway would be a third.
	byID := c.byDelivery()
	var retries []time.Time
	for _, id := range ids {
		got := byID[id]
		if len(got) != 2 || got[0].Attempt != "1" || got[1].Attempt != "2" {
			var attempts []string
			for _, a := range got {
				attempts = append(attempts, a.Attempt)
			}
			t.Errorf("event %s: requests with attempts %v, want [1 2]", id, attempts)
			continue
		}
		retries = append(retries, got[1].At)
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters", n)
	}

	// The limiter refused retries: 6 first attempts fill the window, so at least the first
	// retries had to wait. A refusal creates no row (the row's due time moves in place): each
	// event has exactly its two rows, both settled with a response, and no attempt is
	// consumed.
	limited := 0
	for _, dd := range og.deferrals() {
		if dd.reason != gate.DeferRateLimit.String() {
			t.Errorf("row %s deferred for %q, want only rate-limit deferrals", dd.deliveryID, dd.reason)
		}
		limited++
	}
	if limited == 0 {
		t.Fatal("no retry was deferred by the rate limiter: the test proves nothing")
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE processed AND status_code IS NULL`); n != 0 {
		t.Errorf("%d settled rows without a response: a deferral was written as a row of its own", n)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE attempt = 2 AND deferred_reason IS NULL`); n != len(ids) {
		t.Errorf("%d attempt-2 rows with their deferral reason cleared, want one per event (%d)", n, len(ids))
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE attempt > 2`); n != 0 {
		t.Errorf("%d rows beyond attempt 2: a deferral consumed an attempt", n)
	}
	if got := counterValue(t, d, "fluxora_webhook_deferrals_total", "reason", "rate_limited"); got != float64(limited) {
		t.Errorf("fluxora_webhook_deferrals_total{reason=\"rate_limited\"} = %v, want %d", got, limited)
	}

	slices.SortFunc(retries, func(a, b time.Time) int { return a.Compare(b) })
	for i := range retries {
		in := 0
		for _, at := range retries[i:] {
			if at.Sub(retries[i]) < window-slack {
				in++
			}
		}
		if in > rps {
			t.Errorf("%d retries reached the consumer within %s of %s, want at most %d", in, window-slack, retries[i].Format("15:04:05.000"), rps)
		}
	}
}

// counterValue reads the series of a counter in the dispatcher's registry whose label has value
// (any series when label is empty, for unlabelled counters); 0 when there is none.
func counterValue(t *testing.T, d *dispatcher.Dispatcher, name, label, value string) float64 {
	t.Helper()
	families, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label == "" { // an unlabelled counter
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestRestartedDispatcherSeesTheBreaker: dispatcher A opens the circuit against a failing
// consumer and stops; dispatcher B, a new process on the same Redis, finds the circuit open:
// it defers the rows for that consumer to the reset time without a request, then probes and
// closes it. B reports no closed>open transition of its own: the open state came from Redis.
func TestRestartedDispatcherSeesTheBreaker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	prefix := redistest.Prefix(t)
	var healthy atomic.Bool
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	// Long enough for A to stop and B to start and claim well before the reset even when that
	// takes seconds (a loaded machine running the whole suite): the assertions below depend on
	// B acting while the circuit is still open, or its backlog goes out as the probe and no
	// row is ever deferred for the open circuit.
	const reset = 8 * time.Second
	newDispatcher := func(trans *transitions) (*dispatcher.Dispatcher, *observedGate) {
		cfg := b.config(c.URL())
		cfg.RetrySchedule = slices.Repeat([]time.Duration{100 * time.Millisecond}, 6)
		g, err := gate.NewBreakerGate(redistest.Open(t, prefix), gate.Params{
			Threshold: 2, Reset: reset, RetryRPS: 100, ProbeTimeout: cfg.Timeout + 5*time.Second,
		}, gate.Hooks{OnTransition: trans.add, OnFailOpen: func() { t.Error("gate failed open") }, Logger: cfg.Logger})
		if err != nil {
			t.Fatal(err)
		}
		og := &observedGate{Gate: g}
		cfg.Gate = og
		d, err := dispatcher.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Stop(context.Background()) })
		return d, og
	}

	transA := &transitions{}
	a, _ := newDispatcher(transA)
	ids := []string{b.enqueue(outbox.Event{}), b.enqueue(outbox.Event{})}
	eventually(t, 10*time.Second, "dispatcher A to open the circuit", func() bool { _, ok := transA.first("closed>open"); return ok })
	opened, _ := transA.first("closed>open")
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Stop(stopCtx); err != nil {
		t.Fatalf("stopping dispatcher A: %v", err)
	}
	stoppedA := time.Now()
	healthy.Store(true) // only a probe may find out

	transB := &transitions{}
	_, gb := newDispatcher(transB)
	backlog := []string{b.enqueue(outbox.Event{}), b.enqueue(outbox.Event{}), b.enqueue(outbox.Event{})}
	ids = append(ids, backlog...)
	// B learns the open state from Redis with its first deferral, of A's retries or of the
	// backlog, whichever its first claim takes (B saw no failure: the state can only come from
	// Redis); rows enqueued afterwards are skipped by its claims until the reset rather than
	// deferred one by one.
	eventually(t, time.Until(opened.Add(reset)), "dispatcher B to defer a row for the open circuit before the reset", func() bool {
		for _, d := range gb.deferrals() {
			if d.reason == gate.DeferOpen.String() && contains(ids, d.deliveryID) {
				return true
			}
		}
		return false
	})
	if time.Since(opened) >= reset-500*time.Millisecond {
		t.Fatalf("dispatcher B deferred a row %s after the opening, too close to the reset (%s) to prove anything; raise reset", time.Since(opened), reset)
	}
	eventually(t, 30*time.Second, "every event delivered after the probe", func() bool {
		return b.count(`SELECT count(DISTINCT delivery_id) FROM webhook_deliveries WHERE status_code = 200`) == len(ids)
	})
	b.waitSettled(10 * time.Second)

	if got := transB.names(); fmt.Sprint(got) != "[open>half_open half_open>closed]" {
		t.Fatalf("dispatcher B's transitions %v, want it to find the circuit open, probe and close it", got)
	}
	for _, d := range gb.deferrals() {
		if d.reason != gate.DeferOpen.String() {
			continue // held while B's probe was in flight
		}
		// Deferred to the reset time, by the opening A made (generous: a loaded machine).
		want := opened.Add(reset)
		if early, late := d.checked.Add(d.delay), d.at.Add(d.delay); late.Before(want.Add(-500*time.Millisecond)) || early.After(want.Add(500*time.Millisecond)) {
			t.Errorf("row %s deferred by B until %s–%s after the opening, want the reset time (%s)", d.deliveryID, early.Sub(opened), late.Sub(opened), reset)
		}
	}
	closed, _ := transB.first("half_open>closed")
	checkOnlyTheProbe(t, c, stoppedA, opened, reset, closed)
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// TestGateStoreRoundTripsMetric: a dispatcher on REDIS_URL counts its Redis round trips in
// fluxora_webhook_gate_store_round_trips_total: one decide per claimed batch and one record per
// settled batch, plus one each the first time, when the new Redis lacks the scripts
// (EVALSHA answered NOSCRIPT, then EVAL).
func TestGateStoreRoundTripsMetric(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv := redistest.StartServer(t) // its own server: a fresh script cache
	c := newConsumer(t, nil)
	cfg := b.config(c.URL())
	cfg.RedisURL = srv.URL()
	cfg.BreakerThreshold = 5 // record runs only with the breaker on
	d := b.start(cfg)
	const events = 4
	for i := range events {
		b.enqueue(outbox.Event{})
		eventually(t, 10*time.Second, "the event delivered", func() bool { return int(d.Stats().Delivered.Load()) == i+1 })
	}
	b.waitSettled(10 * time.Second)

	claims, empty := histogramCounts(t, d, "fluxora_webhook_claim_batch_rows")
	settles, _ := histogramCounts(t, d, "fluxora_webhook_settle_batch_rows")
	batches := claims - empty
	if batches < 1 || settles < 1 {
		t.Fatalf("%d claimed batches and %d settles for %d events", batches, settles, events)
	}
	if got := counterValue(t, d, "fluxora_webhook_gate_store_round_trips_total", "op", "decide"); got != float64(batches+1) {
		t.Errorf("decide round trips %v, want one per claimed batch (%d) plus one to load the script", got, batches)
	}
	if got := counterValue(t, d, "fluxora_webhook_gate_store_round_trips_total", "op", "record"); got != float64(settles+1) {
		t.Errorf("record round trips %v, want one per settle (%d) plus one to load the script", got, settles)
	}
}

// histogramCounts returns a histogram's sample count and how many samples were 0 (its le="0"
// bucket, when it has one).
func histogramCounts(t *testing.T, d *dispatcher.Dispatcher, name string) (count, zero uint64) {
	t.Helper()
	families, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			count = h.GetSampleCount()
			for _, bk := range h.GetBucket() {
				if bk.GetUpperBound() == 0 {
					zero = bk.GetCumulativeCount()
				}
			}
		}
		return count, zero
	}
	t.Fatalf("the registry has no %s", name)
	return 0, 0
}

// checkOnlyTheProbe checks the requests c received after since: none before the circuit that
// opened at opened could reset, and exactly one (the half-open probe) from then until it
// closed at closed.
func checkOnlyTheProbe(t *testing.T, c *consumer, since, opened time.Time, reset time.Duration, closed time.Time) {
	t.Helper()
	probes := 0
	for _, a := range c.arrivals() {
		switch {
		case a.At.After(since) && a.At.Before(opened.Add(reset-100*time.Millisecond)):
			t.Errorf("request at %s after the circuit opened, before its reset (%s)", a.At.Sub(opened), reset)
		case a.At.After(since) && a.At.Before(closed):
			probes++
		}
	}
	if probes != 1 {
		t.Errorf("%d requests between the reset and the closing, want exactly one probe", probes)
	}
}

// stallingProbe makes the first row that holds the half-open probe reach its request past its
// send-by time, as a dispatcher paused between its gate check and its request would, and
// otherwise decides as its gate does. It moves the send-by time back instead of sleeping
// until it: a real pause leaves only the 500 ms before the lease ends to release the row, and
// on a loaded machine a claim could take the row again first (it is then deferred behind its
// own probe until the probe times out), which is not this test's subject.
type stallingProbe struct {
	gate.Gate
	once sync.Once
}

func (g *stallingProbe) Check(ctx context.Context, batch []*delivery.Delivery) {
	g.Gate.Check(ctx, batch)
	for _, d := range batch {
		if d.GateToken != "" {
			g.once.Do(func() { d.SendBy = time.Now().Add(-time.Millisecond) }) // the pause under test
		}
	}
}

// TestProbeReleasedUnsentGivesTheProbeBack: the half-open probe row reaches its request after
// its lease ran out, and is released unsent. The probe it held is given back with the release,
// so the row probes again at its next claim and closes the circuit, instead of being deferred
// behind its own unsent attempt until the probe times out (a minute here, longer than the test
// waits).
func TestProbeReleasedUnsentGivesTheProbeBack(t *testing.T) {
	t.Parallel()
	onEachStore(t, testProbeReleasedUnsent)
}

func testProbeReleasedUnsent(t *testing.T, store gate.Store) {
	b := setup(t)
	var healthy atomic.Bool
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	cfg, logs := b.observedConfig(c.URL(), zap.InfoLevel)
	cfg.Timeout = time.Second
	cfg.Lease = cfg.Timeout + dispatcher.LeaseAllowance // may send until 2.5 s after the claim
	cfg.RetrySchedule = []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond}
	trans := &transitions{}
	bg, err := gate.NewBreakerGate(store, gate.Params{Threshold: 1, Reset: time.Second, RetryRPS: 100, ProbeTimeout: time.Minute},
		gate.Hooks{OnTransition: trans.add, OnFailOpen: func() { t.Error("gate failed open") }, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	og := &observedGate{Gate: &stallingProbe{Gate: bg}}
	cfg.Gate = og
	b.start(cfg)

	id := b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "the circuit to open", func() bool { _, ok := trans.first("closed>open"); return ok })
	healthy.Store(true)
	eventually(t, 30*time.Second, "the row delivered", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed AND status_code = 200`, id) == 1
	})

	// The gate records the probe's outcome after the settle commits, so the transition may
	// trail the row by a moment.
	eventually(t, 5*time.Second, "the circuit to close", func() bool { _, ok := trans.first("half_open>closed"); return ok })
	if n := logs.FilterMessageSnippet("released unsent").FilterField(zap.String("delivery_id", id)).Len(); n != 1 {
		t.Fatalf("%d 'released unsent' lines for the probe row, want 1: the test did not hold the probe up", n)
	}
	for _, d := range og.deferrals() {
		if d.reason == gate.DeferProbe.String() {
			t.Errorf("row %s deferred behind a probe in flight for %s: the released probe was not given back", d.deliveryID, d.delay)
		}
	}
	if got := trans.names(); fmt.Sprint(got) != "[closed>open open>half_open half_open>closed]" {
		t.Errorf("transitions %v, want the circuit opened, probed and closed, once each", got)
	}
	if got := c.byDelivery()[id]; len(got) != 2 {
		t.Errorf("the consumer received the row %d times, want twice (the 503, then the probe)", len(got))
	}
	if n := b.count(`SELECT max(attempt) FROM webhook_deliveries WHERE delivery_id = $1`, id); n != 2 {
		t.Errorf("the delivered row is attempt %d, want 2: the probe released unsent used no attempt", n)
	}
}

// TestRateLimitedRetriesKeepTheirPace: every event's retries fail, under a retry rate limit of
// 2 per second. The limiter hands each refused retry the next slot; the claims must take each
// retry when its slot comes, so that the retries go out at the endpoint's rate, without
// pauses. Holding all of an endpoint's retries until the soonest slot of the latest deferral
// kept the retries whose slots had come out of the claims (pauses of several seconds with
// retries due), until they came back together and were mostly deferred again.
func TestRateLimitedRetriesKeepTheirPace(t *testing.T) {
	t.Parallel()
	onEachStore(t, testRateLimitedRetriesKeepTheirPace)
}

func testRateLimitedRetriesKeepTheirPace(t *testing.T, store gate.Store) {
	const events, retriesEach, rps = 16, 2, 2
	b := setup(t)
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	cfg := b.config(c.URL())
	cfg.RetrySchedule = []time.Duration{500 * time.Millisecond, 500 * time.Millisecond}
	g, err := gate.NewBreakerGate(store, gate.Params{RetryRPS: rps, Window: time.Second},
		gate.Hooks{OnFailOpen: func() { t.Error("gate failed open") }, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gate = g
	b.start(cfg)
	evs := make([]outbox.Event, events)
	for i := range evs {
		evs[i] = outbox.Event{EventType: "test.event", Payload: map[string]int{"n": i}}
	}
	if _, err := outbox.EnqueueMany(context.Background(), b.pool, evs); err != nil {
		t.Fatal(err)
	}
	// 32 retries at 2 per second take 16 s; crawling, they took minutes.
	eventually(t, 90*time.Second, "every event dead-lettered after its retries", func() bool {
		return b.count(`SELECT count(*) FROM webhook_dead_letter`) == events
	})
	var retries []time.Time
	for _, a := range c.arrivals() {
		if a.Attempt != "1" {
			retries = append(retries, a.At)
		}
	}
	if len(retries) != events*retriesEach {
		t.Fatalf("the consumer received %d retries, want %d", len(retries), events*retriesEach)
	}
	slices.SortFunc(retries, func(a, b time.Time) int { return a.Compare(b) })
	// A retry is due at every moment until the last one goes. The window lets two go at once
	// and then none for up to a second (pauses of 1-2 s); holding retries until the latest
	// batch's slot paused for 14 s here. 5 s leaves room for a loaded machine.
	var longest time.Duration
	for i := 1; i < len(retries); i++ {
		longest = max(longest, retries[i].Sub(retries[i-1]))
	}
	if longest > 5*time.Second {
		t.Errorf("retries paused for %s while others were due (the rate allows one every %s)", longest, time.Second/rps)
	}
}

// heldProbe is a consumer whose answers the test decides: the first attempt of the event of
// type tripEvent fails with 503 to open the circuit, its second (the half-open probe) is held
// until the test releases it with a status, and every other request is answered 200.
type heldProbe struct {
	arrived chan struct{} // closed when the probe reaches the consumer
	once    sync.Once
	release chan int // the probe's status
}

// tripEvent is the event type of the row that opens the circuit and then probes.
const tripEvent = "trip.event"

func newHeldProbe() *heldProbe {
	h := &heldProbe{arrived: make(chan struct{}), release: make(chan int, 1)}
	return h
}

func (h *heldProbe) respond(a arrival, w http.ResponseWriter) {
	if a.Event != tripEvent {
		return
	}
	if a.Attempt == "1" {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	h.once.Do(func() { close(h.arrived) })
	select {
	case status := <-h.release:
		w.WriteHeader(status)
	case <-a.Ctx.Done():
	}
}

// probeGate is the gate of the tests of a probe's end: threshold 1, reset, and a probe timeout
// far longer than the tests wait, so that rows left waiting for it show.
func probeGate(t *testing.T, store gate.Store, cfg dispatcher.Config, reset time.Duration) *observedGate {
	t.Helper()
	g, err := gate.NewBreakerGate(store, gate.Params{Threshold: 1, Reset: reset, RetryRPS: 100, ProbeTimeout: 2 * time.Minute},
		gate.Hooks{OnFailOpen: func() { t.Error("gate failed open") }, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	return &observedGate{Gate: g}
}

// enqueueTogether enqueues evs in one transaction, so that one claim takes them all: rows
// that came one by one could find the endpoint already held by the claims (left in the table
// rather than deferred), which is what the tests must not depend on.
func enqueueTogether(t *testing.T, b *bundle, evs ...outbox.Event) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var ids []string
	for _, ev := range evs {
		ev.EventType, ev.Payload = "test.event", map[string]int{"n": len(ids)}
		e, err := outbox.Enqueue(ctx, tx, ev)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, e.DeliveryID)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

// deferredBehindProbe waits until every row of ids was deferred behind the probe in flight by
// one of gates, and the deferrals are in the table: a probe that ends between a row's
// deferral and its settle finds nothing to resume, and the row waits for the probe's expiry.
func deferredBehindProbe(t *testing.T, b *bundle, gates []*observedGate, ids []string) {
	t.Helper()
	eventually(t, 30*time.Second, "the rows deferred behind the probe in flight", func() bool {
		seen := map[string]bool{}
		for _, g := range gates {
			for _, d := range g.deferrals() {
				if d.reason == gate.DeferProbe.String() {
					seen[d.deliveryID] = true
				}
			}
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE NOT processed AND deferred_reason = $1 AND delivery_id::text = ANY ($2::text[])`,
			gate.DeferProbe.String(), ids) == len(ids)
	})
}

// TestProbeThatDoesNotCloseRetimesTheRowsBehindIt: rows deferred behind a half-open probe wait
// for its expiry (two minutes here), and the claims leave the endpoint alone until then. When
// the probe fails (503, re-opening the circuit for a reset) or is given back (410, a permanent
// answer), the endpoint must be tried again when the next probe may go, after the reset or at
// once, and the rows behind the probe follow its success: the consumer has recovered, so they
// are delivered about a reset after the probe's end, not when the ended probe would have
// expired. The failed probe's own retry is an hour away, so only the rows behind it can probe.
func TestProbeThatDoesNotCloseRetimesTheRowsBehindIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
	}{{"failed", http.StatusServiceUnavailable}, {"given back", http.StatusGone}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			onEachStore(t, func(t *testing.T, store gate.Store) { testProbeThatDoesNotClose(t, store, tc.status) })
		})
	}
}

func testProbeThatDoesNotClose(t *testing.T, store gate.Store, status int) {
	const reset = time.Second
	b := setup(t)
	h := newHeldProbe()
	c := newConsumer(t, h.respond)
	cfg := b.config(c.URL())
	cfg.Timeout = 30 * time.Second // the held probe must not time out
	cfg.RetrySchedule = []time.Duration{100 * time.Millisecond, time.Hour}
	og := probeGate(t, store, cfg, reset)
	cfg.Gate = og
	b.start(cfg)

	b.enqueue(outbox.Event{EventType: tripEvent})
	select {
	case <-h.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for the half-open probe")
	}
	behind := enqueueTogether(t, b, outbox.Event{}, outbox.Event{}, outbox.Event{})
	deferredBehindProbe(t, b, []*observedGate{og}, behind)
	ended := time.Now()
	h.release <- status

	// Expected: a reset and a claim or two (the failed case), a claim or two (given back);
	// left to the probe's expiry, two minutes.
	eventually(t, 20*time.Second, "the rows behind the ended probe delivered", func() bool {
		return b.count(`SELECT count(DISTINCT delivery_id) FROM webhook_deliveries WHERE status_code = 200 AND delivery_id::text = ANY ($1::text[])`, behind) == len(behind)
	})
	if status == http.StatusServiceUnavailable {
		// The failure re-opened the circuit for a reset: no row may be tried before it.
		for _, a := range c.arrivals() {
			if contains(behind, a.DeliveryID) && a.At.Before(ended.Add(reset-100*time.Millisecond)) {
				t.Errorf("a row behind the failed probe reached the consumer %s after it, before the reset (%s)", a.At.Sub(ended), reset)
			}
		}
	}
}

// TestProbeResumesEveryKeyOfItsBreaker: rows without an endpoint_url and rows whose
// endpoint_url is the configured URL share one breaker (named by the URL's hash) under two
// claim keys. The probe, one of the endpoint_url rows, closes the circuit: the rows of both
// keys deferred behind it are delivered at once, on one instance and on two sharing the gate's
// store (whichever instance deferred them), not when the probe would have expired (two
// minutes).
func TestProbeResumesEveryKeyOfItsBreaker(t *testing.T) {
	t.Parallel()
	for _, instances := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d instances", instances), func(t *testing.T) {
			t.Parallel()
			onEachStore(t, func(t *testing.T, store gate.Store) { testProbeResumesEveryKey(t, store, instances) })
		})
	}
}

func testProbeResumesEveryKey(t *testing.T, store gate.Store, instances int) {
	b := setup(t)
	h := newHeldProbe()
	c := newConsumer(t, h.respond)
	var gates []*observedGate
	for range instances {
		cfg := b.config(c.URL())
		cfg.Timeout = 30 * time.Second // the held probe must not time out
		cfg.RetrySchedule = []time.Duration{100 * time.Millisecond, time.Hour}
		og := probeGate(t, store, cfg, time.Second)
		gates = append(gates, og)
		cfg.Gate = og
		b.start(cfg)
	}

	b.enqueue(outbox.Event{EventType: tripEvent, EndpointURL: c.URL()})
	select {
	case <-h.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for the half-open probe")
	}
	url := outbox.Event{EndpointURL: c.URL()}
	behind := enqueueTogether(t, b, outbox.Event{}, url, outbox.Event{}, url, outbox.Event{}, url)
	deferredBehindProbe(t, b, gates, behind)
	h.release <- http.StatusOK

	// Expected: a claim or two; left to the probe's expiry, two minutes.
	eventually(t, 20*time.Second, "the rows of both keys behind the probe delivered", func() bool {
		return b.count(`SELECT count(DISTINCT delivery_id) FROM webhook_deliveries WHERE status_code = 200 AND delivery_id::text = ANY ($1::text[])`, behind) == len(behind)
	})
}

// TestProbeOnAnotherInstanceEndsTheHold: two instances share the gate's store. Instance A
// holds the half-open probe (its one slot busy with it, so that it claims nothing else);
// instance B defers rows behind it and holds the endpoint. A's probe succeeds, closing the
// circuit, and A stops: only B is left to deliver, and only A was told of the close. B must
// deliver the rows that come next within about a reset (one second here), not when the probe
// it deferred them behind would have expired (two minutes).
func TestProbeOnAnotherInstanceEndsTheHold(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		prefix := redistest.Prefix(t)
		testProbeOnAnotherInstance(t, func() gate.Store { return redistest.Open(t, prefix) }, time.Second)
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		shared := memstore.New(memstore.Options{})
		testProbeOnAnotherInstance(t, func() gate.Store { return shared }, time.Second)
	})
}

// TestProbeElsewhereReleasesTheEndpointAtTheNextClaim is TestProbeOnAnotherInstanceEndsTheHold
// with instance B's breaker reset at its default, 5 minutes, longer than the probe's timeout
// (two minutes here): bounding B's hold by the reset shortens nothing then. B must read the
// breaker before its claims while it holds the endpoint behind the probe, and deliver the rows
// that come after the circuit closed at its next claim, within seconds, not after two minutes.
// (A's reset is a second only so that its probe comes without waiting five minutes.)
func TestProbeElsewhereReleasesTheEndpointAtTheNextClaim(t *testing.T) {
	t.Parallel()
	reset := gate.Params{}.WithDefaults().Reset
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		prefix := redistest.Prefix(t)
		testProbeOnAnotherInstance(t, func() gate.Store { return redistest.Open(t, prefix) }, reset)
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		shared := memstore.New(memstore.Options{})
		testProbeOnAnotherInstance(t, func() gate.Store { return shared }, reset)
	})
}

// testProbeOnAnotherInstance runs the case of TestProbeOnAnotherInstanceEndsTheHold, with
// instance B's breaker reset resetB (A's is a second).
func testProbeOnAnotherInstance(t *testing.T, newStore func() gate.Store, resetB time.Duration) {
	const reset = time.Second
	b := setup(t)
	h := newHeldProbe()
	c := newConsumer(t, h.respond)
	config := func() dispatcher.Config {
		cfg := b.config(c.URL())
		cfg.Timeout = 30 * time.Second // the held probe must not time out
		cfg.RetrySchedule = []time.Duration{100 * time.Millisecond, time.Hour}
		return cfg
	}
	trans := &transitions{}
	cfgA := config()
	cfgA.MaxInFlight = 1
	gA, err := gate.NewBreakerGate(newStore(), gate.Params{Threshold: 1, Reset: reset, RetryRPS: 100, ProbeTimeout: 2 * time.Minute},
		gate.Hooks{OnTransition: trans.add, OnFailOpen: func() { t.Error("gate failed open") }, Logger: cfgA.Logger})
	if err != nil {
		t.Fatal(err)
	}
	cfgA.Gate = gA
	a := b.start(cfgA)

	b.enqueue(outbox.Event{EventType: tripEvent})
	select {
	case <-h.arrived: // A holds the probe, and has no free slot
	case <-time.After(30 * time.Second):
		t.Fatal("timed out waiting for the half-open probe")
	}
	cfgB := config()
	ogB := probeGate(t, newStore(), cfgB, resetB)
	cfgB.Gate = ogB
	b.start(cfgB)
	behind := enqueueTogether(t, b, outbox.Event{}, outbox.Event{}, outbox.Event{})
	deferredBehindProbe(t, b, []*observedGate{ogB}, behind)

	h.release <- http.StatusOK
	eventually(t, 10*time.Second, "the probe to close the circuit", func() bool { _, ok := trans.first("half_open>closed"); return ok })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		t.Fatalf("stopping the instance that probed: %v", err)
	}

	start := time.Now()
	after := enqueueTogether(t, b, outbox.Event{}, outbox.Event{})
	// Expected: within a reset and a claim; held until the probe's expiry, two minutes.
	for _, rows := range []struct {
		what string
		ids  []string
	}{{"the rows that came after the circuit closed", after}, {"the rows deferred behind the probe", behind}} {
		eventually(t, 15*time.Second, "the other instance to deliver "+rows.what, func() bool {
			return b.count(`SELECT count(DISTINCT delivery_id) FROM webhook_deliveries WHERE status_code = 200 AND delivery_id::text = ANY ($1::text[])`,
				rows.ids) == len(rows.ids)
		})
	}
	t.Logf("delivered by the other instance %s after the circuit closed and the prober stopped", time.Since(start))
	for _, d := range ogB.deferrals() {
		if contains(after, d.deliveryID) {
			t.Errorf("row %s, enqueued after the circuit closed, deferred (%q for %s): the claim that took it did not know", d.deliveryID, d.reason, d.delay)
		}
	}
}
