package dispatcher

import (
	"math/rand/v2"
	"testing"
	"time"
)

const testBatch = 100

func TestTrickleStartsAtSteadyTrafficOnly(t *testing.T) {
	t.Parallel()
	start := time.Unix(1_700_000_000, 0)
	// 4,000 events/s, twice the default pacing rate, arriving on NOTIFYs, one claim per
	// millisecond taking 4 rows: pacing starts within the trickle window, not at the first
	// claim.
	var tr trickleRate
	var first, last bool
	for i := range 50 {
		p := tr.observe(start.Add(time.Duration(i)*time.Millisecond), 4, testBatch)
		if i == 0 {
			first = p
		}
		last = p
	}
	if first {
		t.Fatal("the first claim of two rows started pacing: an isolated event after idle must arrive on its NOTIFY")
	}
	if !last {
		t.Fatalf("4,000 events/s for 50 ms did not start pacing (count %.1f)", tr.count)
	}

	// 100 events/s, one row per claim every 10 ms, with the odd pair 1 ms apart: never.
	tr.reset()
	for i := range 200 {
		base := time.Duration(i) * 10 * time.Millisecond
		if tr.observe(start.Add(base), 1, testBatch) {
			t.Fatalf("100 events/s started pacing at claim %d (count %.1f)", i, tr.count)
		}
		if i%7 == 0 && tr.observe(start.Add(base+time.Millisecond), 1, testBatch) {
			t.Fatalf("a pair of events 1 ms apart at 100 events/s started pacing (count %.1f)", tr.count)
		}
	}

	// A burst after idle is not a rate: one claim of 5 or of 49 rows (one producer's
	// multi-row insert) does not start pacing, nor does a second one right after it.
	for _, rows := range []int{5, 12, 49} {
		tr.reset()
		if tr.observe(start, rows, testBatch) || tr.observe(start.Add(time.Millisecond), rows, testBatch) {
			t.Errorf("two claims of %d rows after idle started pacing (count %.1f)", rows, tr.count)
		}
	}
}

func TestTrickleEndsSoonAfterTrafficStops(t *testing.T) {
	t.Parallel()
	// At a pacing rate of 500 events/s (Config.PacingRate): the figures below scale with it.
	start := time.Unix(1_700_000_000, 0)
	emptyUntilArmed := func(tr *trickleRate, now time.Time) int {
		empty := 0
		for tr.observe(now, 0, testBatch) {
			empty++
			now = now.Add(trickleEvery)
			if empty > 1000 {
				t.Fatal("pacing never ended after traffic stopped")
			}
		}
		return empty
	}
	// 1,500 and 20,000 events/s, paced: 3 and 40 rows per claim. However fast the events came
	// (the count is capped), pacing ends ln(cap/leave)·window ≈ 70 ms after the last: 35
	// empty claims, then the dispatcher arms again.
	for _, rows := range []int{3, 40} {
		tr := newTrickleRate(500)
		now := start
		for range 100 {
			tr.observe(now, rows, testBatch)
			now = now.Add(trickleEvery)
		}
		if !tr.pacing {
			t.Fatalf("%d rows per paced claim did not keep pacing (count %.1f)", rows, tr.count)
		}
		if empty := emptyUntilArmed(&tr, now); empty < 33 || empty > 36 {
			t.Errorf("after %d rows per paced claim, pacing ended after %d empty claims; want about 35", rows, empty)
		}
	}

	// Outside pacing, a drain's claims (half a batch or more) keep it from starting: a
	// drain's tail arms.
	tr := newTrickleRate(500)
	now := start
	for range 20 {
		if tr.observe(now, 84, testBatch) {
			t.Fatalf("claims of 84 rows of 100 (an ordered drain's) started pacing (count %.1f)", tr.count)
		}
		now = now.Add(trickleEvery)
	}
	if tr.observe(now, 2, testBatch) {
		t.Error("a drain's tail claim (2 rows) started pacing")
	}
	// While pacing, such a claim is a pause's backlog: 60 rows after 60 ms without a claim
	// at 1,000 events/s keep pacing.
	tr.reset()
	now = start
	for range 50 {
		tr.observe(now, 2, testBatch)
		now = now.Add(trickleEvery)
	}
	if !tr.observe(now.Add(60*time.Millisecond), 60, testBatch) {
		t.Errorf("a pause's backlog (60 rows after 60 ms) ended pacing (count %.1f)", tr.count)
	}

	// Between the thresholds it keeps what it has: 400 events/s (below enter, above leave)
	// in bursts of 4 every 10 ms stays paced.
	tr.reset()
	now = start
	for range 100 {
		tr.observe(now, 3, testBatch)
		now = now.Add(trickleEvery)
	}
	for i := range 500 {
		rows := 0
		if i%5 == 0 {
			rows = 4
		}
		if !tr.observe(now, rows, testBatch) {
			t.Fatalf("400 events/s ended pacing at claim %d (count %.2f); the threshold to leave is half the one to enter", i, tr.count)
		}
		now = now.Add(trickleEvery)
	}
}

// TestTricklePoissonArrivalsDoNotFlap: random arrivals at twice the rate to enter do not end
// pacing in a minute (each end costs an announcement and 3 s of NOTIFYs), and at a third of it
// pacing does not start.
func TestTricklePoissonArrivalsDoNotFlap(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Unix(1_700_000_000, 0)
	run := func(rate float64, claims int) (ends, starts int) {
		var tr trickleRate
		now := start
		next := now.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		was := false
		for range claims {
			now = now.Add(trickleEvery)
			rows := 0
			for !next.After(now) {
				rows++
				next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
			}
			p := tr.observe(now, rows, testBatch)
			switch {
			case was && !p:
				ends++
			case !was && p:
				starts++
			}
			was = p
		}
		return ends, starts
	}
	enter := trickleEnter / trickleWindow.Seconds() // events/s
	if ends, starts := run(2*enter, 30_000); ends != 0 || starts != 1 {
		t.Errorf("Poisson arrivals at %.0f/s for 60 s: pacing started %d times and ended %d; want once and never", 2*enter, starts, ends)
	}
	if _, starts := run(enter/3, 30_000); starts != 0 {
		t.Errorf("Poisson arrivals at %.0f/s for 60 s started pacing %d times; want never", enter/3, starts)
	}
}
