// Package memstore is the in-process gate.Store: the same breaker and rate-limit semantics as
// the Redis store, for a dispatcher running without REDIS_URL.
//
// Its state lives in one process, so it is shared by every gate in that process but not by
// other instances, and it is lost on restart (a restarted instance starts with every circuit
// closed and empty rate-limit windows). Run one instance, or set REDIS_URL, when that matters.
//
// Each call holds one mutex for the whole batch, which makes every endpoint's decision atomic
// exactly as a Redis script is. The clock is injectable so that tests can move time without
// waiting; the expiries that Redis applies to keys (probe timeout, state TTL, window, slot, promise) are
// applied here when an endpoint is next touched, and by a periodic sweep that keeps memory
// bounded by the endpoints with recent activity.
package memstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/fluxora/fluxhook/stages/gate"
)

// Options configures a Store.
type Options struct {
	// Now is the store's clock (nil = time.Now). Tests inject a fake clock to move time.
	Now func() time.Time
}

// Store is the in-process gate.Store. The zero value is not usable; call New.
type Store struct {
	now func() time.Time

	mu    sync.Mutex
	eps   map[string]*endpoint
	calls int
}

var _ gate.Store = (*Store)(nil)

// endpoint is one endpoint's state; the zero value is a closed breaker with an empty window.
type endpoint struct {
	state        gate.State // "" = closed
	failures     int
	openUntil    time.Time
	openSince    time.Time // when the current spell opened (zero while closed); kept across failed probes
	failedProbes int       // probes failed since openSince
	stateExpires time.Time // when the breaker state is forgotten (a Redis key's TTL)
	probe        string    // owner token of the half-open probe, "" = none
	probeExpires time.Time
	window       []time.Time // the newest attempts in the rate-limit window (at most the limit), oldest first
	retries      []time.Time // the newest retries admitted in the window (at most the limit), oldest first
	slot         time.Time   // the latest slot handed to a deferred retry (zero = none)
	slotExpires  time.Time   // when slot is forgotten (a Redis key's TTL)
	front        time.Time   // the latest place promised to a returning retry (zero = none)
	promises     int         // how many places at front were promised (several attempts may leave at once)
	frontExpires time.Time   // when front is forgotten (a Redis key's TTL)
}

// sweepEvery is how many calls pass between sweeps of idle endpoints.
const sweepEvery = 1024

