package gate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/stages/delivery"
)

// Params configures a BreakerGate. The zero value of each field means its default (see
// WithDefaults), except Threshold, whose zero disables the breaker as
// WEBHOOK_CIRCUIT_BREAKER_THRESHOLD=0 does.
type Params struct {
	// Threshold is the number of consecutive retryable failures that opens an endpoint's
	// circuit (WEBHOOK_CIRCUIT_BREAKER_THRESHOLD); 0 disables the breaker.
	Threshold int
	// Reset is how long an open circuit stays open before one probe may try the endpoint
	// (WEBHOOK_CIRCUIT_BREAKER_RESET_MS, default 5 minutes).
	Reset time.Duration
	// RetryRPS is how many attempts per Window an endpoint may receive before retries are
	// deferred, beyond the share reserved for them (WEBHOOK_RETRY_RPS, default 10); negative
	// disables the rate limiter.
	RetryRPS int
	// RetryShare is the share of RetryRPS reserved for retries (WEBHOOK_RETRY_SHARE, default
	// 0.5, at most 1): a retry is admitted while the window holds fewer than RetryRPS attempts,
	// or while fewer than RetryReserve retries were admitted in it, so that first attempts at
	// any rate cannot starve retries. See RetryReserve.
	RetryShare float64
	// Window is the rate limiter's sliding window (default 1 s, as the original dispatcher has it;
	// settable for tests).
	Window time.Duration
	// ProbeTimeout is how long a half-open probe may stay unanswered before another attempt
	// may probe (default 30 s): the request timeout plus the time to settle, so that a
	// prober that crashed cannot wedge the breaker.
	ProbeTimeout time.Duration
	// StoreTimeout bounds each store call (default 500 ms): the gate sits in the pipeline's
	// path, and a slow store must cost a batch a bounded wait before it fails open.
	StoreTimeout time.Duration
	// StoreRetry is how long the gate fails open without calling the store after a store
	// error (default 1 s), so that an outage costs one timeout per StoreRetry rather than one
	// per batch; after it, the next batch tries the store again.
	StoreRetry time.Duration
}

// WithDefaults returns a copy of p with every zero field set to its default.
func (p Params) WithDefaults() Params {
	if p.Reset == 0 {
		p.Reset = 5 * time.Minute
	}
	if p.RetryRPS == 0 {
		p.RetryRPS = 10
	}
	if p.RetryShare == 0 {
		p.RetryShare = DefaultRetryShare
	}
	if p.Window == 0 {
		p.Window = time.Second
	}
	if p.ProbeTimeout == 0 {
		p.ProbeTimeout = 30 * time.Second
	}
	if p.StoreTimeout == 0 {
		p.StoreTimeout = 500 * time.Millisecond
	}
	if p.StoreRetry == 0 {
		p.StoreRetry = time.Second
	}
	return p
}

// Validate reports the invalid fields, naming their environment variables.
func (p Params) Validate() error {
	var errs []error
	if p.Threshold < 0 {
		errs = append(errs, fmt.Errorf("WEBHOOK_CIRCUIT_BREAKER_THRESHOLD: must be 0 (off) or more, got %d", p.Threshold))
	}
	if p.Reset < time.Millisecond {
		errs = append(errs, fmt.Errorf("WEBHOOK_CIRCUIT_BREAKER_RESET_MS: must be at least 1 ms, got %s", p.Reset))
	}
	if !(p.RetryShare > 0 && p.RetryShare <= 1) { // also refuses NaN
		errs = append(errs, fmt.Errorf("WEBHOOK_RETRY_SHARE: must be more than 0 and at most 1, got %v", p.RetryShare))
	}
	if p.Window < time.Millisecond {
		errs = append(errs, fmt.Errorf("gate: rate-limit window must be at least 1 ms, got %s", p.Window))
	}
	if p.ProbeTimeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("gate: probe timeout must be at least 1 ms, got %s", p.ProbeTimeout))
	}
	if p.StoreTimeout <= 0 || p.StoreRetry < 0 {
		errs = append(errs, fmt.Errorf("gate: store timeout must be positive and store retry not negative, got %s and %s", p.StoreTimeout, p.StoreRetry))
	}
	return errors.Join(errs...)
}

