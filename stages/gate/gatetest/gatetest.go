// Package gatetest is the contract suite every gate.Store passes: the same tests, through a
// gate.BreakerGate, against the in-process store (with a fake clock) and against real Redis
// (with Redis's clock). A store is correct when it passes Run; the semantics it checks are the
// ones documented in package gate.
//
// The suite is concurrent on purpose: the original dispatcher's read-modify-write admitted 20
// of 20 concurrent checks against a limit of 5 and counted 3 concurrent failures as 1, so each
// atomicity claim is tested with goroutines racing on one endpoint.
package gatetest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
)

// Backend is one shared store state, as several fluxhook instances see it.
type Backend interface {
	// NewStore returns a new handle on the backend's state: what another instance, or the
	// same instance after a restart, would use (for Redis a new client; in process the same
	// store, which is all a single instance has).
	NewStore(t testing.TB) gate.Store
	// Advance lets d pass on the store's clock (a fake clock jumps; Redis is waited for).
	Advance(t testing.TB, d time.Duration)
	// Slack is how far a delay the store computes may fall short of the ideal because real
	// time passed between the test's calls (0 for a fake clock).
	Slack() time.Duration
}

// Clock is a fake clock for stores that take one (memstore.Options.Now).
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock stopped at an arbitrary fixed instant.
func NewClock() *Clock { return &Clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Run runs the contract suite; newBackend is called once per test, which runs in parallel
// with the others, so each backend must be isolated (its own key prefix, its own store).
func Run(t *testing.T, newBackend func(t testing.TB) Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b Backend)
	}{
		{"RateLimitConcurrentChecksAdmitExactlyTheLimit", testRateLimitConcurrent},
		{"RateLimitSpacesRefusedRetriesAcrossBatchesAndInstances", testRateLimitSpacing},
		{"RateLimitCountsButNeverRefusesFirstAttempts", testRateLimitFirstAttempts},
		{"RateLimitReservesAShareForRetries", testRateLimitReserve},
		{"RateLimitPerEndpointOverride", testRateLimitOverride},
		{"RateLimitBacklogCostsLinearDeferrals", testRateLimitBacklog},
		{"RateLimitReturningRetryTakesTheNextFreePlace", testRateLimitReturning},
		{"RateLimitLateReturnsKeepTheRate", testRateLimitLateReturns},
		{"BreakerConcurrentFailuresAllCount", testBreakerConcurrentFailures},
		{"BreakerOpensExactlyAtThreshold", testBreakerOpensAtThreshold},
		{"BreakerCountsConsecutiveFailuresOnly", testBreakerConsecutive},
		{"BreakerOpenDefersToResetWithoutAttempt", testBreakerOpenDefers},
		{"HalfOpenConcurrentClaimsOneWins", testHalfOpenOneWinner},
		{"RowsBehindAProbeWaitUntilItExpiresAndOnClosedBringsThemBack", testRowsWaitForProbeExpiry},
		{"ProbeTimeoutAllowsANewProbe", testProbeTimeout},
		{"ProbeFailureReopensAndReleaseGivesItBack", testProbeFailureAndRelease},
		{"OpenSinceSurvivesFailedProbesAndResetsOnClose", testOpenSpell},
		{"RateLimitRefusedProbeDoesNotWedge", testRefusedProbe},
		{"StragglersDoNotMoveAnOpenCircuit", testStragglers},
		{"InstancesShareOneBreaker", testSharedAcrossInstances},
		{"ThresholdZeroNeverOpens", testThresholdZero},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newBackend(t))
		})
	}
}

// --- helpers ---

// endpoint returns a new endpoint with a random URL and its hash, as the send stage makes them.
func endpoint() *delivery.Endpoint {
	var b [8]byte
	_, _ = rand.Read(b[:])
	url := "https://consumer-" + hex.EncodeToString(b[:]) + ".example/hook?secret=do-not-store"
	sum := sha256.Sum256([]byte(url))
	return &delivery.Endpoint{URL: url, Hash: hex.EncodeToString(sum[:])}
}

// rows returns one delivery per attempt number, all to ep.
func rows(ep *delivery.Endpoint, attempts ...int) []*delivery.Delivery {
	out := make([]*delivery.Delivery, len(attempts))
	for i, a := range attempts {
		out[i] = &delivery.Delivery{ID: int64(i + 1), DeliveryID: fmt.Sprintf("d-%d", i), Attempt: a, Endpoint: ep}
	}
	return out
}

// recorder collects a gate's transitions and the endpoints its OnClosed hook was called for.
type recorder struct {
	mu     sync.Mutex
	trans  []string
	closed []string
}

func (r *recorder) onClosed(hash string) {
	r.mu.Lock()
	r.closed = append(r.closed, hash)
	r.mu.Unlock()
}

func (r *recorder) closedHashes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.closed)
}

func (r *recorder) add(from, to string) {
	r.mu.Lock()
	r.trans = append(r.trans, from+">"+to)
	r.mu.Unlock()
}

func (r *recorder) count(tr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.trans {
		if x == tr {
			n++
		}
	}
	return n
}