// New returns an empty store.
func New(opts Options) *Store {
	s := &Store{now: opts.Now, eps: map[string]*endpoint{}}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// Decide implements gate.Store: one lock for the whole batch, so each endpoint's decision is
// atomic against every other gate in the process.
func (s *Store) Decide(_ context.Context, p gate.Params, checks []gate.EndpointCheck) ([]gate.EndpointDecision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.maybeSweep(now, p)
	out := make([]gate.EndpointDecision, len(checks))
	for i, c := range checks {
		out[i] = s.decide(now, p.For(c), c)
	}
	return out, nil
}

// Record implements gate.Store under the same lock as Decide.
func (s *Store) Record(_ context.Context, p gate.Params, results []gate.EndpointResult) ([]gate.Transition, error) {
	if !p.Breaker() {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.maybeSweep(now, p)
	var trans []gate.Transition
	for _, r := range results {
		trans = s.record(now, p, r, trans)
	}
	return trans, nil
}

// Inspect implements gate.Store, for status output and tests.
func (s *Store) Inspect(_ context.Context, hashes []string) ([]gate.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	out := make([]gate.Snapshot, len(hashes))
	for i, h := range hashes {
		snap := gate.Snapshot{Hash: h, State: gate.Closed, At: now}
		if e := s.eps[h]; e != nil {
			e.expire(now)
			if e.state != "" {
				snap.State = e.state
			}
			snap.Failures = e.failures
			if e.state == gate.Open && now.Before(e.openUntil) {
				snap.OpenFor = e.openUntil.Sub(now)
			}
			snap.ProbeHeld = e.probe != ""
			if e.state == gate.Open || e.state == gate.HalfOpen {
				snap.OpenSince, snap.FailedProbes = e.openSince, e.failedProbes
			}
		}
		out[i] = snap
	}
	return out, nil
}

// expire applies the expiries Redis applies to keys.
func (e *endpoint) expire(now time.Time) {
	if e.state != "" || e.failures != 0 {
		if !now.Before(e.stateExpires) {
			e.state, e.failures, e.openUntil = "", 0, time.Time{}
			e.openSince, e.failedProbes = time.Time{}, 0
		}
	}
	if e.probe != "" && !now.Before(e.probeExpires) {
		e.probe = ""
	}
	if !e.slot.IsZero() && !now.Before(e.slotExpires) {
		e.slot, e.slotExpires = time.Time{}, time.Time{}
	}
	if !e.front.IsZero() && !now.Before(e.frontExpires) {
		e.front, e.promises, e.frontExpires = time.Time{}, 0, time.Time{}
	}
}

// prune drops the attempts and retries that have left the window (at or before now-window).
func (e *endpoint) prune(now time.Time, window time.Duration) {
	e.window = pruneTimes(e.window, now.Add(-window))
	e.retries = pruneTimes(e.retries, now.Add(-window))
}

func pruneTimes(ts []time.Time, cut time.Time) []time.Time {
	n := 0
	for n < len(ts) && !ts[n].After(cut) {
		n++
	}
	if n > 0 {
		ts = append(ts[:0], ts[n:]...)
	}
	return ts
}

// insert adds t to the sorted ts (kept sorted even if the clock stepped back) and keeps only
// the newest limit entries: only those decide anything (is the window full, when does the
// entry that must leave leave), as in the Redis script.
func insert(ts []time.Time, t time.Time, limit int) []time.Time {
	i := len(ts)
	for i > 0 && ts[i-1].After(t) {
		i--
	}
	ts = append(ts, time.Time{})
	copy(ts[i+1:], ts[i:])
	ts[i] = t
	if n := len(ts); n > limit {
		ts = append(ts[:0], ts[n-limit:]...)
	}
	return ts
}

func (e *endpoint) idle() bool {
	return e.state == "" && e.failures == 0 && e.probe == "" && len(e.window) == 0 &&
		len(e.retries) == 0 && e.slot.IsZero() && e.front.IsZero()
}

func (s *Store) get(hash string, now time.Time) *endpoint {
	e := s.eps[hash]
	if e == nil {
		e = &endpoint{}
		s.eps[hash] = e
	}
	e.expire(now)
	return e
}

// maybeSweep forgets idle endpoints now and then, so that memory follows the endpoints with
// recent trouble or traffic rather than every endpoint ever seen.
func (s *Store) maybeSweep(now time.Time, p gate.Params) {
	s.calls++
	if s.calls%sweepEvery != 0 {
		return
	}
	for h, e := range s.eps {
		e.expire(now)
		e.prune(now, p.Window)
		if e.idle() {
			delete(s.eps, h)
		}
	}
}

// limiter is the rate-limit part of one endpoint's decision.
type limiter struct {
	e       *endpoint
	now     time.Time
	p       gate.Params
	reserve int
	pruned  bool
	refused bool
	from    time.Time     // the earliest slot for this check's refused retries: when the window frees a place
	spacing time.Duration // between consecutive slots
}

// admit counts an attempt, or refuses a retry over the limit and beyond the reserve, handing
// it the endpoint's next slot and returning the delay until it: slot = max(last slot +
// spacing, when the window frees a place), spacing = window / max(reserve, retries admitted in
// the window). A returning retry (gate.EndpointCheck.Returning) refused again is promised a
// place instead (see place), ahead of the queue, which it extends only when the queue ends
// before it. While a promised place is held (until a spacing after the last promise), a retry
// that is not returning is queued at the end even when the window has room: the place is the
// promised retry's. See the gate package documentation.
func (l *limiter) admit(retry, returning bool) (time.Duration, bool) {
	if !l.p.Limiter() {
		return 0, false
	}
	if !l.pruned {
		l.e.prune(l.now, l.p.Window)
		l.reserve = l.p.RetryReserve()
		l.pruned = true
	}
	limit := l.p.RetryRPS
	count, retries := len(l.e.window), len(l.e.retries)
	full := count >= limit && retries >= l.reserve
	if retry && !full && !returning && !l.e.front.IsZero() {
		// The retries admitted now, with the places the window has free: the rate at which
		// the window takes retries, as the spacing below when it is full.
		spacing := l.p.Window / time.Duration(min(limit, max(l.reserve, retries+limit-count)))
		if l.now.Before(l.e.front.Add(spacing)) {
			slot := later(l.now, l.e.slot.Add(spacing))
			l.e.slot, l.e.slotExpires = slot, slot.Add(l.p.Window+time.Second)
			return slot.Sub(l.now), true
		}
	}
	if retry && full {
		if !l.refused {
			// The window frees a place for a retry when the attempt whose departure takes
			// it below the limit leaves, or the retry whose departure takes the retries
			// below the reserve, whichever comes first.
			l.from = l.e.window[count-limit].Add(l.p.Window)
			if r := l.e.retries[retries-l.reserve].Add(l.p.Window); r.Before(l.from) {
				l.from = r
			}
			l.spacing = l.p.Window / time.Duration(min(limit, max(l.reserve, retries)))
			l.refused = true
		}
		if returning {
			at := l.place()
			if at.Equal(l.e.front) {
				l.e.promises++
			} else {
				l.e.front, l.e.promises = at, 1
			}
			l.e.frontExpires = at.Add(l.p.Window + time.Second)
			if at.After(l.e.slot) {
				l.e.slot, l.e.slotExpires = at, at.Add(l.p.Window+time.Second)
			}
			return at.Sub(l.now), true
		}
		slot := l.from
		if !l.e.slot.IsZero() {
			slot = later(slot, l.e.slot.Add(l.spacing))
		}
		l.e.slot, l.e.slotExpires = slot, slot.Add(l.p.Window+time.Second)
		return slot.Sub(l.now), true
	}
	l.e.window = insert(l.e.window, l.now, limit)
	if retry {
		l.e.retries = insert(l.e.retries, l.now, limit)
	}
	return 0, false
}

// place returns the place promised to a returning retry refused now: the first departure
// from the window that frees a place for a retry, no earlier than from, and not promised yet
// (after the last place promised, or at it when fewer retries were promised that place than
// leave then); when every such departure is promised, one spacing after the last promise.
// The departures are those of the window's attempts from the one whose departure takes it
// below the limit, and of its retries from the one that takes them below the reserve; a retry
// among both counts in both. Each returning retry gets a place of its own: promised the same
// one, they would come back together, one would take it, and the others would be refused
// again, as many times as they were.
//
// A retry counted twice is promised to two returning retries when it frees a place under both
// rules: one is admitted, the other refused and promised the next place, one more deferral.
// Counted once, the second place went to a prediction (a spacing after the last promise),
// which comes early more often than not, places freeing a claim's lag after their slots:
// retries ran at 83% of their share beside first attempts instead of 97% (gatetest's
// RateLimitLateReturnsKeepTheRate).
func (l *limiter) place() time.Time {
	deps := make([]time.Time, 0, l.p.RetryRPS+l.reserve)
	for _, t := range l.e.window[len(l.e.window)-l.p.RetryRPS:] {
		deps = append(deps, t.Add(l.p.Window))
	}
	for _, t := range l.e.retries[len(l.e.retries)-l.reserve:] {
		deps = append(deps, t.Add(l.p.Window))
	}
	slices.SortFunc(deps, func(a, b time.Time) int { return a.Compare(b) })
	last, promised := l.e.front, l.e.promises
	for _, f := range deps {
		if f.Before(l.from) || !last.IsZero() && f.Before(last) {
			continue
		}
		if f.Equal(last) && promised > 0 {
			promised--
			continue
		}
		return f
	}
	if last.IsZero() {
		return l.from
	}
	return later(l.from, last.Add(l.spacing))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (s *Store) decide(now time.Time, p gate.Params, c gate.EndpointCheck) gate.EndpointDecision {
	e := s.get(c.Hash, now)
	rows := make([]gate.RowDecision, len(c.Retry))
	dec := gate.EndpointDecision{Rows: rows}
	lim := limiter{e: e, now: now, p: p}
	state := gate.Closed
	if p.Breaker() && e.state != "" {
		state = e.state
	}
	switch {
	case state == gate.Open && now.Before(e.openUntil):
		wait := e.openUntil.Sub(now)
		for i := range rows {
			rows[i] = gate.RowDecision{Verdict: gate.DeferOpen, Delay: wait}
		}
	case state == gate.Open || state == gate.HalfOpen:
		for i, retry := range c.Retry {
			returning := i < len(c.Returning) && c.Returning[i]
			if e.probe != "" {
				// Until the probe expires: its success closes the circuit sooner, and the
				// caller learns that from Hooks.OnClosed.
				rows[i] = gate.RowDecision{Verdict: gate.DeferProbe, Delay: max(e.probeExpires.Sub(now), time.Millisecond)}
				continue
			}
			if d, refused := lim.admit(retry, returning); refused {
				// The rate limiter refuses the would-be probe: it is never taken, so
				// nothing is left to wedge the breaker; a later row may probe.
				rows[i] = gate.RowDecision{Verdict: gate.DeferRateLimit, Delay: d}
				continue
			}
			e.probe, e.probeExpires = c.Token, now.Add(p.ProbeTimeout)
			if e.state == gate.Open {
				e.state = gate.HalfOpen
				e.stateExpires = now.Add(gate.StateTTL)
				dec.Transitions = append(dec.Transitions, gate.Transition{Hash: c.Hash, From: gate.Open, To: gate.HalfOpen})
			}
			rows[i] = gate.RowDecision{Verdict: gate.Probe}
		}
	default:
		for i, retry := range c.Retry {
			if d, refused := lim.admit(retry, i < len(c.Returning) && c.Returning[i]); refused {
				rows[i] = gate.RowDecision{Verdict: gate.DeferRateLimit, Delay: d}
			}
		}
	}
	return dec
}

func (s *Store) record(now time.Time, p gate.Params, r gate.EndpointResult, trans []gate.Transition) []gate.Transition {
	e := s.get(r.Hash, now)
	state := e.state
	if state == "" {
		state = gate.Closed
	}
	changed := false
	move := func(to gate.State) {
		if state != to {
			trans = append(trans, gate.Transition{Hash: r.Hash, From: state, To: to})
			state = to
		}
	}
	for _, row := range r.Rows {
		owner := row.Token != "" && row.Token == e.probe
		if owner {
			e.probe = "" // given back whatever the result
		}
		switch {
		case owner && state != gate.Closed:
			switch row.Result {
			case gate.Success:
				move(gate.Closed)
				e.failures, changed = 0, true
				// The spell is over: the next opening starts a new one.
				e.openSince, e.failedProbes = time.Time{}, 0
			case gate.Failure:
				// Open again for another reset time, but in the same spell: openSince
				// stays, so that status shows how long the endpoint has been down rather
				// than how long since its last probe.
				move(gate.Open)
				e.openUntil, e.failures, changed = now.Add(p.Reset), 0, true
				e.failedProbes++
			}
		case state == gate.Closed:
			switch row.Result {
			case gate.Success:
				if e.failures > 0 {
					e.failures, changed = 0, true
				}
			case gate.Failure:
				e.failures++
				changed = true
				if e.failures >= p.Threshold {
					move(gate.Open)
					e.openUntil, e.failures = now.Add(p.Reset), 0
					e.openSince, e.failedProbes = now, 0 // a new spell
				}
			}
		default:
			// A straggler: an attempt admitted before the circuit opened (or while the
			// store was unreachable) whose result arrives while it is open or half-open.
			// It changes nothing; only the probe decides (see the gate package docs).
		}
	}
	if changed {
		if state == gate.Closed {
			e.state = ""
		} else {
			e.state = state
		}
		switch {
		case state == gate.Closed && e.failures == 0:
			e.stateExpires = time.Time{}
		case state == gate.Open:
			e.stateExpires = e.openUntil.Add(gate.StateTTL)
		default:
			e.stateExpires = now.Add(gate.StateTTL)
		}
	}
	return trans
}