// DefaultRetryShare is RetryShare's default: half of the limit is reserved for retries.
const DefaultRetryShare = 0.5

// RetryReserve is how many retries per Window the rate limiter admits whatever the first
// attempts: max(1, ceil(RetryRPS × RetryShare)), RetryShare 0 (or out of range) meaning
// DefaultRetryShare. It is 0 when the limiter is off. Stores take it from here, so that they
// all round alike.
func (p Params) RetryReserve() int {
	if !p.Limiter() {
		return 0
	}
	share := p.RetryShare
	if !(share > 0 && share <= 1) {
		share = DefaultRetryShare
	}
	// The product of a decimal share and the limit is not exact in binary (10 × 0.7 is
	// 7.000000000000001): a nanoscopic excess must not round up to one more retry.
	r := int(math.Ceil(float64(p.RetryRPS)*share - 1e-9))
	return min(max(1, r), p.RetryRPS)
}

// Breaker reports whether the circuit breaker is on.
func (p Params) Breaker() bool { return p.Threshold > 0 }

// Limiter reports whether the retry rate limiter is on.
func (p Params) Limiter() bool { return p.RetryRPS > 0 }

// Hooks let the caller observe the gate without the gate knowing about metrics. Nil fields
// are ignored.
type Hooks struct {
	// OnTransition is called once per real change of an endpoint's breaker state, by the
	// instance that made it (feed fluxora_webhook_circuit_breaker_transitions_total with
	// from and to; they are State values).
	OnTransition func(from, to string)
	// OnClosed is called once each time this gate's Record closes an endpoint's breaker (from
	// half_open, or open, to closed: the probe it held succeeded), with the endpoint's hash,
	// after OnTransition; other instances' gates do not call it. Rows deferred behind that
	// breaker wait for its reset time or for the probe's expiry: the caller may bring them
	// forward now (later rows of the same settled batch may already have opened it again, in
	// which case they are deferred again when claimed). It is called synchronously on the
	// settle path, so it should not block for long.
	OnClosed func(hash string)
	// OnFailOpen is called once per row allowed without a decision because the store could
	// not be reached (feed fluxora_webhook_gate_fail_open_total).
	OnFailOpen func()
	// Logger receives one line per breaker transition and one per store outage and recovery
	// (never one per row). Endpoints are named by their hash, never their URL.
	Logger *zap.Logger
}

// BreakerGate is the Gate with a circuit breaker on every attempt and a rate limiter on
// retries, both per endpoint, with their state in a Store. See the package documentation for
// the semantics.
type BreakerGate struct {
	store  Store
	p      Params
	hooks  Hooks
	log    *zap.Logger
	prefix string
	seq    atomic.Uint64

	mu        sync.Mutex
	down      bool      // the last store call failed
	downUntil time.Time // fail open without calling the store until then
}

var (
	_ Gate      = (*BreakerGate)(nil)
	_ Inspector = (*BreakerGate)(nil)
)

// NewBreakerGate returns a gate deciding with store under p (defaults applied). It returns an
// error naming the setting when p is invalid.
func NewBreakerGate(store Store, p Params, hooks Hooks) (*BreakerGate, error) {
	if store == nil {
		return nil, errors.New("gate: nil store")
	}
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	g := &BreakerGate{store: store, p: p, hooks: hooks, log: hooks.Logger, prefix: hex.EncodeToString(b[:]) + "-"}
	if g.log == nil {
		g.log = zap.NewNop()
	}
	return g, nil
}

// Params returns the effective parameters (defaults applied).
func (g *BreakerGate) Params() Params { return g.p }

