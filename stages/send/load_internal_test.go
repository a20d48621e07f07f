package send

import (
	"testing"
	"time"
)

// The saturation rule is pure arithmetic over counts and times, so it is tested with explicit
// clocks; the end-to-end behaviour (a hanging endpoint is claimed around) is tested in
// send_test.go and the dispatcher's tests.
func TestEndpointLoadSaturation(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	const limit = 4
	waiting := func(l *endpointLoad, n int) { l.waiters = make([]chan struct{}, n) }

	l := &endpointLoad{windowStart: t0}
	l.inflight = limit - 1
	waiting(l, 10)
	if l.saturated(t0, limit) {
		t.Fatal("an endpoint with a free slot is saturated")
	}

	// All slots taken, nothing ever finished: a hanging endpoint, saturated at once.
	l.inflight = limit
	waiting(l, 0)
	if !l.saturated(t0, limit) {
		t.Fatal("an endpoint with every slot taken and nothing finishing is not saturated")
	}

	// Fast: 20 requests finished in the last window, 5 waiting: their slots come within
	// milliseconds, so rows for it are still worth claiming.
	for i := range 20 {
		l.finished(t0.Add(time.Duration(i) * time.Millisecond))
	}
	waiting(l, 5)
	if l.saturated(t0.Add(20*time.Millisecond), limit) {
		t.Fatal("a fast endpoint (20 finished per window, 5 waiting) is saturated")
	}
	// The previous window still counts once a new one starts.
	if l.saturated(t0.Add(rateWindow+time.Millisecond), limit) {
		t.Fatal("the previous window's rate was forgotten at the window's turn")
	}
	// More waiting than it finishes in a window: saturated.
	waiting(l, 25)
	if !l.saturated(t0.Add(rateWindow+2*time.Millisecond), limit) {
		t.Fatal("25 waiting for an endpoint that finishes 20 per window is not saturated")
	}
	// It stops finishing (it started to hang): two windows later its rate is forgotten and
	// even one waiting request makes it saturated.
	waiting(l, 1)
	if !l.saturated(t0.Add(3*rateWindow+3*time.Millisecond), limit) {
		t.Fatal("an endpoint that finished nothing for two windows is not saturated")
	}
}