// newGate returns a gate on store that fails the test if it ever fails open: in the suite the
// store is always reachable, so a fail-open would hide a broken store.
func newGate(t testing.TB, store gate.Store, p gate.Params, rec *recorder) *gate.BreakerGate {
	t.Helper()
	p.StoreTimeout = 10 * time.Second
	hooks := gate.Hooks{OnFailOpen: func() { t.Errorf("gate failed open: the store returned an error") }}
	if rec != nil {
		hooks.OnTransition = rec.add
		hooks.OnClosed = rec.onClosed
	}
	g, err := gate.NewBreakerGate(store, p, hooks)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func ctx() context.Context { return context.Background() }

func allowed(d *delivery.Delivery) bool { return d.Outcome.Kind == delivery.Undecided }

func deferredFor(t testing.TB, d *delivery.Delivery, reason gate.Verdict) time.Duration {
	t.Helper()
	if d.Outcome.Kind != delivery.Defer || d.Outcome.Reason != reason.String() {
		t.Fatalf("row %d: outcome %s %q, want defer %q", d.ID, d.Outcome.Kind, d.Outcome.Reason, reason)
	}
	if d.GateToken != "" {
		t.Fatalf("deferred row %d holds a probe token", d.ID)
	}
	return d.Outcome.Delay
}

// settle gives each row an outcome and records the batch, as the dispatcher does after settle.
func settle(g *gate.BreakerGate, batch []*delivery.Delivery, o delivery.Outcome) {
	for _, d := range batch {
		d.Outcome = o
	}
	g.Record(ctx(), batch)
}

var (
	fail503   = delivery.Outcome{Kind: delivery.Retry, Status: 503}
	delivered = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
)

func inspect(t testing.TB, s gate.Store, ep *delivery.Endpoint) gate.Snapshot {
	t.Helper()
	snaps, err := s.Inspect(ctx(), []string{ep.Hash})
	if err != nil || len(snaps) != 1 {
		t.Fatalf("inspect: %v (%d snapshots)", err, len(snaps))
	}
	return snaps[0]
}

// openBreaker records threshold failures for ep.
func openBreaker(t testing.TB, g *gate.BreakerGate, ep *delivery.Endpoint) {
	t.Helper()
	attempts := make([]int, g.Params().Threshold)
	for i := range attempts {
		attempts[i] = 1
	}
	settle(g, rows(ep, attempts...), fail503)
}

// probe checks one row for ep and returns it (allowed with a token when it won the probe).
func probe(g *gate.BreakerGate, ep *delivery.Endpoint, attempt int) *delivery.Delivery {
	batch := rows(ep, attempt)
	g.Check(ctx(), batch)
	return batch[0]
}

// --- rate limiter ---

func testRateLimitConcurrent(t *testing.T, b Backend) {
	store := b.NewStore(t)
	const limit = 5
	window := time.Second
	g := newGate(t, store, gate.Params{RetryRPS: limit, Window: window}, nil)
	ep := endpoint()
	start := time.Now()
	batches := make([][]*delivery.Delivery, 50)
	var wg sync.WaitGroup
	for i := range batches {
		batches[i] = rows(ep, 2) // a retry
		wg.Go(func() { g.Check(ctx(), batches[i]) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	admitted := 0
	var delays []time.Duration
	for _, batch := range batches {
		if allowed(batch[0]) {
			admitted++
			continue
		}
		delays = append(delays, deferredFor(t, batch[0], gate.DeferRateLimit))
	}
	if admitted != limit {
		t.Fatalf("50 concurrent retries against a limit of %d admitted %d", limit, admitted)
	}
	// The refused retries get one slot each, one window/limit apart (the window held `limit`
	// retries: the limiter admits that many per window), the first when the oldest admitted
	// attempt leaves the window. Each check saw its own moment of the store's clock, within
	// the time the checks took.
	slices.Sort(delays)
	spacing := window / limit
	for k, d := range delays {
		want := window + time.Duration(k)*spacing
		if d > want+time.Microsecond || d < want-elapsed-b.Slack() {
			t.Fatalf("refused retry %d of %d deferred by %s, want its slot %s (less the %s the checks took)", k, len(delays), d, want, elapsed)
		}
	}
	// The next retry, however much later, queues behind them.
	next := probe(g, ep, 2)
	want := window + time.Duration(len(delays))*spacing
	if d := deferredFor(t, next, gate.DeferRateLimit); d > want+time.Microsecond || d < want-time.Since(start)-b.Slack() {
		t.Fatalf("the next retry deferred by %s, want the slot after the last one handed out (%s)", d, want)
	}
}

func testRateLimitSpacing(t *testing.T, b Backend) {
	p := gate.Params{RetryRPS: 5, Window: time.Second}
	g := newGate(t, b.NewStore(t), p, nil)
	other := newGate(t, b.NewStore(t), p, nil)
	ep := endpoint()
	start := time.Now()
	batch := rows(ep, 2, 2, 2, 2, 2, 2, 2, 2)
	g.Check(ctx(), batch)
	for i, d := range batch[:5] {
		if !allowed(d) {
			t.Fatalf("row %d of 8 retries refused with an empty window", i)
		}
	}
	// All five were counted at the same instant (one atomic call): the first refused retry
	// waits exactly a window, the next ones one window/limit more each.
	for k, d := range batch[5:] {
		want := time.Second + time.Duration(k)*200*time.Millisecond
		if got := deferredFor(t, d, gate.DeferRateLimit); got != want {
			t.Fatalf("refused retry %d deferred by %s, want %s", k, got, want)
		}
	}
	// Another instance's batch refused at (about) the same moment takes the next slots, rather
	// than the same ones: they would all come back together and collide again.
	later := rows(ep, 2, 2)
	other.Check(ctx(), later)
	elapsed := time.Since(start)
	for k, d := range later {
		want := time.Second + time.Duration(3+k)*200*time.Millisecond
		if got := deferredFor(t, d, gate.DeferRateLimit); got > want || got < want-elapsed-b.Slack() {
			t.Fatalf("the other instance's refused retry %d deferred by %s, want the slot after the first batch's (%s)", k, got, want)
		}
	}
}

// testRateLimitOverride: an endpoint with a rate limit of its own (a managed endpoint's
// retry_rps) is limited by it, not by the configured limit, and another endpoint keeps the
// configured one.
func testRateLimitOverride(t *testing.T, b Backend) {
	g := newGate(t, b.NewStore(t), gate.Params{RetryRPS: 100, Window: time.Second}, nil)
	own, other := endpoint(), endpoint()
	own.RetryRPS = 2
	limited := rows(own, 2, 2, 2)
	g.Check(ctx(), limited)
	if !allowed(limited[0]) || !allowed(limited[1]) {
		t.Fatalf("retries within the endpoint's own limit of 2 refused: %q, %q", limited[0].Outcome.Reason, limited[1].Outcome.Reason)
	}
	deferredFor(t, limited[2], gate.DeferRateLimit)
	free := rows(other, 2, 2, 2, 2, 2)
	g.Check(ctx(), free)
	for i, d := range free {
		if !allowed(d) {
			t.Fatalf("retry %d to an endpoint under the configured limit of 100 refused: %q", i, d.Outcome.Reason)
		}
	}
}

func testRateLimitFirstAttempts(t *testing.T, b Backend) {
	g := newGate(t, b.NewStore(t), gate.Params{RetryRPS: 3, Window: time.Second}, nil)
	ep := endpoint()
	first := rows(ep, 1, 1, 1, 1, 1)
	g.Check(ctx(), first)
	for i, d := range first {
		if !allowed(d) {
			t.Fatalf("first attempt %d refused: %s %q", i, d.Outcome.Kind, d.Outcome.Reason)
		}
	}
	// Five attempts are in the window against a limit of 3. Retries still get their reserved
	// share (ceil(3 × 0.5) = 2); the third waits until a place frees: three attempts have left,
	// i.e. a whole window here (they were all counted at once).
	retries := rows(ep, 2, 2, 2)
	g.Check(ctx(), retries)
	if !allowed(retries[0]) || !allowed(retries[1]) {
		t.Fatalf("retries within the reserve refused: %q, %q", retries[0].Outcome.Reason, retries[1].Outcome.Reason)
	}
	if d := deferredFor(t, retries[2], gate.DeferRateLimit); d > time.Second || d < time.Second-b.Slack() {
		t.Fatalf("retry deferred by %s, want about a window", d)
	}
	// First attempts are still never refused, however full the window.
	more := rows(ep, 1, 1, 1)
	g.Check(ctx(), more)
	for i, d := range more {
		if !allowed(d) {
			t.Fatalf("first attempt %d refused over the limit: %q", i, d.Outcome.Reason)
		}
	}
}

// repeat returns n copies of attempt.
func repeat(attempt, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = attempt
	}
	return out
}

func testRateLimitReserve(t *testing.T, b Backend) {
	window := time.Second
	const limit = 10
	p := gate.Params{RetryRPS: limit, Window: window}
	half := newGate(t, b.NewStore(t), p, nil) // RetryShare 0: the default, 0.5
	p.RetryShare = 0.25
	quarter := newGate(t, b.NewStore(t), p, nil)
	lanes := []struct {
		g       *gate.BreakerGate
		ep      *delivery.Endpoint
		reserve int
	}{
		{half, endpoint(), 5},    // ceil(10 × 0.5)
		{quarter, endpoint(), 3}, // ceil(10 × 0.25)
	}
	// Two windows with first attempts at three times the limit, then one with none.
	for round, firsts := range []int{3 * limit, 3 * limit, 0} {
		start := time.Now()
		for _, l := range lanes {
			fb := rows(l.ep, repeat(1, firsts)...)
			l.g.Check(ctx(), fb)
			for i, d := range fb {
				if !allowed(d) {
					t.Fatalf("round %d: first attempt %d refused: %q", round, i, d.Outcome.Reason)
				}
			}
			rb := rows(l.ep, repeat(2, 12)...)
			l.g.Check(ctx(), rb)
			want := l.reserve // under first-attempt traffic, the reserved share
			if firsts == 0 {
				want = limit // without it, the whole limit
			}
			for i, d := range rb {
				if i < want {
					if !allowed(d) {
						t.Fatalf("round %d (%d first attempts, reserve %d): retry %d refused (%q), want %d of 12 admitted",
							round, firsts, l.reserve, i, d.Outcome.Reason, want)
					}
					continue
				}
				delay := deferredFor(t, d, gate.DeferRateLimit)
				if round > 0 {
					continue // later slots queue behind the earlier rounds' (see the spacing tests)
				}
				// The first refused retry waits until the window frees a place (the
				// reserve's retries, or the first attempts, leave it: a window, less the
				// moments between the calls); the next ones a window/reserve apart, the rate
				// at which the reserve admits retries.
				k := time.Duration(i - want)
				ideal := window + k*window/time.Duration(l.reserve)
				if delay > ideal+time.Microsecond || delay < ideal-time.Since(start)-b.Slack() {
					t.Fatalf("reserve %d: refused retry %d deferred by %s, want %s", l.reserve, k, delay, ideal)
				}
			}
		}
		if round < 2 {
			b.Advance(t, window) // every attempt of this round leaves the window
		}
	}
}

// testRateLimitBacklog drives backlogs of retries to two endpoints through two instances,
// batch by batch as the dispatcher claims them, each deferred retry claimed again once its
// delay has passed, and counts the deferrals: spacing the deferred retries globally costs
// about one deferral per retry; spacing them per batch made every batch's retries come back
// together with the other batches', at a cost growing like backlog²/limit.
func testRateLimitBacklog(t *testing.T, b Backend) {
	const (
		limit     = 20
		window    = 100 * time.Millisecond
		step      = 5 * time.Millisecond
		batchSize = 20
		deadline  = 10 * time.Second // by the test's clock; the backlogs drain in about 1 s
	)
	p := gate.Params{RetryRPS: limit, Window: window}
	gates := []*gate.BreakerGate{newGate(t, b.NewStore(t), p, nil), newGate(t, b.NewStore(t), p, nil)}
	type lane struct {
		ep        *delivery.Endpoint
		firsts    bool            // a first attempt every step: `limit` per window, retries get the reserve
		due       []time.Duration // per retry, when it is claimed (again); -1 once admitted
		left      int
		deferrals int
	}
	lanes := []*lane{
		{ep: endpoint(), due: make([]time.Duration, 200)},
		{ep: endpoint(), due: make([]time.Duration, 100), firsts: true},
	}
	for _, l := range lanes {
		l.left = len(l.due)
	}
	turn := 0
	// now is the test's clock: the sum of Advance calls, which is never ahead of the store's
	// (Advance lets at least that much pass), so a retry is never claimed before its delay.
	for now := time.Duration(0); ; now += step {
		busy := false
		for _, l := range lanes {
			if l.left == 0 {
				continue
			}
			busy = true
			var claimed []int // retry indexes, in claim order
			for i, d := range l.due {
				if d >= 0 && d <= now {
					claimed = append(claimed, i)
				}
			}
			first := l.firsts
			for len(claimed) > 0 || first {
				n := min(len(claimed), batchSize)
				attempts := repeat(2, n)
				if first {
					attempts = append([]int{1}, attempts...)
					if len(attempts) > batchSize {
						attempts, n = attempts[:batchSize], n-1
					}
				}
				batch := rows(l.ep, attempts...)
				gates[turn%len(gates)].Check(ctx(), batch)
				turn++
				if first {
					if !allowed(batch[0]) {
						t.Fatalf("a first attempt was refused: %q", batch[0].Outcome.Reason)
					}
					batch, first = batch[1:], false
				}
				for j, d := range batch {
					i := claimed[j]
					if allowed(d) {
						l.due[i] = -1
						l.left--
						continue
					}
					l.due[i] = now + deferredFor(t, d, gate.DeferRateLimit)
					l.deferrals++
				}
				claimed = claimed[n:]
			}
			if l.deferrals > 2*len(l.due) {
				t.Fatalf("backlog of %d retries (first attempts: %v): %d deferrals with %d retries still waiting, want at most %d in all",
					len(l.due), l.firsts, l.deferrals, l.left, 2*len(l.due))
			}
		}
		if !busy {
			for _, l := range lanes {
				t.Logf("backlog of %d retries (first attempts: %v): %d deferrals, drained in %s", len(l.due), l.firsts, l.deferrals, now)
			}
			return
		}
		if now > deadline {
			t.Fatalf("backlogs not drained after %s: %d and %d retries left", now, lanes[0].left, lanes[1].left)
		}
		b.Advance(t, step)
	}
}

// returning marks d as a retry that comes back from a rate-limit deferral, as the claim reads
// it from the row (delivery.Delivery.DeferredBy).
func returning(d *delivery.Delivery) *delivery.Delivery {
	d.DeferredBy = gate.DeferRateLimit.String()
	return d
}

// testRateLimitReturning: a limit of 2 per second, six retries queued one slot (half a window)
// apart. The first comes back 300 ms after its slot, the second on time: both are admitted.
// The third, on time too, finds the window still holding the first (the place its slot was
// computed for frees 300 ms late): it is refused, and must be promised that place, 300 ms on,
// not the slot after the queue's last (2 s on), which wasted a place of the rate per late
// return. Another returning retry refused then gets the next place, when the second leaves
// (500 ms on), not the same one: they would come back together and one would be refused
// again. A retry refused for the first time still queues after the last slot. When the first
// place frees, a newly due retry does not take it from the retry it was promised to: it
// queues at the end, and the returning retry is admitted.
func testRateLimitReturning(t *testing.T, b Backend) {
	const window = time.Second
	g := newGate(t, b.NewStore(t), gate.Params{RetryRPS: 2, Window: window}, nil)
	ep := endpoint()
	first := rows(ep, 2, 2)
	g.Check(ctx(), first)
	if !allowed(first[0]) || !allowed(first[1]) {
		t.Fatal("retries refused with an empty window")
	}
	start := time.Now()
	queued := rows(ep, repeat(2, 6)...)
	g.Check(ctx(), queued)
	for k, d := range queued { // slots at 1 s, 1.5 s, ..., 3.5 s
		want := window + time.Duration(k)*window/2
		if got := deferredFor(t, d, gate.DeferRateLimit); got > want+time.Microsecond || got < want-time.Since(start)-b.Slack() {
			t.Fatalf("queued retry %d deferred by %s, want %s", k, got, want)
		}
	}
	b.Advance(t, 1300*time.Millisecond) // the first comes back 300 ms late
	again := []*delivery.Delivery{returning(rows(ep, 2)[0])}
	if g.Check(ctx(), again); !allowed(again[0]) {
		t.Fatalf("the first queued retry, back 300 ms after its slot, refused: %q", again[0].Outcome.Reason)
	}
	b.Advance(t, 200*time.Millisecond) // 1.5 s: the second, on time
	again = []*delivery.Delivery{returning(rows(ep, 2)[0])}
	if g.Check(ctx(), again); !allowed(again[0]) {
		t.Fatalf("the second queued retry, back at its slot with one retry in the window, refused: %q", again[0].Outcome.Reason)
	}
	b.Advance(t, 500*time.Millisecond) // 2 s: the third, on time
	mark := time.Now()
	// Redis's clock only runs ahead of the test's, which shortens the delays; it cannot
	// lengthen them (the test's pauses count from mark).
	within := func(what string, d *delivery.Delivery, want time.Duration) {
		t.Helper()
		if got := deferredFor(t, d, gate.DeferRateLimit); got > want+time.Millisecond || got < want-time.Since(mark)-b.Slack() {
			t.Fatalf("%s deferred by %s, want %s", what, got, want)
		}
	}
	// The first retry leaves the window at 2.3 s: the place frees then.
	third := []*delivery.Delivery{returning(rows(ep, 2)[0])}
	g.Check(ctx(), third)
	within("the third queued retry, back at its slot and refused (the end of the queue is 2 s on)", third[0], 300*time.Millisecond)
	// Another returning retry, in another check: the second leaves at 2.5 s.
	other := []*delivery.Delivery{returning(rows(ep, 2)[0])}
	g.Check(ctx(), other)
	within("another returning retry refused (the place at 300 ms is promised)", other[0], 500*time.Millisecond)
	// A retry refused for the first time queues after the last slot (3.5 s): at 4 s, 2 s on.
	// The returning retries took no slot of the queue.
	fresh := rows(ep, 2)
	g.Check(ctx(), fresh)
	within("a new refused retry (the slot after the queue's last)", fresh[0], 2*time.Second)

	b.Advance(t, 350*time.Millisecond) // 2.35 s: the first retry left at 2.3 s
	mark = time.Now()
	batch := []*delivery.Delivery{rows(ep, 2)[0], returning(rows(ep, 2)[0])}
	g.Check(ctx(), batch)
	// The place is promised (the last promise, 2.5 s, is held for a spacing, 500 ms): the
	// newly due retry queues after the last slot (4 s), at 4.5 s.
	within("a newly due retry while the freed place is promised", batch[0], 2150*time.Millisecond)
	if !allowed(batch[1]) {
		t.Fatalf("the third retry, back for the place promised to it, refused: %q (%s)", batch[1].Outcome.Reason, batch[1].Outcome.Delay)
	}
}

// testRateLimitLateReturns runs issue 32's case through two instances, as the dispatcher
// claims it, on a time scale of its own (a window of 100 ms): events whose every attempt
// fails, with two retries each, a window apart, under a limit of 2; every row due is claimed
// after a claim lag of 0 to 10% of the window (a timer, a claim, a round trip), a deferred one
// with its deferral reason (returning). Retries must run at the endpoint's rate after the
// first window, within 10%: the limit alone, the reserved share beside a steady flow of first
// attempts (five per window), and at a limit of 10 (a managed endpoint's) beside a first
// attempt every claim, with at most four deferrals per retry. Queueing every retry refused on
// its return at the end of the queue lost a place each time: 85% of the limit alone, 76% of
// the share beside the flow. Promising the returning retries one place between them made them
// come back together, all but one refused each time (7 deferrals per retry at the limit of
// 10); letting newly due retries take the places promised to returning ones sent those to the
// back of the promises (87% alone, 82% beside the flow).
func testRateLimitLateReturns(t *testing.T, b Backend) {
	if b.Slack() > 0 {
		// The rate is measured by the test's clock, the sum of its steps, which a store with
		// a clock of its own (Redis) runs ahead of by every pause: the test cannot tell the
		// store's rate. testRateLimitReturning pins the same places on every store.
		t.Skip("the store's clock is not the test's")
	}
	const (
		window = 100 * time.Millisecond
		step   = time.Millisecond
	)
	lags := []time.Duration{0, 10 * step, 4 * step, 0, 7 * step, 2 * step, 5 * step} // claim lag per claim, in turn
	p := gate.Params{RetryRPS: 2, Window: window}
	gates := []*gate.BreakerGate{newGate(t, b.NewStore(t), p, nil), newGate(t, b.NewStore(t), p, nil)}
	for _, lane := range []struct {
		name        string
		limit       int           // the endpoint's own (0: the gate's, 2)
		events      int           // each with a first attempt and two retries
		firstsEvery time.Duration // a first attempt of another event this often (0: none)
		rate        int           // retries per window the limiter admits
	}{
		{"alone", 0, 30, 0, 2},
		{"beside first attempts", 0, 30, window / 5, p.RetryReserve()},
		{"limit 10 beside first attempts", 10, 100, step, 5},
	} {
		ep := endpoint()
		ep.RetryRPS = lane.limit
		type row struct {
			due     time.Duration // when it is claimed; -1 once its last attempt was made
			attempt int
			back    bool // it comes back from a rate-limit deferral
		}
		pending := make([]*row, lane.events)
		for i := range pending {
			pending[i] = &row{attempt: 1}
		}
		left, deferrals, turn, claims := lane.events, 0, 0, 0
		var retries []time.Duration // when each retry was admitted
		for now := time.Duration(0); left > 0; now += step {
			if now > 100*window*time.Duration(lane.events)/time.Duration(lane.rate) {
				t.Fatalf("%s: %d of %d events with attempts left after %s", lane.name, left, lane.events, now)
			}
			if lane.firstsEvery > 0 && now%lane.firstsEvery == 0 {
				f := rows(ep, 1)
				if gates[turn%len(gates)].Check(ctx(), f); !allowed(f[0]) {
					t.Fatalf("a first attempt was refused: %q", f[0].Outcome.Reason)
				}
				turn++
			}
			var claimed []*row
			for _, r := range pending {
				if r.due >= 0 && r.due <= now {
					claimed = append(claimed, r)
				}
			}
			if len(claimed) == 0 {
				b.Advance(t, step)
				continue
			}
			batch := make([]*delivery.Delivery, len(claimed))
			for j, r := range claimed {
				batch[j] = &delivery.Delivery{ID: int64(j + 1), Attempt: r.attempt, Endpoint: ep}
				if r.back {
					returning(batch[j])
				}
			}
			gates[turn%len(gates)].Check(ctx(), batch)
			turn++
			for j, d := range batch {
				r := claimed[j]
				lag := lags[claims%len(lags)]
				claims++
				if !allowed(d) {
					r.due, r.back = now+deferredFor(t, d, gate.DeferRateLimit)+lag, true
					deferrals++
					continue
				}
				if r.attempt > 1 {
					retries = append(retries, now)
				}
				if r.attempt == 3 {
					r.due, left = -1, left-1
					continue
				}
				// It failed: its next attempt is due a window on (the retry schedule).
				r.attempt, r.due, r.back = r.attempt+1, now+window+lag, false
			}
			b.Advance(t, step)
		}
		// After the first window of retries, they go at the rate, one window/rate apart.
		first, last := retries[0], retries[len(retries)-1]
		after := 0
		for _, x := range retries {
			if x >= first+window {
				after++
			}
		}
		got := float64(after) / float64(lane.rate) * float64(window) / float64(last-first-window+window/time.Duration(lane.rate))
		t.Logf("%s: %d retries, claim lags up to %s: from %s to %s, %.0f%% of the rate after the first window, %d deferrals",
			lane.name, len(retries), 10*step, first, last, 100*got, deferrals)
		if got < 0.9 {
			t.Errorf("%s: retries ran at %.0f%% of their rate after the first window, want at least 90%%", lane.name, 100*got)
		}
		if n := len(retries); deferrals > 4*n {
			t.Errorf("%s: %d deferrals for %d retries, want at most %d", lane.name, deferrals, n, 4*n)
		}
	}
}

// --- breaker ---

func testBreakerConcurrentFailures(t *testing.T, b Backend) {
	store := b.NewStore(t)
	rec := &recorder{}
	g := newGate(t, store, gate.Params{Threshold: 4, Reset: time.Minute, RetryRPS: -1}, rec)
	ep := endpoint()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { settle(g, rows(ep, 1), fail503) })
	}
	wg.Wait()
	if s := inspect(t, store, ep); s.State != gate.Closed || s.Failures != 3 {
		t.Fatalf("after 3 concurrent failures: %+v, want closed with 3 failures", s)
	}
	if d := probe(g, ep, 1); !allowed(d) {
		t.Fatalf("below the threshold a row was held: %q", d.Outcome.Reason)
	}
	settle(g, rows(ep, 1), fail503)
	if s := inspect(t, store, ep); s.State != gate.Open {
		t.Fatalf("4th failure with threshold 4: state %s", s.State)
	}
	if n := rec.count("closed>open"); n != 1 {
		t.Fatalf("closed>open reported %d times", n)
	}
}

func testBreakerOpensAtThreshold(t *testing.T, b Backend) {
	store := b.NewStore(t)
	rec := &recorder{}
	g := newGate(t, store, gate.Params{Threshold: 3, Reset: time.Minute, RetryRPS: -1}, rec)
	ep := endpoint()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { settle(g, rows(ep, 1), fail503) })
	}
	wg.Wait()
	if s := inspect(t, store, ep); s.State != gate.Open {
		t.Fatalf("3 concurrent failures with threshold 3: %+v, want open", s)
	}
	if n := rec.count("closed>open"); n != 1 {
		t.Fatalf("closed>open reported %d times, want exactly once", n)
	}
	if d := probe(g, ep, 1); d.Outcome.Kind != delivery.Defer {
		t.Fatal("open circuit allowed a row")
	}
}