// Check decides for every row of batch with one store call: rows held back get a Defer
// outcome with the wait and the reason, the row that becomes the half-open probe gets its
// owner token in GateToken, and the rest are left undecided (attempt now). A row deferred
// behind a probe in flight also gets RecheckIn, the reset, when that is sooner than the
// probe's expiry: the probe may be another instance's, whose end this one is never told of,
// so the caller should not hold the endpoint for longer (delivery.Delivery.RecheckIn). When
// the store cannot be reached, every row is allowed (fail open) and OnFailOpen is called per
// row.
func (g *BreakerGate) Check(ctx context.Context, batch []*delivery.Delivery) {
	if !g.p.Breaker() && !g.p.Limiter() {
		return
	}
	checks, rows := g.group(batch)
	if len(checks) == 0 {
		return
	}
	total := 0
	for _, r := range rows {
		total += len(r)
	}
	if !g.storeUsable() {
		g.failOpen(total)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, g.p.StoreTimeout)
	decisions, err := g.store.Decide(cctx, g.p, checks)
	cancel()
	if err == nil && len(decisions) != len(checks) {
		err = fmt.Errorf("gate: store returned %d decisions for %d endpoints", len(decisions), len(checks))
	}
	if err != nil {
		if ctx.Err() != nil {
			// The dispatcher is shutting down and cancelled the batch: its rows are
			// released without a request; the store is not at fault.
			return
		}
		g.storeFailed(err)
		g.failOpen(total)
		return
	}
	failed := 0
	var firstErr error
	for i, dec := range decisions {
		if dec.Err == nil && len(dec.Rows) != len(rows[i]) {
			dec.Err = fmt.Errorf("gate: store returned %d decisions for %d rows", len(dec.Rows), len(rows[i]))
		}
		if dec.Err != nil {
			failed += len(rows[i])
			if firstErr == nil {
				firstErr = dec.Err
			}
			continue
		}
		for j, del := range rows[i] {
			switch rd := dec.Rows[j]; {
			case rd.Verdict == Probe:
				del.GateToken = checks[i].Token
			case rd.Verdict.Deferred():
				del.Outcome = delivery.Outcome{Kind: delivery.Defer, Delay: max(rd.Delay, time.Millisecond), Reason: rd.Verdict.String()}
				if rd.Verdict == DeferProbe && g.p.Reset < del.Outcome.Delay {
					del.RecheckIn = g.p.Reset
				}
			}
		}
		g.transitions(dec.Transitions, rows[i])
	}
	if firstErr != nil {
		g.storeFailed(firstErr)
		g.failOpen(failed)
		return
	}
	g.storeOK()
}

// Record tells the breaker the outcome of every attempted row of a settled batch (one store
// call) and gives back the probes the batch held. Deferred rows were never attempted and are
// skipped. It is best effort: a store error is logged once per outage; a probe whose result is
// lost expires after ProbeTimeout. A probe row that did not close the circuit gets
// ProbeEnded and NextProbe (see probesEnded).
func (g *BreakerGate) Record(ctx context.Context, batch []*delivery.Delivery) {
	if !g.p.Breaker() {
		return
	}
	var results []EndpointResult
	index := map[string]int{}
	for _, del := range batch {
		if del.Endpoint == nil {
			continue
		}
		r := resultOf(del.Outcome)
		token := del.GateToken
		if token == "" && (r == Neutral || r == NotAttempted) {
			continue // changes nothing
		}
		i, ok := index[del.Endpoint.Hash]
		if !ok {
			i = len(results)
			index[del.Endpoint.Hash] = i
			results = append(results, EndpointResult{Hash: del.Endpoint.Hash})
		}
		results[i].Rows = append(results[i].Rows, RowResult{Result: r, Token: token})
	}
	if len(results) == 0 || !g.storeUsable() {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, g.p.StoreTimeout)
	trans, err := g.store.Record(cctx, g.p, results)
	cancel()
	g.transitions(trans, batch)
	if err != nil {
		if ctx.Err() == nil {
			g.storeFailed(err)
		}
		return
	}
	g.storeOK()
	g.probesEnded(batch, trans)
}

