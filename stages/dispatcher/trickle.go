package dispatcher

import (
	"math"
	"time"
)

// Trickle pacing. Under light traffic every event costs one NOTIFY, one wake-up and one
// claim; at a few hundred events per second and more that is most of the database's work
// (the commit-time lock NOTIFY takes, the listener's transaction per notification, a claim
// statement per one or two rows). Once events come often enough that a claim every
// trickleEvery would find one on average, the claiming loop stops arming and claims on that
// clock instead: the NOTIFY switch lapses, producers stop notifying, and each claim takes
// what arrived since the last. It goes back to arming when the rate falls below half of that,
// so that an isolated event after idle still arrives on its NOTIFY, at once.
const (
	// trickleEvery is the interval of paced claims: the most a row waits for its claim while
	// pacing, about half that on average.
	trickleEvery = 2 * time.Millisecond
	// trickleWindow is the time constant of the rate estimate: long enough that a pair of
	// events close together does not start pacing, short enough that pacing ends within a
	// few paced claims once traffic stops.
	trickleWindow = 10 * time.Millisecond
)

// trickleRate estimates the rate of claimed rows as a count decaying with trickleWindow: in
// steady traffic at r rows per second it settles near r·trickleWindow.
type trickleRate struct {
	count  float64
	at     time.Time
	pacing bool
}

// trickleEnter is the count at which pacing starts: a paced claim would find one row on
// average. trickleLeave is half of it. The count is kept at most trickleCap, so that pacing
// ends within ln(trickleCap/trickleLeave)·trickleWindow (14 ms, 7 empty claims) of the last
// event however fast they came, yet a lull of a few milliseconds at any rate above enter
// does not end it (each end costs an arming claim, an announcement and 3 s of NOTIFYs).
var (
	trickleEnter = float64(trickleWindow) / float64(trickleEvery)
	trickleLeave = trickleEnter / 2
	trickleCap   = 2 * trickleEnter
)

// observe counts a claim that started at now and took rows of at most limit, and reports
// whether the next claim should be paced. A claim that took half its limit or more is a
// drain's, not a trickle's (paced claims take a row or a few): it ends pacing, so that a
// drain's tail is followed by arming, not by a run of empty paced claims.
func (t *trickleRate) observe(now time.Time, rows, limit int) bool {
	if 2*rows >= limit {
		t.reset()
		return false
	}
	if !t.at.IsZero() {
		t.count *= math.Exp(-float64(now.Sub(t.at)) / float64(trickleWindow))
	}
	t.count = min(t.count+float64(rows), trickleCap)
	t.at = now
	if t.pacing {
		t.pacing = t.count >= trickleLeave
	} else {
		t.pacing = t.count >= trickleEnter
	}
	return t.pacing
}

// reset forgets the estimate: after a busy spell (full claims) or saturation, whose rates say
// nothing about the trickle that may follow.
func (t *trickleRate) reset() { *t = trickleRate{} }
