package dispatcher

import (
	"slices"
	"sync"
	"time"

	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
)

// gatedEndpoints remembers the endpoints the gate held rows back for, and until when, so that
// claims leave their rows in the table instead of claiming them only to defer them again: an
// open circuit or a probe in flight holds every row, the retry rate limit only retries. Settle
// fills it from the deferrals it writes (the gate's verdicts with their delays); the claiming
// loop reads it before every claim. It is per instance: another instance learns the same from
// its own first deferral, one row write per gated endpoint and spell.
//
// Rate-limit deferrals are not verdicts on the endpoint but a slot each, handed out one after
// another (see the gate package): each deferred retry comes due at its own slot. So retries
// are held only while none of the endpoint's deferred retries is due, until the earliest
// slot; once one is due, the claims take the endpoint's due retries until that row has come
// back. Holding them until the soonest slot of the latest batch (a later batch's slots lie
// after every earlier one's) kept the retries whose slots had come out of the claims until
// they came back together and were mostly deferred again: retries ran at a twentieth of the
// endpoint's rate.
//
// A hold behind a half-open probe lasts until the probe's expiry (the request timeout and
// more), which only the probe's end cuts short, and only the instance that records the end
// learns of it (resumeAfterProbe): another instance sharing the Redis gate would keep
// skipping an endpoint that had recovered. So such a hold lasts the breaker's reset at most
// (Delivery.RecheckIn, from the gate): when it lapses the claims take the endpoint's due rows
// and the gate decides on them with the store's current state, which is the re-check. That
// costs nothing per event and no Redis call of its own: at most one claim and one deferral
// of the rows that came meanwhile per reset and endpoint, while a probe hangs. The rows
// deferred behind the probe keep their time in the table, and the closing instance's resume
// makes them due. A Redis pub/sub channel would tell the other instances sooner, but it
// needs a subscriber connection and its lifecycle on every instance, and it loses messages
// (a dropped subscription, a restart) so that a bound like this one would still be needed;
// the reset is already the delay the breaker accepts before it tries an endpoint again.
type gatedEndpoints struct {
	mu    sync.Mutex
	all   map[string]time.Time           // endpoint key → until when every row is held
	slots map[string]map[int64]time.Time // endpoint key → its retries deferred by the rate limit: row id → slot
}

// slotGrace is how long after its slot a deferred retry that has not come back (another
// instance claimed it) still lifts the hold on its endpoint's retries.
const slotGrace = 5 * time.Second

// note records the deferrals among settled: each endpoint is gated until its soonest deferred
// row comes due (the circuit's reset, the probe's expiry, the window freeing a place), when
// claims take its rows again and the gate decides afresh.
func (g *gatedEndpoints) note(now time.Time, settled []*delivery.Delivery) {
	var soonest map[string]time.Time
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, del := range settled {
		if del.Endpoint == nil {
			continue
		}
		if rows := g.slots[del.Endpoint.Key]; rows != nil {
			delete(rows, del.ID) // it came back
		}
		o := del.Outcome
		if o.Kind != delivery.Defer || o.Stale || o.Unsettled || o.Delay <= 0 {
			continue
		}
		until := now.Add(o.Delay)
		if del.RecheckIn > 0 && del.RecheckIn < o.Delay {
			until = now.Add(del.RecheckIn) // behind another attempt's probe: see gatedEndpoints
		}
		if o.Reason == gate.DeferRateLimit.String() {
			if g.slots == nil {
				g.slots = make(map[string]map[int64]time.Time)
			}
			rows := g.slots[del.Endpoint.Key]
			if rows == nil {
				rows = make(map[int64]time.Time)
				g.slots[del.Endpoint.Key] = rows
			}
			rows[del.ID] = until
			continue
		}
		if soonest == nil {
			soonest = make(map[string]time.Time)
		}
		if prev, ok := soonest[del.Endpoint.Key]; !ok || until.Before(prev) {
			soonest[del.Endpoint.Key] = until
		}
	}
	if soonest == nil {
		return
	}
	if g.all == nil {
		g.all = make(map[string]time.Time)
	}
	// The gate's latest verdict on the breaker is the truth (a circuit that re-opened): it
	// replaces what was known.
	for key, until := range soonest {
		g.all[key] = until
	}
}

// forget drops what is known of the endpoints keys, which share one breaker: it closed, so
// their rows may flow now.
func (g *gatedEndpoints) forget(keys []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, key := range keys {
		delete(g.all, key)
		delete(g.slots, key)
	}
}

// retime holds every row of the endpoints keys, which share one breaker, until until, or
// releases them when until is not after now: a probe ended without closing the circuit, and
// the next probe may go then. What was known came from deferrals behind that probe (until its
// expiry), which no longer say when the endpoint may be tried; the rate limit's slots stay.
func (g *gatedEndpoints) retime(now, until time.Time, keys []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, key := range keys {
		if !until.After(now) {
			delete(g.all, key)
			continue
		}
		if g.all == nil {
			g.all = make(map[string]time.Time)
		}
		g.all[key] = until
	}
}

// skip returns the claim's skip lists at now: the saturated endpoints plus every endpoint
// still gated, reusing dst's slices, and when the first gated entry runs out (zero: none).
// Entries that ran out are removed. The caller must look again by then: the rows the claim
// skips are due, and no timer of the claim's own covers them.
func (g *gatedEndpoints) skip(now time.Time, saturated []string, dst claim.Skip) (claim.Skip, time.Time) {
	dst.Endpoints = append(dst.Endpoints[:0], saturated...)
	dst.Retries = dst.Retries[:0]
	var first time.Time
	g.mu.Lock()
	defer g.mu.Unlock()
	for key, until := range g.all {
		if !now.Before(until) {
			delete(g.all, key)
			continue
		}
		if first.IsZero() || until.Before(first) {
			first = until
		}
		if !slices.Contains(dst.Endpoints, key) {
			dst.Endpoints = append(dst.Endpoints, key)
		}
	}
	for key, rows := range g.slots {
		var earliest time.Time
		due := false
		for id, slot := range rows {
			switch {
			case now.After(slot.Add(slotGrace)):
				delete(rows, id) // claimed elsewhere, or gone
			case !now.Before(slot):
				due = true
			case earliest.IsZero() || slot.Before(earliest):
				earliest = slot
			}
		}
		if len(rows) == 0 {
			delete(g.slots, key)
			continue
		}
		if due || earliest.IsZero() {
			continue // a deferred retry is due: the claims take the endpoint's retries
		}
		if first.IsZero() || earliest.Before(first) {
			first = earliest
		}
		dst.Retries = append(dst.Retries, key)
	}
	return dst, first
}