// Inspect implements Inspector: one store call, bounded by StoreTimeout, for every hash. While
// the store is failing (within StoreRetry of an error) it returns an error without calling it,
// as Check fails open then: a reader must not add a timeout per claim to an outage. With the
// breaker off every endpoint is closed.
func (g *BreakerGate) Inspect(ctx context.Context, hashes []string) ([]Snapshot, error) {
	if !g.p.Breaker() {
		out := make([]Snapshot, len(hashes))
		for i, h := range hashes {
			out[i] = Snapshot{Hash: h, State: Closed, At: time.Now()}
		}
		return out, nil
	}
	if !g.storeUsable() {
		return nil, errStoreDown
	}
	cctx, cancel := context.WithTimeout(ctx, g.p.StoreTimeout)
	snaps, err := g.store.Inspect(cctx, hashes)
	cancel()
	if err == nil && len(snaps) != len(hashes) {
		err = fmt.Errorf("gate: store returned %d snapshots for %d endpoints", len(snaps), len(hashes))
	}
	if err != nil {
		// Not storeFailed: Inspect only ends holds sooner, and failing open would switch off
		// every endpoint's breaker and rate limit for StoreRetry on one slow read. A store that
		// is really down fails the next Check, which fails the gate open.
		return nil, err
	}
	g.storeOK()
	return snaps, nil
}

// errStoreDown is Inspect's error while the gate fails open after a store error.
var errStoreDown = errors.New("gate: store unavailable (failing open)")

// probesEnded tells the caller, on each row of a recorded batch that held a probe and did not
// close the circuit, when the endpoint's next probe may go (Delivery.ProbeEnded, NextProbe):
// the rows deferred behind that probe wait for its expiry, and the caller's claims leave the
// endpoint alone until then, which only a success would cut short otherwise. A failure that
// re-opened the circuit (the owner's) allows the next probe after Reset; a probe given back
// (a permanent answer, no request) allows it now. A failure that moved nothing came from a
// probe that had expired: another attempt may hold the probe now, so nothing is said. A probe
// given back after it expired says "now" too (the store does not tell): at worst the caller
// claims a row that is deferred again behind the current probe.
func (g *BreakerGate) probesEnded(batch []*delivery.Delivery, trans []Transition) {
	for _, del := range batch {
		if del.GateToken == "" || del.Endpoint == nil {
			continue
		}
		switch resultOf(del.Outcome) {
		case Failure:
			for _, t := range trans {
				if t.Hash == del.Endpoint.Hash && t.To == Open {
					del.ProbeEnded, del.NextProbe = true, g.p.Reset
				}
			}
		case Neutral, NotAttempted:
			del.ProbeEnded, del.NextProbe = true, 0
		}
	}
}

// resultOf maps a settled outcome to what it tells the breaker. Settle has already turned an
// exhausted Retry into Permanent, so a Permanent outcome is a failure when its status (or the
// absence of a response) is retryable, and neutral otherwise.
func resultOf(o delivery.Outcome) Result {
	switch o.Kind {
	case delivery.Delivered:
		return Success
	case delivery.Retry:
		return Failure
	case delivery.Permanent:
		if retryableStatus(o.Status) || o.Status == 0 && o.Error != "" {
			return Failure
		}
		return Neutral
	default: // Defer, Release, Undecided: no request was completed
		return NotAttempted
	}
}

// retryableStatus lists the statuses that still count as the endpoint's failure when they end a
// delivery that exhausted its retries (a server's or a gateway's trouble, a timeout, a rate
// limit): the statuses the original dispatcher retried. Other answers that exhausted the
// schedule (a 404 for days) say nothing more about the endpoint's health than their retries did.
func retryableStatus(status int) bool {
	switch status {
	case 408, 425, 429, 500, 502, 503, 504:
		return true
	}
	return false
}

// rateLimited is the deferral reason of the rate limiter (delivery.Delivery.DeferredBy).
var rateLimited = DeferRateLimit.String()

