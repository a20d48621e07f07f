package dispatcher

import (
	"math"
	"time"
)

// Trickle pacing. Under light traffic every event costs one NOTIFY, one wake-up and one
// claim; at thousands of events per second and more that is most of the database's work (the
// commit-time lock NOTIFY takes, the listener's transaction per notification, a claim
// statement per one or two rows). Once events come at the pacing rate (Config.PacingRate,
// DefaultPacingRate), the claiming loop stops arming and claims every trickleEvery instead: the
// NOTIFY switch lapses, producers stop notifying, and each claim takes what arrived since the
// last. It goes back to arming when the rate falls below half of that, so that an isolated
// event after idle still arrives on its NOTIFY, at once.
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

// DefaultPacingRate is the rate, in events per second, from which claims are paced. Pacing
// waits half of trickleEvery on average, which below this rate is most of an event's way from
// commit to consumer: at 500 events/s on 2 CPUs, the median from commit to arrival was 0.97 ms
// following NOTIFYs against 1.95 ms paced, for 5% more of the dispatcher's CPU and 11% more of
// PostgreSQL's (`fluxhook bench --workload steady --rate 500,1000`).
const DefaultPacingRate = 2000

// trickleRate estimates the rate of claimed rows as a count decaying with trickleWindow: in
// steady traffic at r rows per second it settles near r·trickleWindow.
type trickleRate struct {
	count  float64
	at     time.Time
	pacing bool
	// enter is the count at which pacing starts (0: trickleEnter), +Inf to never pace.
	enter float64
}

// newTrickleRate returns the estimate for pacing from rate events per second (negative:
// never).
func newTrickleRate(rate int) trickleRate {
	if rate < 0 {
		return trickleRate{enter: math.Inf(1)}
	}
	return trickleRate{enter: float64(rate) * trickleWindow.Seconds()}
}

// trickleEnter is the count at which pacing starts by default: events at DefaultPacingRate.
// Pacing ends at half the count it starts at. One claim adds at most half of it, so that a
// burst (one producer's multi-row insert after idle) is not taken for a rate: pacing starts
// only after several claims in a row found rows. The count is kept at most twice it, so that
// pacing ends within ln(4)·trickleWindow (70 ms, about 35 empty paced claims) of the last event
// however fast they came.
var trickleEnter = float64(DefaultPacingRate) * trickleWindow.Seconds()

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
	enter := t.enter
	if enter == 0 {
		enter = trickleEnter
	}
	if math.IsInf(enter, 1) {
		return false
	}
	if !t.at.IsZero() {
		t.count *= math.Exp(-float64(now.Sub(t.at)) / float64(trickleWindow))
	}
	t.count = min(t.count+min(float64(rows), enter/2), 2*enter)
	t.at = now
	if t.pacing {
		t.pacing = t.count >= enter/2
	} else {
		t.pacing = t.count >= enter
	}
	return t.pacing
}

// reset forgets the estimate: after a busy spell (full claims), whose rate says nothing
// about the trickle that may follow.
func (t *trickleRate) reset() { *t = trickleRate{enter: t.enter} }
