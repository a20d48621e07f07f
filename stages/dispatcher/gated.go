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
type gatedEndpoints struct {
	mu      sync.Mutex
	all     map[string]time.Time // endpoint key → until when every row is held
	retries map[string]time.Time // endpoint key → until when retries are held
}

// note records the deferrals among settled: each endpoint is gated until its soonest deferred
// row comes due (the circuit's reset, the probe's expiry, the window freeing a place), when
// claims take its rows again and the gate decides afresh.
func (g *gatedEndpoints) note(now time.Time, settled []*delivery.Delivery) {
	type entry struct {
		retriesOnly bool
		key         string
	}
	var soonest map[entry]time.Time
	for _, del := range settled {
		o := del.Outcome
		if o.Kind != delivery.Defer || o.Stale || o.Unsettled || del.Endpoint == nil || o.Delay <= 0 {
			continue
		}
		e := entry{o.Reason == gate.DeferRateLimit.String(), del.Endpoint.Key}
		until := now.Add(o.Delay)
		if soonest == nil {
			soonest = make(map[entry]time.Time)
		}
		if prev, ok := soonest[e]; !ok || until.Before(prev) {
			soonest[e] = until
		}
	}
	if soonest == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.all == nil {
		g.all, g.retries = make(map[string]time.Time), make(map[string]time.Time)
	}
	// The gate's latest verdict is the truth (a circuit that re-opened, a window that
	// moved): it replaces what was known.
	for e, until := range soonest {
		if e.retriesOnly {
			g.retries[e.key] = until
		} else {
			g.all[e.key] = until
		}
	}
}

// forget drops what is known of endpoint key: its breaker closed, so its rows may flow now.
func (g *gatedEndpoints) forget(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.all, key)
	delete(g.retries, key)
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
	for key, until := range g.retries {
		if !now.Before(until) {
			delete(g.retries, key)
			continue
		}
		if first.IsZero() || until.Before(first) {
			first = until
		}
		dst.Retries = append(dst.Retries, key)
	}
	return dst, first
}