func testBreakerConsecutive(t *testing.T, b Backend) {
	store := b.NewStore(t)
	g := newGate(t, store, gate.Params{Threshold: 3, Reset: time.Minute, RetryRPS: -1}, nil)
	ep := endpoint()
	settle(g, rows(ep, 1, 1), fail503)
	settle(g, rows(ep, 1), delivered) // a success resets the count
	settle(g, rows(ep, 1, 1), fail503)
	// A permanent answer (404), a retryable failure dead-lettered after its last attempt
	// (Permanent with 503), and rows never attempted: only the 503 counts.
	batch := rows(ep, 1, 3, 1)
	batch[0].Outcome = delivery.Outcome{Kind: delivery.Permanent, Status: 404}
	batch[1].Outcome = delivery.Outcome{Kind: delivery.Permanent, Status: 503, Reason: "attempts exhausted"}
	batch[2].Outcome = delivery.Outcome{Kind: delivery.Release}
	g.Record(ctx(), batch[:1])
	if s := inspect(t, store, ep); s.State != gate.Closed || s.Failures != 2 {
		t.Fatalf("fail, fail, success, fail, fail, 404: %+v, want closed with 2", s)
	}
	g.Record(ctx(), batch[1:])
	if s := inspect(t, store, ep); s.State != gate.Open {
		t.Fatalf("exhausted 503 did not count as the third failure: %+v", s)
	}
}