// group splits the batch by endpoint, keeping batch order within each endpoint.
func (g *BreakerGate) group(batch []*delivery.Delivery) ([]EndpointCheck, [][]*delivery.Delivery) {
	var checks []EndpointCheck
	var rows [][]*delivery.Delivery
	index := make(map[string]int, 1)
	for _, del := range batch {
		if del.Endpoint == nil || del.Outcome.Kind != delivery.Undecided {
			continue
		}
		i, ok := index[del.Endpoint.Hash]
		if !ok {
			i = len(checks)
			index[del.Endpoint.Hash] = i
			checks = append(checks, EndpointCheck{Hash: del.Endpoint.Hash, Token: g.prefix + strconv.FormatUint(g.seq.Add(1), 36),
				RetryRPS: del.Endpoint.RetryRPS})
			rows = append(rows, nil)
		}
		checks[i].Retry = append(checks[i].Retry, del.Attempt > 1)
		checks[i].Returning = append(checks[i].Returning, del.Attempt > 1 && del.DeferredBy == rateLimited)
		rows[i] = append(rows[i], del)
	}
	return checks, rows
}

func (g *BreakerGate) failOpen(n int) {
	if g.hooks.OnFailOpen == nil {
		return
	}
	for range n {
		g.hooks.OnFailOpen()
	}
}

// transitions reports ts, which the store returned for rows of batch: a line names the
// consumer as a delivery line does (endpoint_id for a managed endpoint, the URL's origin, the
// hash only at debug), so that an operator reads which consumer's circuit opened.
func (g *BreakerGate) transitions(ts []Transition, batch []*delivery.Delivery) {
	for _, t := range ts {
		if g.hooks.OnTransition != nil {
			g.hooks.OnTransition(string(t.From), string(t.To))
		}
		fields := append(g.endpointFields(t.Hash, batch), zap.String("from_state", string(t.From)), zap.String("to_state", string(t.To)))
		switch t.To {
		case Open:
			g.log.Warn("circuit breaker opened", append(fields, zap.Int64("reset_ms", g.p.Reset.Milliseconds()))...)
		case HalfOpen:
			g.log.Info("circuit breaker half-open: probing the endpoint", fields...)
		case Closed:
			g.log.Info("circuit breaker closed", fields...)
			if g.hooks.OnClosed != nil {
				g.hooks.OnClosed(t.Hash)
			}
		}
	}
}

// endpointFields names the endpoint whose hash is hash by the first row of batch that goes to
// it: never by its URL, whose path or query may carry a token.
func (g *BreakerGate) endpointFields(hash string, batch []*delivery.Delivery) []zap.Field {
	var f []zap.Field
	for _, del := range batch {
		if del.Endpoint == nil || del.Endpoint.Hash != hash {
			continue
		}
		if del.EndpointID != "" {
			f = append(f, zap.String("endpoint_id", del.EndpointID))
		}
		if o := del.Endpoint.Origin(); o != "" {
			f = append(f, zap.String("origin", o))
		}
		break
	}
	if len(f) == 0 || g.log.Core().Enabled(zap.DebugLevel) {
		// The hash is the only name left when no row tells the endpoint (a store that
		// reports a transition of another endpoint).
		f = append(f, zap.String("endpoint_hash", hash))
	}
	return f
}

// storeUsable reports whether the store may be called now (not within StoreRetry of a failure).
func (g *BreakerGate) storeUsable() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.down || !time.Now().Before(g.downUntil)
}

func (g *BreakerGate) storeFailed(err error) {
	g.mu.Lock()
	was := g.down
	g.down = true
	g.downUntil = time.Now().Add(g.p.StoreRetry)
	g.mu.Unlock()
	if !was {
		g.log.Warn("gate store unavailable: failing open (delivering without breaker or rate limit) until it answers again",
			zap.Error(err), zap.Int64("retry_every_ms", g.p.StoreRetry.Milliseconds()))
	}
}

func (g *BreakerGate) storeOK() {
	g.mu.Lock()
	was := g.down
	g.down = false
	g.mu.Unlock()
	if was {
		g.log.Info("gate store available again")
	}
}
