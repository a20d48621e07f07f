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
//
// The estimate is each instance's own: with several instances sharing the traffic each paces
// once its share reaches the rate, and an instance that stays armed keeps the switch set for
// all producers (they then notify, and the armed one claims on each NOTIFY, as before).
const (
	// trickleEvery is the interval of paced claims: the most a row waits for its claim while
	// pacing, about half that on average.
	trickleEvery = 2 * time.Millisecond
	// trickleWindow is the time constant of the rate estimate. Each end of pacing costs an
	// arming claim, an announcement, a confirming claim and up to 3 s of NOTIFYs (the
	// switch's lifetime), so the estimate must not fall below the threshold to leave on the
	// gaps of random arrivals at the rate to enter, nor on a pause of the producers or the
	// machine of tens of milliseconds (a loaded machine ended pacing every second or so at
	// 25 ms). At 50 ms pacing ends about 70 ms after the last event: 35 empty claims, a few
	// milliseconds of the database's time.
	trickleWindow = 50 * time.Millisecond
)

// trickleRate estimates the rate of claimed rows as a count decaying with trickleWindow: in
// steady traffic at r rows per second it settles near r·trickleWindow.
type trickleRate struct {
	count  float64
	at     time.Time
	pacing bool
}

// trickleEnter is the count at which pacing starts: a paced claim would find one row on
// average. trickleLeave is half of it. One claim adds at most trickleStep, so that a burst
// (one producer's multi-row insert after idle) is not taken for a rate: pacing starts only
// after several claims in a row found rows. The count is kept at most trickleCap, so that
// pacing ends within ln(trickleCap/trickleLeave)·trickleWindow (70 ms, about 35 empty paced
// claims) of the last event however fast they came.
var (
	trickleEnter = float64(trickleWindow) / float64(trickleEvery)
	trickleLeave = trickleEnter / 2
	trickleStep  = trickleEnter / 2
	trickleCap   = 2 * trickleEnter
)

// observe counts a claim that started at now and took rows, batch being the claim's
// configured size, and reports whether the next claim should be paced. Outside pacing, a
// claim that took half a batch or more is a drain's, not a trickle's: it keeps pacing from
// starting, so that a drain's tail is followed by arming, not by a run of empty paced claims.
// While pacing, such a claim is the backlog of a pause (the machine's, the database's) and
// counts like any other.
func (t *trickleRate) observe(now time.Time, rows, batch int) bool {
	if !t.pacing && 2*rows >= batch {
		t.reset()
		return false
	}
	if !t.at.IsZero() {
		t.count *= math.Exp(-float64(now.Sub(t.at)) / float64(trickleWindow))
	}
	t.count = min(t.count+min(float64(rows), trickleStep), trickleCap)
	t.at = now
	if t.pacing {
		t.pacing = t.count >= trickleLeave
	} else {
		t.pacing = t.count >= trickleEnter
	}
	return t.pacing
}

// reset forgets the estimate: after a busy spell (full claims), whose rate says nothing
// about the trickle that may follow.
func (t *trickleRate) reset() { *t = trickleRate{} }