func testBreakerOpenDefers(t *testing.T, b Backend) {
	store := b.NewStore(t)
	reset := time.Second
	g := newGate(t, store, gate.Params{Threshold: 1, Reset: reset, RetryRPS: 1}, nil)
	ep := endpoint()
	openBreaker(t, g, ep)
	start := time.Now()
	batch := rows(ep, 1, 2, 3, 1)
	g.Check(ctx(), batch)
	for _, d := range batch {
		wait := deferredFor(t, d, gate.DeferOpen)
		if wait > reset || wait < reset-time.Since(start)-b.Slack() {
			t.Fatalf("row deferred by %s, want to the reset time (%s)", wait, reset)
		}
	}
	// Deferred rows were not attempted: they are not counted by the rate limiter, whose
	// limit of 1 would otherwise refuse the next retry.
	b.Advance(t, reset)
	if d := probe(g, ep, 2); !allowed(d) || d.GateToken == "" {
		t.Fatalf("after the reset, the first retry is not the probe: %s %q", d.Outcome.Kind, d.Outcome.Reason)
	}
}

func testHalfOpenOneWinner(t *testing.T, b Backend) {
	store := b.NewStore(t)
	rec := &recorder{}
	reset := 100 * time.Millisecond
	g := newGate(t, store, gate.Params{Threshold: 1, Reset: reset, RetryRPS: -1, ProbeTimeout: time.Minute}, rec)
	ep := endpoint()
	openBreaker(t, g, ep)
	b.Advance(t, reset)
	// Ten instances race for the probe, each with its own gate on its own store handle.
	winners := make([]*delivery.Delivery, 10)
	var wg sync.WaitGroup
	for i := range winners {
		gi := newGate(t, b.NewStore(t), g.Params(), rec)
		wg.Go(func() { winners[i] = probe(gi, ep, 2) })
	}
	wg.Wait()
	won := 0
	for _, d := range winners {
		if allowed(d) {
			if d.GateToken == "" {
				t.Fatal("a half-open row was allowed without the probe token")
			}
			won++
			continue
		}
		if wait := deferredFor(t, d, gate.DeferProbe); wait <= 0 || wait > time.Minute {
			t.Fatalf("row behind the probe deferred by %s, want (0, %s]: until the probe expires", wait, time.Minute)
		}
	}
	if won != 1 {
		t.Fatalf("%d of 10 concurrent half-open claims won the probe, want exactly 1", won)
	}
	if n := rec.count("open>half_open"); n != 1 {
		t.Fatalf("open>half_open reported %d times", n)
	}
	if s := inspect(t, store, ep); s.State != gate.HalfOpen || !s.ProbeHeld {
		t.Fatalf("during the probe: %+v", s)
	}
}

