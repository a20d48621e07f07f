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
// learns of it (resumeAfterProbe). So while the claims hold an endpoint behind a probe, each
// claim first reads the probe's breaker (recheckProbes, when the gate is a gate.Inspector):
// another instance's probe that closed the circuit releases the endpoint at the next claim,
// one that failed holds it until the reset. A gate that cannot be read bounds such a hold by
// the breaker's reset (Delivery.RecheckIn, from the gate): when it lapses the claims take the
// endpoint's due rows and the gate decides on them with the store's current state. The rows
// deferred behind the probe keep their time in the table, and the closing instance's resume
// makes them due. recheckProbes says why a read rather than Redis pub/sub.
type gatedEndpoints struct {
	mu    sync.Mutex
	all   map[string]time.Time           // endpoint key → until when every row is held
	probe map[string]probeHold           // endpoint key → the breaker whose probe in flight its hold in all is behind
	seq   uint64                         // counts the holds behind a probe noted (probeHold.seq)
	slots map[string]map[int64]time.Time // endpoint key → its retries deferred by the rate limit: row id → slot
}

// probeHold names the breaker (its hash) that holds an endpoint's rows behind its half-open
// probe, and when the hold was noted: a read of the breaker's state taken before then does
// not lift it (the store may have handed out a new probe since).
type probeHold struct {
	hash string
	seq  uint64
}

// slotGrace is how long after its slot a deferred retry that has not come back (another
// instance claimed it) still lifts the hold on its endpoint's retries.
const slotGrace = 5 * time.Second

// note records the deferrals among settled: each endpoint is gated until its soonest deferred
// row comes due (the circuit's reset, the probe's expiry, the window freeing a place), when
// claims take its rows again and the gate decides afresh.
func (g *gatedEndpoints) note(now time.Time, settled []*delivery.Delivery) {
	type hold struct {
		until time.Time
		hash  string // the breaker's, when behind its probe
	}
	var soonest map[string]hold
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
			soonest = make(map[string]hold)
		}
		if prev, ok := soonest[del.Endpoint.Key]; !ok || until.Before(prev.until) {
			h := hold{until: until}
			if o.Reason == gate.DeferProbe.String() {
				h.hash = del.Endpoint.Hash
			}
			soonest[del.Endpoint.Key] = h
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
	for key, h := range soonest {
		g.all[key] = h.until
		if h.hash == "" {
			delete(g.probe, key)
			continue
		}
		if g.probe == nil {
			g.probe = make(map[string]probeHold)
		}
		g.seq++
		g.probe[key] = probeHold{hash: h.hash, seq: g.seq}
	}
}

// behindProbe appends to dst the hashes of the breakers whose half-open probe holds an
// endpoint's rows at now, each once, and returns them with the count of holds noted so far,
// which learn takes back.
func (g *gatedEndpoints) behindProbe(now time.Time, dst []string) ([]string, uint64) {
	dst = dst[:0]
	g.mu.Lock()
	defer g.mu.Unlock()
	for key, h := range g.probe {
		if until, ok := g.all[key]; !ok || !now.Before(until) {
			delete(g.probe, key) // the hold ran out: skip removes it from all
			continue
		}
		if !slices.Contains(dst, h.hash) {
			dst = append(dst, h.hash)
		}
	}
	return dst, g.seq
}

// learn applies a read of the breakers behind whose probes endpoints are held, taken after
// behindProbe returned seq: a probe still in flight keeps the hold; a circuit that closed
// (the probe succeeded, on whichever instance) releases it; one open again (the probe failed)
// holds the endpoint until its reset; a circuit whose probe was given back, or whose reset
// passed, releases it too, so that the next row may probe. Holds noted after the read stay.
func (g *gatedEndpoints) learn(now time.Time, seq uint64, snaps []gate.Snapshot) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, snap := range snaps {
		if snap.ProbeHeld {
			continue
		}
		for key, h := range g.probe {
			if h.hash != snap.Hash || h.seq > seq {
				continue
			}
			delete(g.probe, key)
			if snap.State == gate.Open && snap.OpenFor > 0 {
				g.all[key] = now.Add(snap.OpenFor)
				continue
			}
			delete(g.all, key)
		}
	}
}

// forget drops what is known of the endpoints keys, which share one breaker: it closed, so
// their rows may flow now.
func (g *gatedEndpoints) forget(keys []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, key := range keys {
		delete(g.all, key)
		delete(g.probe, key)
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
		delete(g.probe, key)
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
			delete(g.probe, key)
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
