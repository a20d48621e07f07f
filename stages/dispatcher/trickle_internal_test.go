package dispatcher

import (
	"testing"
	"time"
)

// feed runs claims at the given start offsets with the given rows each and returns the
// verdict after every claim.
func feed(t *trickleRate, start time.Time, at []time.Duration, rows []int) []bool {
	out := make([]bool, len(at))
	for i := range at {
		out[i] = t.observe(start.Add(at[i]), rows[i], 100)
	}
	return out
}

func TestTrickleStartsAtSteadyTrafficOnly(t *testing.T) {
	t.Parallel()
	start := time.Unix(1_700_000_000, 0)
	// 2,000 events/s arriving on NOTIFYs, one claim per millisecond taking 2 rows: pacing
	// starts within the trickle window.
	var tr trickleRate
	var at []time.Duration
	var rows []int
	for i := range 20 {
		at = append(at, time.Duration(i)*time.Millisecond)
		rows = append(rows, 2)
	}
	got := feed(&tr, start, at, rows)
	if !got[len(got)-1] {
		t.Fatalf("2,000 events/s for 20 ms did not start pacing (count %.1f)", tr.count)
	}
	if got[0] {
		t.Fatal("the first claim of two rows started pacing: an isolated event after idle must arrive on its NOTIFY")
	}

	// 100 events/s, one row per claim every 10 ms, with the odd pair 1 ms apart: never.
	tr.reset()
	for i := range 100 {
		base := time.Duration(i) * 10 * time.Millisecond
		if tr.observe(start.Add(base), 1, 100) {
			t.Fatalf("100 events/s started pacing at claim %d (count %.1f)", i, tr.count)
		}
		if i%7 == 0 && tr.observe(start.Add(base+time.Millisecond), 1, 100) {
			t.Fatalf("a pair of events 1 ms apart at 100 events/s started pacing (count %.1f)", tr.count)
		}
	}

	// A burst of 5 events in one claim after idle is not a rate: it starts pacing only if the
	// claims after it keep finding rows.
	tr.reset()
	if tr.observe(start, 3, 100) {
		t.Fatal("one claim of 3 rows started pacing")
	}
}

func TestTrickleEndsSoonAfterTrafficStops(t *testing.T) {
	t.Parallel()
	start := time.Unix(1_700_000_000, 0)
	var tr trickleRate
	now := start
	for range 50 { // 1,500 events/s, paced: 3 rows per 2 ms claim
		tr.observe(now, 3, 100)
		now = now.Add(trickleEvery)
	}
	if !tr.pacing {
		t.Fatalf("1,500 events/s paced at %s did not keep pacing (count %.1f)", trickleEvery, tr.count)
	}
	// Traffic stops: empty paced claims until the estimate falls below the leave threshold.
	empty := 0
	for tr.observe(now, 0, 100) {
		empty++
		now = now.Add(trickleEvery)
		if empty > 100 {
			t.Fatal("pacing never ended after traffic stopped")
		}
	}
	// ln(10/2.5) × 10 ms ≈ 14 ms: about 7 empty claims, then the dispatcher arms again.
	if empty < 3 || empty > 8 {
		t.Errorf("pacing ended after %d empty claims; want about 7 (a lull of a few ms must not end it, a stop must within ~15 ms)", empty)
	}
	// However fast the events came: the count is capped.
	tr.reset()
	now = start
	for range 50 { // 20,000 events/s
		tr.observe(now, 40, 100)
		now = now.Add(trickleEvery)
	}
	empty = 0
	for tr.observe(now, 0, 100) {
		empty++
		now = now.Add(trickleEvery)
	}
	if empty > 8 {
		t.Errorf("after 20,000 events/s pacing ended only after %d empty claims; want at most 8", empty)
	}
	// A drain's claims (half the limit or more) end pacing at once: its tail arms.
	for range 10 {
		tr.observe(now, 5, 100)
		now = now.Add(trickleEvery)
	}
	if tr.observe(now.Add(trickleEvery), 60, 100) || tr.count != 0 {
		t.Errorf("a claim of 60 rows of 100 kept pacing (count %.1f)", tr.count)
	}
	if tr.observe(now.Add(2*trickleEvery), 2, 100) {
		t.Error("a drain's tail claim (2 rows) started pacing")
	}
	// A rate between the thresholds keeps what it has: 400 events/s (below enter, above
	// leave) paced stays paced.
	tr.reset()
	now = start
	for range 50 {
		tr.observe(now, 3, 100)
		now = now.Add(trickleEvery)
	}
	for i := range 200 { // 400 events/s: 4 rows per 10 ms, claims every 2 ms
		rows := 0
		if i%5 == 0 {
			rows = 4
		}
		if !tr.observe(now, rows, 100) {
			t.Fatalf("400 events/s ended pacing at claim %d (count %.2f); the threshold to leave is half the one to enter", i, tr.count)
		}
		now = now.Add(trickleEvery)
	}
}