func testRowsWaitForProbeExpiry(t *testing.T, b Backend) {
	store := b.NewStore(t)
	rec, otherRec := &recorder{}, &recorder{}
	reset, probeTimeout := 100*time.Millisecond, time.Minute
	p := gate.Params{Threshold: 1, Reset: reset, RetryRPS: -1, ProbeTimeout: probeTimeout}
	g := newGate(t, store, p, rec)
	other := newGate(t, b.NewStore(t), p, otherRec)
	ep := endpoint()
	openBreaker(t, g, ep)
	b.Advance(t, reset)
	start := time.Now()
	held := probe(g, ep, 2)
	if held.GateToken == "" {
		t.Fatal("no probe granted after the reset")
	}
	// The probe hangs. Rows behind it, on any instance, wait until it expires, once, rather
	// than coming back every second to be deferred again; a success would bring them forward
	// sooner (OnClosed).
	for _, gi := range []*gate.BreakerGate{g, other} {
		batch := rows(ep, 1, 2, 3)
		gi.Check(ctx(), batch)
		for _, d := range batch {
			if wait := deferredFor(t, d, gate.DeferProbe); wait > probeTimeout || wait < probeTimeout-time.Since(start)-b.Slack() {
				t.Fatalf("row behind a held probe deferred by %s, want until the probe expires (%s)", wait, probeTimeout)
			}
			// The probe may be another instance's, whose end this one is not told of: the
			// caller's claims should look again after a reset.
			if d.RecheckIn != reset {
				t.Fatalf("row behind a held probe: RecheckIn %s, want the reset (%s)", d.RecheckIn, reset)
			}
		}
	}
	passed := 200 * time.Millisecond
	b.Advance(t, passed)
	if wait := deferredFor(t, probe(other, ep, 1), gate.DeferProbe); wait > probeTimeout-passed || wait < probeTimeout-passed-time.Since(start)-b.Slack() {
		t.Fatalf("%s later, a row behind the probe deferred by %s, want the probe's remaining time (%s)", passed, wait, probeTimeout-passed)
	}
	// The probe fails: the circuit opens again, nothing to bring forward.
	settle(g, []*delivery.Delivery{held}, fail503)
	if got := rec.closedHashes(); len(got) != 0 {
		t.Fatalf("OnClosed called for %v when the probe failed", got)
	}
	b.Advance(t, reset)
	// The other instance's probe succeeds: its gate, and only its gate, calls OnClosed once,
	// with the endpoint's hash.
	next := probe(other, ep, 1)
	if next.GateToken == "" {
		t.Fatal("no probe granted after the second reset")
	}
	settle(other, []*delivery.Delivery{next}, delivered)
	settle(other, rows(ep, 1), delivered) // successes while closed close nothing
	settle(g, []*delivery.Delivery{held}, delivered)
	if got := otherRec.closedHashes(); !slices.Equal(got, []string{ep.Hash}) {
		t.Fatalf("OnClosed of the instance whose probe succeeded: %v, want once with the endpoint's hash", got)
	}
	if got := rec.closedHashes(); len(got) != 0 {
		t.Fatalf("OnClosed called on an instance that closed nothing: %v", got)
	}
	if n := otherRec.count("half_open>closed"); n != 1 {
		t.Fatalf("half_open>closed reported %d times", n)
	}
}

func testProbeTimeout(t *testing.T, b Backend) {
	store := b.NewStore(t)
	rec := &recorder{}
	reset, probeTimeout := 100*time.Millisecond, 2*time.Second
	g := newGate(t, store, gate.Params{Threshold: 1, Reset: reset, RetryRPS: -1, ProbeTimeout: probeTimeout}, rec)
	ep := endpoint()
	openBreaker(t, g, ep)
	b.Advance(t, reset)
	crashed := probe(g, ep, 1) // its instance crashes: the outcome never comes back
	if crashed.GateToken == "" {
		t.Fatal("no probe granted after the reset")
	}
	if d := probe(g, ep, 1); allowed(d) {
		t.Fatal("a second probe was granted while the first is held")
	}
	b.Advance(t, probeTimeout)
	next := probe(g, ep, 1)
	if !allowed(next) || next.GateToken == "" || next.GateToken == crashed.GateToken {
		t.Fatalf("after the probe timeout no new probe: %s %q", next.Outcome.Kind, next.Outcome.Reason)
	}
	// The expired prober reports late: it no longer owns the probe, so its success neither
	// closes the circuit nor releases the new probe.
	settle(g, []*delivery.Delivery{crashed}, delivered)
	if s := inspect(t, store, ep); s.State != gate.HalfOpen || !s.ProbeHeld {
		t.Fatalf("an expired probe's late result changed the breaker: %+v", s)
	}
	settle(g, []*delivery.Delivery{next}, delivered)
	if s := inspect(t, store, ep); s.State != gate.Closed || s.ProbeHeld {
		t.Fatalf("the probe's success did not close the circuit: %+v", s)
	}
	if n := rec.count("half_open>closed"); n != 1 {
		t.Fatalf("half_open>closed reported %d times", n)
	}
	if d := probe(g, ep, 2); !allowed(d) || d.GateToken != "" {
		t.Fatal("closed circuit held a row or granted a probe")
	}
}

func testProbeFailureAndRelease(t *testing.T, b Backend) {
	store := b.NewStore(t)
	rec := &recorder{}
	reset := time.Second
	g := newGate(t, store, gate.Params{Threshold: 1, Reset: reset, RetryRPS: -1, ProbeTimeout: time.Minute}, rec)
	ep := endpoint()
	openBreaker(t, g, ep)
	b.Advance(t, reset)

	// A probe that was not attempted (saturated endpoint, shutdown) gives the probe back at
	// once without counting; so does a permanent answer.
	for _, o := range []delivery.Outcome{{Kind: delivery.Release}, {Kind: delivery.Permanent, Status: 404}} {
		p := probe(g, ep, 1)
		if p.GateToken == "" {
			t.Fatalf("no probe granted (before %s)", o.Kind)
		}
		settle(g, []*delivery.Delivery{p}, o)
		if s := inspect(t, store, ep); s.State != gate.HalfOpen || s.ProbeHeld {
			t.Fatalf("after a probe's %s: %+v, want half-open with the probe free", o.Kind, s)
		}
		// The caller learns that the next probe may go now: the rows it deferred behind
		// this one need not wait for its expiry.
		if !p.ProbeEnded || p.NextProbe != 0 {
			t.Fatalf("after a probe's %s: ProbeEnded %v, NextProbe %s; want the next probe now", o.Kind, p.ProbeEnded, p.NextProbe)
		}
	}
	// The probe fails: open again for another reset.
	p := probe(g, ep, 1)
	settle(g, []*delivery.Delivery{p}, fail503)
	if s := inspect(t, store, ep); s.State != gate.Open || s.OpenFor < reset-b.Slack() || s.OpenFor > reset {
		t.Fatalf("after the probe failed: %+v, want open for %s", s, reset)
	}
	if n := rec.count("half_open>open"); n != 1 {
		t.Fatalf("half_open>open reported %d times", n)
	}
	if !p.ProbeEnded || p.NextProbe != reset {
		t.Fatalf("after the probe failed: ProbeEnded %v, NextProbe %s; want the next probe after the reset (%s)", p.ProbeEnded, p.NextProbe, reset)
	}
	// A straggler's failure, and the failed probe's result told again (its probe gone), move
	// nothing and say nothing of the next probe.
	straggler := rows(ep, 1)[0]
	settle(g, []*delivery.Delivery{straggler}, fail503)
	p.ProbeEnded, p.NextProbe = false, 0
	settle(g, []*delivery.Delivery{p}, fail503)
	if straggler.ProbeEnded || p.ProbeEnded {
		t.Fatal("a result that moved nothing reported a probe's end")
	}
	d := probe(g, ep, 1)
	deferredFor(t, d, gate.DeferOpen)
	// The next probe succeeds: the circuit closes, which is no end without success.
	b.Advance(t, reset)
	p = probe(g, ep, 1)
	settle(g, []*delivery.Delivery{p}, delivered)
	if p.ProbeEnded {
		t.Fatal("a probe that closed the circuit reported an end without success")
	}
}

// testOpenSpell: a failed probe re-opens the circuit for another reset time (OpenFor starts
// again) but not a new spell: OpenSince stays where the circuit first opened and FailedProbes
// counts the probe; a probe given back counts nothing; the probe's success closes the circuit
// and resets both, so the next opening starts a new spell. Operators read OpenSince as how
// long the endpoint has been down (the bug: status showed the time since the last probe).
func testOpenSpell(t *testing.T, b Backend) {
	store := b.NewStore(t)
	reset := 100 * time.Millisecond
	g := newGate(t, store, gate.Params{Threshold: 2, Reset: reset, RetryRPS: -1, ProbeTimeout: time.Minute}, nil)
	ep := endpoint()
	settle(g, rows(ep, 1), fail503)
	if s := inspect(t, store, ep); s.State != gate.Closed || s.Failures != 1 || !s.OpenSince.IsZero() || s.FailedProbes != 0 {
		t.Fatalf("closed with a failure: %+v, want no OpenSince and no failed probes", s)
	}
	settle(g, rows(ep, 1), fail503)
	opened := inspect(t, store, ep)
	if opened.State != gate.Open || opened.OpenSince.IsZero() || opened.FailedProbes != 0 {
		t.Fatalf("just opened: %+v, want open with OpenSince set and no failed probes", opened)
	}
	if age := opened.At.Sub(opened.OpenSince); age < 0 || age > b.Slack() {
		t.Fatalf("just opened: OpenSince %s before the snapshot, want about now", age)
	}
	// A straggler's failure while open is no probe.
	settle(g, rows(ep, 1), fail503)
	for n := 1; n <= 2; n++ {
		b.Advance(t, reset)
		p := probe(g, ep, 2)
		if p.GateToken == "" {
			t.Fatalf("no probe granted after reset %d", n)
		}
		if s := inspect(t, store, ep); s.State != gate.HalfOpen || !s.OpenSince.Equal(opened.OpenSince) || s.FailedProbes != n-1 {
			t.Fatalf("half-open before probe %d: %+v, want OpenSince %s and %d failed probes", n, s, opened.OpenSince, n-1)
		}
		settle(g, []*delivery.Delivery{p}, fail503)
		s := inspect(t, store, ep)
		if s.State != gate.Open || !s.OpenSince.Equal(opened.OpenSince) || s.FailedProbes != n {
			t.Fatalf("after failed probe %d: %+v, want open since %s (unchanged) with %d failed probes", n, s, opened.OpenSince, n)
		}
		// OpenFor restarted with the probe; the spell is older than one reset time per probe.
		if s.OpenFor < reset-b.Slack() || s.OpenFor > reset {
			t.Fatalf("after failed probe %d: open for %s, want another reset time (%s)", n, s.OpenFor, reset)
		}
		if age := s.At.Sub(s.OpenSince); age < time.Duration(n)*reset {
			t.Fatalf("after failed probe %d: OpenSince %s ago, want at least %s", n, age, time.Duration(n)*reset)
		}
	}
	// A probe given back (not attempted) is no failed probe.
	b.Advance(t, reset)
	p := probe(g, ep, 2)
	settle(g, []*delivery.Delivery{p}, delivery.Outcome{Kind: delivery.Release})
	if s := inspect(t, store, ep); s.State != gate.HalfOpen || !s.OpenSince.Equal(opened.OpenSince) || s.FailedProbes != 2 {
		t.Fatalf("after a probe was given back: %+v, want half-open since %s with 2 failed probes", s, opened.OpenSince)
	}
	// The probe's success closes the circuit: both reset, with no failures left.
	p = probe(g, ep, 2)
	settle(g, []*delivery.Delivery{p}, delivered)
	if s := inspect(t, store, ep); s.State != gate.Closed || !s.OpenSince.IsZero() || s.FailedProbes != 0 || s.Failures != 0 {
		t.Fatalf("after the probe succeeded: %+v, want closed, no OpenSince, no failed probes", s)
	}
	settle(g, rows(ep, 1), fail503)
	if s := inspect(t, store, ep); s.State != gate.Closed || s.Failures != 1 || !s.OpenSince.IsZero() || s.FailedProbes != 0 {
		t.Fatalf("closed with a failure after the spell: %+v, want no OpenSince and no failed probes", s)
	}
	// The next opening is a new spell.
	settle(g, rows(ep, 1), fail503)
	again := inspect(t, store, ep)
	if again.State != gate.Open || again.FailedProbes != 0 || !again.OpenSince.After(opened.OpenSince) {
		t.Fatalf("opened again: %+v, want a new spell (OpenSince after %s, no failed probes)", again, opened.OpenSince)
	}
	if age := again.At.Sub(again.OpenSince); age < 0 || age > b.Slack() {
		t.Fatalf("opened again: OpenSince %s before the snapshot, want about now", age)
	}
}

func testRefusedProbe(t *testing.T, b Backend) {
	store := b.NewStore(t)
	reset, window := 100*time.Millisecond, time.Second
	// A probe timeout far longer than the test: a wedged probe would never come free.
	g := newGate(t, store, gate.Params{Threshold: 1, Reset: reset, RetryRPS: 1, Window: window, ProbeTimeout: time.Hour}, nil)
	ep := endpoint()
	first := probe(g, ep, 2) // a retry: fills the window and the retries' reserve (limit 1, reserve 1)
	if !allowed(first) {
		t.Fatal("first retry refused")
	}
	settle(g, []*delivery.Delivery{first}, fail503) // opens the circuit
	b.Advance(t, reset)
	refused := probe(g, ep, 2)
	if wait := deferredFor(t, refused, gate.DeferRateLimit); wait > window-reset || wait < window-reset-b.Slack() {
		t.Fatalf("refused probe deferred by %s, want until the first retry leaves the window (%s)", wait, window-reset)
	}
	if s := inspect(t, store, ep); s.ProbeHeld {
		t.Fatalf("the rate limiter refused the probe but it is still held: %+v", s)
	}
	// In the same batch, a first attempt (never refused) behind a refused retry takes the probe.
	batch := rows(ep, 2, 1)
	g.Check(ctx(), batch)
	deferredFor(t, batch[0], gate.DeferRateLimit)
	if !allowed(batch[1]) || batch[1].GateToken == "" {
		t.Fatalf("the first attempt behind a refused retry did not take the probe: %q", batch[1].Outcome.Reason)
	}
	settle(g, batch[1:], delivery.Outcome{Kind: delivery.Release})
	// Once the window frees, a retry gets the probe: nothing waited for the probe timeout.
	b.Advance(t, window)
	retry := probe(g, ep, 2)
	if !allowed(retry) || retry.GateToken == "" {
		t.Fatalf("after the window freed the retry is not the probe: %s %q", retry.Outcome.Kind, retry.Outcome.Reason)
	}
}

func testStragglers(t *testing.T, b Backend) {
	store := b.NewStore(t)
	reset := 10 * time.Second
	g := newGate(t, store, gate.Params{Threshold: 2, Reset: reset, RetryRPS: -1}, nil)
	ep := endpoint()
	openBreaker(t, g, ep)
	before := inspect(t, store, ep)
	// Attempts admitted before the circuit opened report after it: neither a success nor a
	// failure changes it (the open period is not extended, the circuit is not closed).
	settle(g, rows(ep, 1), delivered)
	settle(g, rows(ep, 1, 1, 1), fail503)
	after := inspect(t, store, ep)
	if after.State != gate.Open || after.OpenFor > before.OpenFor {
		t.Fatalf("stragglers moved the open circuit: before %+v, after %+v", before, after)
	}
}

func testSharedAcrossInstances(t *testing.T, b Backend) {
	// Long enough that the checks below all happen while the circuit is open even on a loaded
	// machine under -race, where Redis's clock (the one that counts) runs on: 200 ms was not.
	reset := 1500 * time.Millisecond
	p := gate.Params{Threshold: 2, Reset: reset, RetryRPS: -1, ProbeTimeout: time.Minute}
	a := newGate(t, b.NewStore(t), p, nil)
	other := newGate(t, b.NewStore(t), p, nil)
	ep := endpoint()
	settle(a, rows(ep, 1), fail503)
	settle(other, rows(ep, 1), fail503) // one failure seen by each instance: the shared count is 2
	if d := probe(a, ep, 1); d.Outcome.Kind != delivery.Defer {
		t.Fatal("two instances' failures did not add up to the threshold")
	}
	if d := probe(other, ep, 1); d.Outcome.Kind != delivery.Defer {
		t.Fatal("the other instance does not see the open circuit")
	}
	restarted := newGate(t, b.NewStore(t), p, nil)
	if d := probe(restarted, ep, 2); d.Outcome.Kind != delivery.Defer || d.Outcome.Reason != gate.DeferOpen.String() {
		t.Fatal("a new instance does not see the open circuit")
	}
	b.Advance(t, reset)
	pa := probe(a, ep, 1)
	pb := probe(other, ep, 1)
	if pa.GateToken == "" || allowed(pb) {
		t.Fatalf("probe across instances: first %q, second allowed=%v", pa.Outcome.Reason, allowed(pb))
	}
	settle(a, []*delivery.Delivery{pa}, delivered)
	if d := probe(restarted, ep, 2); !allowed(d) {
		t.Fatal("the probe's success on one instance did not close the circuit for another")
	}
}

func testThresholdZero(t *testing.T, b Backend) {
	store := b.NewStore(t)
	rec := &recorder{}
	g := newGate(t, store, gate.Params{Threshold: 0, RetryRPS: 2}, rec)
	ep := endpoint()
	for range 5 {
		settle(g, rows(ep, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), fail503)
	}
	if s := inspect(t, store, ep); s.State != gate.Closed || s.Failures != 0 {
		t.Fatalf("threshold 0: %+v, want closed and nothing counted", s)
	}
	if n := len(rec.trans); n != 0 {
		t.Fatalf("threshold 0 reported transitions: %v", rec.trans)
	}
	// The rate limiter still works without the breaker.
	batch := rows(ep, 2, 2, 2)
	g.Check(ctx(), batch)
	if !allowed(batch[0]) || !allowed(batch[1]) {
		t.Fatal("threshold 0 held rows within the rate limit")
	}
	deferredFor(t, batch[2], gate.DeferRateLimit)
}
