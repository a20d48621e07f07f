package main

// TestChaosEndpoints is the managed endpoints' randomized test: a schedule drawn from a seed
// changes endpoints (add, URL, tenant, filter, scheme, ordering, disable, enable, secret
// rotation, removal) while events of several tenants and streams flow through three `serve`
// processes, consumers fail, stall and recover, and one instance is killed with SIGKILL and
// restarted. Every change is applied by the store API (sql/endpoints) in a transaction whose
// commit the test times: the state before the commit call and after its return are both
// possible in between, and only there. Each endpoint URL is a consumer of its own, owned by one
// endpoint and one tenant: a tenant change always comes with a new URL.
//
// Afterwards, with every consumer healed and the outbox drained, it checks:
//
//	(a) tenants: no request reached a consumer of another tenant than its event's;
//	(b) signatures: every request is signed (in the scheme its headers say) with a secret
//	    valid for its endpoint at the moment it was signed;
//	(c) order: on an endpoint that orders streams, the first 2xx of a stream's deliveries
//	    that carry an order key come in key order, while the endpoint ordered throughout;
//	(d) settlement: every routed delivery is delivered (2xx in the log, and at a consumer of
//	    its endpoint) or dead-lettered with a reason, each event routed once, nothing stuck;
//	(e) routing: an event went only to endpoints that could have matched it between its
//	    enqueue and its routing, and to every endpoint that matched it throughout.
//
// FLUXHOOK_CHAOS_SEED (an unsigned integer) and FLUXHOOK_CHAOS_DURATION (a Go duration: how
// long the schedule runs) override the defaults; a failure prints the seed, the command to
// run it again and the schedule.

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/sign"
)

const (
	// chaosDefaultSeed and chaosDefaultDuration are CI's run: about a minute in all under
	// -race on a 2-core machine.
	chaosDefaultSeed     = 1
	chaosDefaultDuration = 40 * time.Second
	// chaosRate is the steady producer's events per second (bursts come on top).
	chaosRate = 50
	// chaosSignLag is how long before its signing second (the signature's timestamp, in whole
	// seconds) a request may have been signed by a secret that had just stopped being valid:
	// an instance signs from its endpoint cache, refreshed before each claimed batch is routed
	// and gated, so a change committed meanwhile reaches the next batch. The run logs how much
	// of it was used (none, in the runs measured so far).
	chaosSignLag = 2 * time.Second
	// chaosDrainWait bounds the wait for the outbox to empty once the consumers are healed.
	chaosDrainWait = 90 * time.Second
	// chaosExamples is how many examples each failed check prints.
	chaosExamples = 8
)

var (
	chaosTenants    = []string{"t1", "t2", "t3", ""}
	chaosStreams    = []string{"s0", "s1", "s2", "s3"}
	chaosEventTypes = []string{"stream.created", "stream.updated", "payment.settled", "user.signed_up"}
	chaosFilters    = [][]string{{}, {}, {"stream.*"}, {"payment.settled"}, {"stream.updated", "user.signed_up"}, {"payment.*", "stream.*"}}
	// chaosGraces are the rotations' grace periods (endpoints.NoGrace for a leaked secret).
	chaosGraces = []time.Duration{endpoints.NoGrace, time.Second, 2 * time.Second, 5 * time.Second, 30 * time.Second}
)

// Consumer behaviours, switched by the schedule; every consumer is healthy at the end.
const (
	modeHealthy int32 = iota // 200, 3% 503
	modeFlaky                // 25% 500/503, 2% 400 (dead-lettered at once), 13% slow 200
	modeOutage               // 503
	modeSlow                 // 200 after 100-700 ms
)

var modeNames = []string{"healthy", "flaky", "outage", "slow"}

func chaosTenant(t string) string {
	if t == "" {
		return "(none)"
	}
	return t
}

// chaosRequest is one request a consumer received.
type chaosRequest struct {
	Seq      int64 // arrival order across every consumer, from 1
	At       time.Time
	Consumer *chaosConsumer
	Header   http.Header
	Body     []byte
	ID       string // the delivery id: x-fluxora-delivery-id or webhook-id
	Attempt  string
	Status   int // 0: the dispatcher gave up (or died) before the answer
}

func (r *chaosRequest) ok() bool { return r.Status >= 200 && r.Status <= 299 }

// chaosRecorder records every consumer's requests in one arrival order.
type chaosRecorder struct {
	seed    uint64
	seq     atomic.Int64
	closing context.Context
	mu      sync.Mutex
	reqs    []*chaosRequest
}

func (rec *chaosRecorder) all() []*chaosRequest {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := slices.Clone(rec.reqs)
	slices.SortFunc(out, func(a, b *chaosRequest) int { return int(a.Seq - b.Seq) })
	return out
}

// chaosConsumer is one endpoint URL: an HTTP server on 127.0.0.1 that records every request
// and answers as its mode says. It belongs to one endpoint and one tenant for its life.
type chaosConsumer struct {
	rec    *chaosRecorder
	name   string
	tenant string
	ep     *chaosEndpoint
	srv    *httptest.Server
	mode   atomic.Int32
}

func (c *chaosConsumer) URL() string { return c.srv.URL + "/hook/" + c.name }

func (c *chaosConsumer) String() string {
	return fmt.Sprintf("consumer %s (tenant %s, %s)", c.name, chaosTenant(c.tenant), c.ep.label)
}

func (c *chaosConsumer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(c.rec.closing, cancel)()
	body, err := io.ReadAll(r.Body)
	req := &chaosRequest{Seq: c.rec.seq.Add(1), At: time.Now(), Consumer: c, Header: r.Header.Clone(), Body: body,
		ID: r.Header.Get(sign.HeaderDeliveryID), Attempt: r.Header.Get(sign.HeaderAttempt)}
	if req.ID == "" {
		req.ID = r.Header.Get(sign.HeaderWebhookID)
	}
	if err == nil {
		req.Status = c.respond(ctx, req)
	}
	if req.Status != 0 && ctx.Err() != nil {
		req.Status = 0 // nobody is listening any more: not an answer the dispatcher saw
	}
	// Recorded before the answer is written: by the time the dispatcher settles the delivery,
	// the test knows what it was told.
	c.rec.mu.Lock()
	c.rec.reqs = append(c.rec.reqs, req)
	c.rec.mu.Unlock()
	if req.Status != 0 {
		w.WriteHeader(req.Status)
	}
}

// respond answers by the consumer's mode; which requests of a mode fail, and how slow a slow
// one is, is drawn from the seed, the consumer, the delivery and the attempt.
func (c *chaosConsumer) respond(ctx context.Context, req *chaosRequest) int {
	h := fnv.New64a()
	fmt.Fprint(h, c.rec.seed, "/", c.name, "/", req.ID, "/", req.Attempt)
	u := h.Sum64()
	p, delay := u%100, time.Duration(100+(u/100)%600)*time.Millisecond
	switch c.mode.Load() {
	case modeFlaky:
		switch {
		case p < 12:
			return http.StatusInternalServerError
		case p < 25:
			return http.StatusServiceUnavailable
		case p < 27:
			return http.StatusBadRequest
		case p < 40:
			if !sleepCtx(ctx, delay) {
				return 0
			}
		}
	case modeOutage:
		return http.StatusServiceUnavailable
	case modeSlow:
		if !sleepCtx(ctx, delay) {
			return 0
		}
	default:
		if p < 3 {
			return http.StatusServiceUnavailable
		}
	}
	return http.StatusOK
}

// epState is an endpoint as the dispatcher may read it; the zero value is "does not exist".
type epState struct {
	Exists    bool
	Enabled   bool
	Tenant    string
	URL       string
	Filter    []string
	Scheme    string
	Secret    string
	Prev      string
	PrevUntil time.Time
	Ordering  string
	CreatedAt time.Time
}

func stateOf(e endpoints.Endpoint) epState {
	return epState{Exists: true, Enabled: e.Enabled, Tenant: e.Tenant, URL: e.URL, Filter: slices.Clone(e.EventTypes),
		Scheme: e.Scheme, Secret: e.Secret, Prev: e.PreviousSecret, PrevUntil: e.PreviousUntil, Ordering: e.Ordering,
		CreatedAt: e.CreatedAt}
}

// ordered: the endpoint exists, is enabled and orders its streams.
func (s epState) ordered() bool {
	return s.Exists && s.Enabled && s.Ordering == endpoints.OrderingStream
}

// matches is the routing rule of docs/endpoints.md (route.sql): enabled, the event's tenant,
// existing when the event was enqueued, and a filter that takes the event type.
func (s epState) matches(ev *chaosEvent, enqueuedAt time.Time) bool {
	return s.Exists && s.Enabled && s.Tenant == ev.Tenant && !s.CreatedAt.After(enqueuedAt) &&
		endpoints.Matches(s.Filter, ev.Type)
}

func (s epState) String() string {
	if !s.Exists {
		return "removed"
	}
	on := "enabled"
	if !s.Enabled {
		on = "disabled"
	}
	return fmt.Sprintf("%s tenant %s url %s filter %v %s secret %s ordering %s", on, chaosTenant(s.Tenant),
		s.URL[strings.LastIndex(s.URL, "/")+1:], s.Filter, s.Scheme, fingerprint(s.Secret), s.Ordering)
}

// fingerprint names a secret in messages without printing it.
func fingerprint(secret string) string {
	if secret == "" {
		return "-"
	}
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:3])
}

// epChange is one committed change: State is in effect from some moment of [Before, After]
// on (the commit's round trip), until the next change's.
type epChange struct {
	Step          int
	Before, After time.Time
	State         epState
}

type chaosEndpoint struct {
	label    string
	id       string
	hist     []epChange
	consumer *chaosConsumer // the one its URL points at now
}

func (e *chaosEndpoint) cur() epState { return e.hist[len(e.hist)-1].State }

// possible returns the states the endpoint may have had at some moment of [from, to]: state
// i from its commit's start to the end of the next commit.
func (e *chaosEndpoint) possible(from, to time.Time) []epState {
	var out []epState
	if !from.After(e.hist[0].After) {
		out = append(out, epState{})
	}
	for i, c := range e.hist {
		if c.Before.After(to) {
			break
		}
		if i+1 < len(e.hist) && e.hist[i+1].After.Before(from) {
			continue
		}
		out = append(out, c.State)
	}
	return out
}

// history is the endpoint's changes between two moments, for messages.
func (e *chaosEndpoint) history(c *chaos, from, to time.Time) string {
	var b strings.Builder
	for i, h := range e.hist {
		if i+1 < len(e.hist) && e.hist[i+1].After.Before(from) || h.Before.After(to) {
			continue
		}
		fmt.Fprintf(&b, "\n\t\t\tfrom step %d [%s–%s]: %s", h.Step, c.rel(h.Before), c.rel(h.After), h.State)
	}
	return b.String()
}

// chaosEvent is one enqueued event.
type chaosEvent struct {
	N                    int
	ID                   int64
	DeliveryID           string
	Tenant, Stream, Type string
	Start, End           time.Time // around the enqueue's commit
	Step                 int       // the schedule's step when it was enqueued
	routedAt, enqueuedAt time.Time // from its routing row in the delivery log
	routedTo             int
	routingError         string
}

func (ev *chaosEvent) String() string {
	return fmt.Sprintf("event #%d (id %d, delivery %s, tenant %s, stream %q, %s)", ev.N, ev.ID, ev.DeliveryID,
		chaosTenant(ev.Tenant), ev.Stream, ev.Type)
}

type chaosStep struct {
	N             int
	Before, After time.Time
	What          string
}

type chaosProc struct {
	p    *serveProc
	app  string
	id   string // its instance id, what it writes to leased_by
	dead bool
}

// chaos is the run: its schedule, endpoints, consumers, instances and events.
type chaos struct {
	t      *testing.T
	ctx    context.Context
	db     *sqltest.DB
	cipher *endpoints.Cipher
	rng    *rand.Rand
	seed   uint64
	origin time.Time
	rec    *chaosRecorder

	eps        []*chaosEndpoint
	byID       map[string]*chaosEndpoint
	byURL      map[string]*chaosConsumer
	nConsumers int

	stepMu sync.Mutex
	steps  []chaosStep

	evMu   sync.Mutex
	events []*chaosEvent
	evErrs []string

	procs          []*chaosProc
	env            func(app string) map[string]string
	closeConsumers context.CancelFunc
}

func (c *chaos) rel(t time.Time) string { return fmt.Sprintf("%.3fs", t.Sub(c.origin).Seconds()) }

// stepAt is the number of the last step that had begun by t.
func (c *chaos) stepAt(t time.Time) int {
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	n := 0
	for _, s := range c.steps {
		if s.Before.After(t) {
			break
		}
		n = s.N
	}
	return n
}

func (c *chaos) addStep(before, after time.Time, what string) int {
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	n := len(c.steps) + 1
	c.steps = append(c.steps, chaosStep{N: n, Before: before, After: after, What: what})
	return n
}

func (c *chaos) note(what string) int {
	now := time.Now()
	return c.addStep(now, now, what)
}

func (c *chaos) schedule() string {
	c.stepMu.Lock()
	defer c.stepMu.Unlock()
	var b strings.Builder
	for _, s := range c.steps {
		fmt.Fprintf(&b, "\n  step %3d [%s–%s] %s", s.N, c.rel(s.Before), c.rel(s.After), s.What)
	}
	return b.String()
}

func (c *chaos) newConsumer(ep *chaosEndpoint, tenant string, mode int32) *chaosConsumer {
	c.nConsumers++
	k := &chaosConsumer{rec: c.rec, name: fmt.Sprintf("c%d", c.nConsumers), tenant: tenant, ep: ep}
	k.mode.Store(mode)
	k.srv = httptest.NewServer(k)
	c.t.Cleanup(func() {
		c.closeConsumers() // hanging answers end first, or Close would wait for them
		k.srv.Close()
	})
	c.byURL[k.URL()] = k
	return k
}

func (c *chaos) randomMode() int32 {
	return []int32{modeHealthy, modeHealthy, modeFlaky, modeFlaky, modeSlow}[c.rng.IntN(5)]
}

func (c *chaos) secret(scheme string) string {
	b := make([]byte, 24)
	for i := range b {
		b[i] = byte(c.rng.Uint32())
	}
	if scheme == endpoints.SchemeStandard {
		return "whsec_" + base64.StdEncoding.EncodeToString(b)
	}
	return hex.EncodeToString(b)
}

// commit runs change in a transaction, reads the endpoint as it will be committed, and times
// the commit: the step's window, in which both the old and the new state are possible.
func (c *chaos) commit(ep *chaosEndpoint, what string, change func(tx pgx.Tx) (string, error)) {
	c.t.Helper()
	tx, err := c.db.Pool.Begin(c.ctx)
	if err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	defer func() { _ = tx.Rollback(c.ctx) }()
	id, err := change(tx)
	if err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
	var st epState
	switch got, err := endpoints.Get(c.ctx, tx, c.cipher, id); {
	case errors.Is(err, endpoints.ErrNotFound):
	case err != nil:
		c.t.Fatalf("%s: reading the endpoint back: %v", what, err)
	default:
		st = stateOf(got)
	}
	before := time.Now()
	if err := tx.Commit(c.ctx); err != nil {
		c.t.Fatalf("%s: commit: %v", what, err)
	}
	after := time.Now()
	if ep.id == "" {
		ep.id = id
		c.byID[id] = ep
	}
	n := c.addStep(before, after, what)
	ep.hist = append(ep.hist, epChange{Step: n, Before: before, After: after, State: st})
}

func (c *chaos) live() []*chaosEndpoint {
	var out []*chaosEndpoint
	for _, ep := range c.eps {
		if ep.cur().Exists {
			out = append(out, ep)
		}
	}
	return out
}

// orderedEndpoint is the live endpoint whose ordering is stream (enabled or not), if any.
func (c *chaos) orderedEndpoint() *chaosEndpoint {
	for _, ep := range c.live() {
		if ep.cur().Ordering == endpoints.OrderingStream {
			return ep
		}
	}
	return nil
}

func (c *chaos) add(tenant string, ordering string) *chaosEndpoint {
	ep := &chaosEndpoint{label: fmt.Sprintf("ep%d", len(c.eps)+1)}
	c.eps = append(c.eps, ep)
	scheme := endpoints.SchemeFluxora
	if c.rng.IntN(3) == 0 {
		scheme = endpoints.SchemeStandard
	}
	filter := chaosFilters[c.rng.IntN(len(chaosFilters))]
	k := c.newConsumer(ep, tenant, c.randomMode())
	ep.consumer = k
	what := fmt.Sprintf("add %s --tenant %s --url %s --event-types %v --scheme %s --ordering %s (%s)", ep.label,
		chaosTenant(tenant), k.name, filter, scheme, ordering, modeNames[k.mode.Load()])
	c.commit(ep, what, func(tx pgx.Tx) (string, error) {
		e, err := endpoints.Add(c.ctx, tx, c.cipher, endpoints.New{URL: k.URL(), Description: ep.label, Tenant: tenant,
			EventTypes: filter, Scheme: scheme, Secret: c.secret(scheme), Ordering: ordering})
		return e.ID, err
	})
	return ep
}

func (c *chaos) update(ep *chaosEndpoint, what string, p endpoints.Patch) {
	c.commit(ep, ep.label+": "+what, func(tx pgx.Tx) (string, error) {
		_, err := endpoints.Update(c.ctx, tx, c.cipher, ep.id, p)
		return ep.id, err
	})
}

// moveTo points ep at a new consumer of tenant (its tenant changes with it).
func (c *chaos) moveTo(ep *chaosEndpoint, tenant string) {
	old := ep.consumer
	k := c.newConsumer(ep, tenant, c.randomMode())
	url := k.URL()
	p := endpoints.Patch{URL: &url}
	what := fmt.Sprintf("update --url %s (%s; was %s)", k.name, modeNames[k.mode.Load()], old.name)
	if tenant != ep.cur().Tenant {
		p.Tenant = &tenant
		what = fmt.Sprintf("update --tenant %s --url %s (%s; was tenant %s at %s)", chaosTenant(tenant), k.name,
			modeNames[k.mode.Load()], chaosTenant(ep.cur().Tenant), old.name)
	}
	c.update(ep, what, p)
	ep.consumer = k
}

func (c *chaos) setMode(ep *chaosEndpoint, mode int32) {
	ep.consumer.mode.Store(mode)
	c.note(fmt.Sprintf("%s: consumer %s %s", ep.label, ep.consumer.name, modeNames[mode]))
}

// enqueue inserts events in one transaction, as an application would, and records them with
// the moments around their commit.
func (c *chaos) enqueue(next *atomic.Int64, evs ...*chaosEvent) {
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	err := pgx.BeginFunc(ctx, c.db.Pool, func(tx pgx.Tx) error {
		for _, ev := range evs {
			ev.N = int(next.Add(1))
			payload := map[string]any{"n": ev.N, "tenant": ev.Tenant, "stream": ev.Stream}
			e, err := outbox.Enqueue(ctx, tx, outbox.Event{EventType: ev.Type, Payload: payload, StreamID: ev.Stream, Tenant: ev.Tenant})
			if err != nil {
				return err
			}
			ev.ID, ev.DeliveryID = e.ID, e.DeliveryID
		}
		return nil
	})
	end := time.Now()
	c.evMu.Lock()
	defer c.evMu.Unlock()
	if err != nil {
		if c.ctx.Err() == nil {
			c.evErrs = append(c.evErrs, err.Error())
		}
		return
	}
	for _, ev := range evs {
		ev.Start, ev.End = start, end
		c.events = append(c.events, ev)
	}
}

// burst enqueues several events of one tenant's stream back to back, mostly in one
// transaction: a stream's events come in bursts, which is when an ordered endpoint has several
// of them waiting at once. Their types are among those filter lets through.
func (c *chaos) burst(next *atomic.Int64, tenant, stream string, filter []string) {
	types := slices.DeleteFunc(slices.Clone(chaosEventTypes), func(typ string) bool { return !endpoints.Matches(filter, typ) })
	n := 4 + c.rng.IntN(7)
	evs := make([]*chaosEvent, n)
	for i := range evs {
		evs[i] = &chaosEvent{Tenant: tenant, Stream: stream, Type: types[c.rng.IntN(len(types))]}
	}
	before := time.Now()
	how := "in one transaction"
	if c.rng.IntN(4) == 0 {
		how = "one transaction each"
		for _, ev := range evs {
			c.enqueue(next, ev)
		}
	} else {
		c.enqueue(next, evs...)
	}
	c.addStep(before, time.Now(), fmt.Sprintf("burst of %d events of tenant %s, stream %s, %s", n, chaosTenant(tenant), stream, how))
}

// produce enqueues events of random tenants, streams and types at chaosRate a second until
// ctx ends.
func (c *chaos) produce(ctx context.Context, next *atomic.Int64, done chan<- struct{}) {
	defer close(done)
	rng := rand.New(rand.NewPCG(c.seed, 2))
	start := time.Now()
	for i := 0; ; i++ {
		// Pacing, not waiting for async work: event i is due at start + i/rate.
		if !sleepCtx(ctx, time.Until(start.Add(time.Duration(i)*time.Second/chaosRate))) {
			return
		}
		if ctx.Err() != nil {
			return
		}
		stream := ""
		if rng.IntN(10) < 6 {
			stream = chaosStreams[rng.IntN(len(chaosStreams))]
		}
		c.enqueue(next, &chaosEvent{Tenant: chaosTenants[rng.IntN(len(chaosTenants))], Stream: stream,
			Type: chaosEventTypes[rng.IntN(len(chaosEventTypes))]})
	}
}

func (c *chaos) startInstance(name, app string) *chaosProc {
	p := &chaosProc{p: startServe(c.t, name, c.env(app)), app: app}
	c.procs = append(c.procs, p)
	return p
}

// alive fails the test at once if an instance the schedule did not kill has exited.
func (c *chaos) alive() {
	c.t.Helper()
	for _, p := range c.procs {
		if !p.dead && p.p.exited() {
			c.t.Fatalf("%s exited (%s) at step %d", p.p.name, p.p.cmd.ProcessState, c.stepAt(time.Now()))
		}
	}
}

// instanceName is the name of the instance with that id.
func (c *chaos) instanceName(id string) string {
	for _, p := range c.procs {
		if p.id == id && id != "" {
			return p.p.name
		}
	}
	return fmt.Sprintf("instance %q", id)
}

// step applies one random change (or consumer behaviour, or burst).
func (c *chaos) step(next *atomic.Int64) {
	live := c.live()
	pick := func(list []*chaosEndpoint) *chaosEndpoint { return list[c.rng.IntN(len(list))] }
	ep := pick(live)
	cur := ep.cur()
	switch r := c.rng.IntN(100); {
	case r < 7 && len(live) < 9:
		ordering := endpoints.OrderingNone
		if c.orderedEndpoint() == nil && c.rng.IntN(3) == 0 {
			ordering = endpoints.OrderingStream
		}
		c.add(chaosTenants[c.rng.IntN(len(chaosTenants))], ordering)
	case r < 14:
		c.moveTo(ep, cur.Tenant)
	case r < 24:
		// A tenant change while the endpoint's deliveries are failing: retries of the old
		// tenant's events are pending when the endpoint changes hands.
		if ep.consumer.mode.Load() != modeOutage {
			c.setMode(ep, modeOutage)
			c.pause(300, 900)
		}
		tenants := slices.DeleteFunc(slices.Clone(chaosTenants), func(t string) bool { return t == ep.cur().Tenant })
		c.moveTo(ep, tenants[c.rng.IntN(len(tenants))])
	case r < 30:
		f := chaosFilters[c.rng.IntN(len(chaosFilters))]
		c.update(ep, fmt.Sprintf("update --event-types %v", f), endpoints.Patch{EventTypes: &f})
	case r < 36:
		scheme := endpoints.SchemeStandard
		if cur.Scheme == scheme {
			scheme = endpoints.SchemeFluxora
		}
		secret := c.secret(scheme)
		c.update(ep, "update --scheme "+scheme, endpoints.Patch{Scheme: &scheme, Secret: &secret})
	case r < 50:
		// One endpoint orders its streams at a time, so that turning it on is the change from
		// nothing ordered to something ordered, which every instance's cache must catch.
		if o := c.orderedEndpoint(); o != nil {
			if c.rng.IntN(2) == 0 {
				none := endpoints.OrderingNone
				c.update(o, "update --ordering none", endpoints.Patch{Ordering: &none})
			} else {
				c.burst(next, o.cur().Tenant, chaosStreams[c.rng.IntN(len(chaosStreams))], o.cur().Filter)
			}
			return
		}
		if ep.consumer.mode.Load() == modeHealthy && c.rng.IntN(2) == 0 {
			c.setMode(ep, modeFlaky)
		}
		stream := endpoints.OrderingStream
		c.update(ep, "update --ordering stream", endpoints.Patch{Ordering: &stream})
		if c.rng.IntN(4) > 0 {
			// At once: instances that have not claimed since still believe nothing ordered.
			c.burst(next, cur.Tenant, chaosStreams[c.rng.IntN(len(chaosStreams))], cur.Filter)
		}
	case r < 56 && cur.Enabled:
		c.commit(ep, ep.label+": disable", func(tx pgx.Tx) (string, error) {
			return ep.id, endpoints.Disable(c.ctx, tx, ep.id, "chaos")
		})
	case r < 56:
		c.commit(ep, ep.label+": enable", func(tx pgx.Tx) (string, error) {
			return ep.id, endpoints.Enable(c.ctx, tx, ep.id)
		})
	case r < 66:
		grace := chaosGraces[c.rng.IntN(len(chaosGraces))]
		scheme := cur.Scheme
		c.commit(ep, fmt.Sprintf("%s: rotate-secret --grace %v", ep.label, max(grace, 0)), func(tx pgx.Tx) (string, error) {
			_, err := endpoints.RotateSecret(c.ctx, tx, c.cipher, ep.id, c.secret(scheme), grace)
			return ep.id, err
		})
	case r < 70 && len(live) > 3:
		c.commit(ep, ep.label+": remove --pending dead-letter", func(tx pgx.Tx) (string, error) {
			_, err := endpoints.Remove(c.ctx, tx, ep.id, endpoints.PendingDeadLetter)
			return ep.id, err
		})
	case r < 88:
		c.setMode(ep, []int32{modeHealthy, modeFlaky, modeFlaky, modeOutage, modeSlow}[c.rng.IntN(5)])
	default:
		c.burst(next, cur.Tenant, chaosStreams[c.rng.IntN(len(chaosStreams))], cur.Filter)
	}
}

// pause is the schedule's pacing between steps: load shape, not synchronization.
func (c *chaos) pause(minMS, maxMS int) {
	time.Sleep(time.Duration(minMS+c.rng.IntN(maxMS-minMS+1)) * time.Millisecond)
}

func chaosSettings(t *testing.T) (uint64, time.Duration) {
	seed, duration := uint64(chaosDefaultSeed), chaosDefaultDuration
	if s := os.Getenv("FLUXHOOK_CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FLUXHOOK_CHAOS_SEED=%q: want an unsigned integer: %v", s, err)
		}
		seed = v
	}
	if s := os.Getenv("FLUXHOOK_CHAOS_DURATION"); s != "" {
		v, err := time.ParseDuration(s)
		if err != nil || v < 5*time.Second {
			t.Fatalf("FLUXHOOK_CHAOS_DURATION=%q: want a Go duration of at least 5s (%v)", s, err)
		}
		duration = v
	}
	return seed, duration
}

func TestChaosEndpoints(t *testing.T) {
	t.Parallel()
	seed, duration := chaosSettings(t)
	rerun := fmt.Sprintf("FLUXHOOK_CHAOS_SEED=%d FLUXHOOK_CHAOS_DURATION=%s go test -race -count=1 -run 'TestChaosEndpoints$' ./cmd/fluxhook/",
		seed, duration)
	t.Logf("seed %d, schedule of %s (rerun: %s)", seed, duration, rerun)

	ctx, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()
	closing, closeConsumers := context.WithCancel(context.Background())
	db := sqltest.NewMigrated(t)
	key := endpoints.GenerateKey()
	cipher, err := endpoints.NewCipher(key, "")
	if err != nil {
		t.Fatal(err)
	}
	c := &chaos{t: t, ctx: ctx, db: db, cipher: cipher, rng: rand.New(rand.NewPCG(seed, 1)), seed: seed, origin: time.Now(),
		rec: &chaosRecorder{seed: seed, closing: closing}, byID: map[string]*chaosEndpoint{}, byURL: map[string]*chaosConsumer{},
		closeConsumers: closeConsumers}
	// Registered before the consumers' servers, so that it runs after them: a failure shows
	// the seed and the schedule last, where CI's tail of the output keeps them.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d; run again with:\n  %s\nschedule (times from the test's start):%s", seed, rerun, c.schedule())
		}
	})
	c.env = func(app string) map[string]string {
		e := killableEnv(t, db.URL, "", app)
		delete(e, "WEBHOOK_URL") // managed endpoints only
		e["WEBHOOK_RETRY_SCHEDULE"] = "150ms,200ms,300ms,400ms,500ms,600ms"
		e["WEBHOOK_PERMANENT_STATUSES"] = "400" // the flaky consumer's 400s are dead-lettered at once
		e["WEBHOOK_ENCRYPTION_KEY"] = key
		e["WEBHOOK_POLL_INTERVAL_MS"] = "1000"
		return e
	}
	// What `fluxhook endpoints update --ordering stream` builds the first time.
	if _, err := fluxsql.EnsureStreamIndex(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}

	// One endpoint per tenant, and another of one; none ordered yet (see step).
	for _, tenant := range chaosTenants {
		c.add(tenant, endpoints.OrderingNone)
	}
	c.add(chaosTenants[c.rng.IntN(3)], endpoints.OrderingNone)
	for i := range 3 {
		c.startInstance(fmt.Sprintf("instance %d", i+1), fmt.Sprintf("fluxhook-chaos-%d", i+1))
	}
	for _, p := range c.procs {
		p.id = p.p.instanceID()
	}
	c.note("3 instances started")

	var next atomic.Int64
	prodCtx, stopProducer := context.WithCancel(ctx)
	produced := make(chan struct{})
	go c.produce(prodCtx, &next, produced)
	defer func() {
		stopProducer()
		<-produced
	}()

	victim := c.procs[c.rng.IntN(len(c.procs))]
	start := time.Now()
	killAt, restartAt := start.Add(duration*2/5), start.Add(duration*3/5)
	for time.Since(start) < duration {
		c.pause(100, 450)
		c.alive()
		switch {
		case !victim.dead && time.Now().After(killAt):
			// Struck while it holds rows (an event routed in memory, a delivery in flight), if it
			// comes to hold some within a few seconds; otherwise struck anyway.
			held, deadline := 0, time.Now().Add(5*time.Second)
			for time.Now().Before(deadline) {
				if held = queryInt(t, db, `SELECT count(*) FROM webhook_outbox WHERE leased_by = $1 AND NOT processed
					AND lease_until > now() + interval '1 second'`, victim.id); held > 0 {
					break
				}
				time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
			}
			before := time.Now()
			killInstance(t, db, victim.p, victim.app)
			victim.dead = true
			c.addStep(before, time.Now(), fmt.Sprintf("%s killed (SIGKILL), holding %d leased rows a moment before", victim.p.name, held))
		case victim.dead && restartAt.Before(time.Now()) && len(c.procs) == 3:
			p := c.startInstance(victim.p.name+" restarted", victim.app+"-restarted")
			p.id = p.p.instanceID()
			c.note(p.p.name)
		default:
			c.step(&next)
		}
	}
	stopProducer()
	<-produced
	for _, k := range c.byURL {
		k.mode.Store(modeHealthy)
	}
	c.note(fmt.Sprintf("schedule over: producer stopped after %d events; every consumer healthy", len(c.events)))

	// (d) nothing stuck: the outbox empties.
	deadline := time.Now().Add(chaosDrainWait)
	for {
		c.alive()
		if unprocessed(t, db) == 0 {
			break
		}
		if time.Now().After(deadline) {
			c.reportStuck()
			break
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
	c.note("drained")
	drained := !t.Failed()
	for _, p := range c.procs {
		if !p.dead && drained {
			p.p.stopCleanly()
		}
	}
	c.check()
}

// reportStuck names the rows left in the outbox after the drain's deadline.
func (c *chaos) reportStuck() {
	c.t.Helper()
	rows, err := c.db.Pool.Query(c.ctx, `SELECT id, delivery_id::text, coalesce(endpoint_id::text, ''), attempt,
		coalesce(leased_by, ''), created_at, coalesce(deferred_reason, ''), coalesce(order_key, 0), coalesce(stream_id, '')
		FROM webhook_outbox WHERE NOT processed ORDER BY id`)
	if err != nil {
		c.t.Fatalf("reading the stuck rows: %v", err)
	}
	var stuck []string
	for rows.Next() {
		var id, key int64
		var delivery, ep, leased, deferred, stream string
		var attempt int
		var created time.Time
		if err := rows.Scan(&id, &delivery, &ep, &attempt, &leased, &created, &deferred, &key, &stream); err != nil {
			c.t.Fatal(err)
		}
		label := ep
		if e := c.byID[ep]; e != nil {
			label = e.label
		}
		stuck = append(stuck, fmt.Sprintf("row %d delivery %s endpoint %s attempt %d leased_by %q due %s deferred %q order_key %d stream %q",
			id, delivery, label, attempt, leased, c.rel(created), deferred, key, stream))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		c.t.Fatalf("reading the stuck rows: %v", err)
	}
	c.t.Errorf("(d) STUCK: expected the outbox to empty within %s of healing every consumer; %d rows are still unprocessed: %s",
		chaosDrainWait, len(stuck), sample(stuck))
}

// chaosPair is one (event, endpoint) delivery as the database recorded it.
type chaosPair struct {
	ev        *chaosEvent
	ep        *chaosEndpoint
	delivered bool
	pending   bool
	statuses  []string
	leases    map[int]string // by attempt: the instance and claim that sent it
	deadWhy   []string
	orderKey  int64
	routedAt  time.Time // the earliest routed_at of its rows
	first2xx  *chaosRequest
}

type pairKey struct{ delivery, endpoint string }

// sentBy names the instance and claim that sent r's attempt, as the log records it.
func (p *chaosPair) sentBy(r *chaosRequest) string {
	n, _ := strconv.Atoi(r.Attempt)
	if by, ok := p.leases[n]; ok {
		return by
	}
	return "an instance whose settle of it the log lacks"
}

// check reads what the database and the consumers recorded and runs checks (a) to (e).
func (c *chaos) check() {
	t := c.t
	t.Helper()
	c.evMu.Lock()
	events := c.events
	if len(c.evErrs) > 0 {
		t.Errorf("%d enqueues failed: %s", len(c.evErrs), sample(c.evErrs))
	}
	c.evMu.Unlock()
	byDelivery := make(map[string]*chaosEvent, len(events))
	for _, ev := range events {
		ev.Step = c.stepAt(ev.Start)
		byDelivery[ev.DeliveryID] = ev
	}
	reqs := c.rec.all()

	// The events' routing rows.
	routings := map[string]int{}
	rows, err := c.db.Pool.Query(c.ctx, `SELECT delivery_id::text, coalesce(error, ''), processed_at, enqueued_at
		FROM webhook_delivery_log WHERE endpoint_id IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	var strange []string
	for rows.Next() {
		var id, msg string
		var at, enq time.Time
		if err := rows.Scan(&id, &msg, &at, &enq); err != nil {
			t.Fatal(err)
		}
		routings[id]++
		ev := byDelivery[id]
		if ev == nil {
			strange = append(strange, fmt.Sprintf("a routing row for delivery %s, which the test did not enqueue", id))
			continue
		}
		ev.routedAt, ev.enqueuedAt, ev.routingError = at, enq, msg
		if n, ok := strings.CutPrefix(msg, "routed to "); ok {
			ev.routedTo, _ = strconv.Atoi(strings.TrimSuffix(n, " endpoint(s)"))
		} else if msg != "no endpoint matched" {
			strange = append(strange, fmt.Sprintf("%s: routing row says %q", ev, msg))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	// Every delivery row, queued or logged.
	pairs := map[pairKey]*chaosPair{}
	pairOf := func(delivery, endpoint string) *chaosPair {
		k := pairKey{delivery, endpoint}
		if p := pairs[k]; p != nil {
			return p
		}
		p := &chaosPair{ev: byDelivery[delivery], ep: c.byID[endpoint]}
		if p.ev == nil || p.ep == nil {
			strange = append(strange, fmt.Sprintf("a delivery of %s to endpoint %s, which the test does not know", delivery, endpoint))
			return nil
		}
		pairs[k] = p
		return p
	}
	rows, err = c.db.Pool.Query(c.ctx, `SELECT delivery_id::text, endpoint_id::text, processed, coalesce(status_code, 0),
		coalesce(error, ''), routed_at, coalesce(order_key, 0), attempt, coalesce(leased_by, ''), coalesce(lease_token, 0)
		FROM webhook_deliveries WHERE endpoint_id IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var delivery, endpoint, msg string
		var processed bool
		var status, attempt int
		var key, token int64
		var routed *time.Time
		var leased string
		if err := rows.Scan(&delivery, &endpoint, &processed, &status, &msg, &routed, &key, &attempt, &leased, &token); err != nil {
			t.Fatal(err)
		}
		p := pairOf(delivery, endpoint)
		if p == nil {
			continue
		}
		p.pending = p.pending || !processed
		p.delivered = p.delivered || processed && status >= 200 && status <= 299
		p.statuses = append(p.statuses, fmt.Sprintf("attempt %d: %d %s", attempt, status, msg))
		if p.leases == nil {
			p.leases = map[int]string{}
		}
		p.leases[attempt] = fmt.Sprintf("%s's claim %d", c.instanceName(leased), token)
		if key != 0 {
			if p.orderKey != 0 && p.orderKey != key {
				strange = append(strange, fmt.Sprintf("%s to %s: order keys %d and %d", p.ev, p.ep.label, p.orderKey, key))
			}
			p.orderKey = key
		}
		if routed != nil && (p.routedAt.IsZero() || routed.Before(p.routedAt)) {
			p.routedAt = *routed
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = c.db.Pool.Query(c.ctx, `SELECT delivery_id::text, coalesce(endpoint_id::text, ''), reason FROM webhook_dead_letter`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var delivery, endpoint, reason string
		if err := rows.Scan(&delivery, &endpoint, &reason); err != nil {
			t.Fatal(err)
		}
		if endpoint == "" {
			strange = append(strange, fmt.Sprintf("delivery %s dead-lettered without an endpoint: %s", delivery, reason))
			continue
		}
		if p := pairOf(delivery, endpoint); p != nil {
			p.deadWhy = append(p.deadWhy, reason)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(strange) > 0 {
		t.Errorf("expected every routing row, delivery row and dead letter to be of an event the test enqueued and an endpoint it added, each event routed as \"routed to N endpoint(s)\" or \"no endpoint matched\"; %d are not: %s",
			len(strange), sample(strange))
	}

	// First 2xx per (event, endpoint), at any consumer of the endpoint.
	for _, r := range reqs {
		if !r.ok() {
			continue
		}
		p := pairs[pairKey{r.ID, r.Consumer.ep.id}]
		if p != nil && p.first2xx == nil {
			p.first2xx = r
		}
	}

	c.checkTenants(reqs, byDelivery, pairs)
	c.checkSignatures(reqs)
	c.checkOrder(pairs)
	c.checkSettled(events, routings, pairs)
	c.checkRouting(events, pairs)

	var delivered, dead, oks int
	for _, p := range pairs {
		if p.delivered {
			delivered++
		}
		if len(p.deadWhy) > 0 {
			dead++
		}
	}
	for _, r := range reqs {
		if r.ok() {
			oks++
		}
	}
	t.Logf("%d events, %d steps, %d endpoints, %d consumers; %d deliveries routed: %d delivered, %d dead-lettered; %d requests, %d answered 2xx",
		len(events), len(c.steps), len(c.eps), c.nConsumers, len(pairs), delivered, dead, len(reqs), oks)
}

// describe is a request for messages.
func (c *chaos) describe(r *chaosRequest) string {
	return fmt.Sprintf("request #%d (attempt %s, answered %d) at %s (step %d) to %s", r.Seq, r.Attempt, r.Status,
		c.rel(r.At), c.stepAt(r.At), r.Consumer)
}

// checkTenants is (a): a request reaches only consumers of its event's tenant.
func (c *chaos) checkTenants(reqs []*chaosRequest, byDelivery map[string]*chaosEvent, pairs map[pairKey]*chaosPair) {
	var bad []string
	stale := 0
	for _, r := range reqs {
		ev := byDelivery[r.ID]
		var body struct {
			Tenant *string `json:"tenant"`
		}
		if err := json.Unmarshal(r.Body, &body); err != nil || body.Tenant == nil {
			bad = append(bad, fmt.Sprintf("%s: a body without the event's tenant: %q", c.describe(r), r.Body))
			continue
		}
		if ev == nil {
			bad = append(bad, fmt.Sprintf("%s: delivery id %q, which the test did not enqueue (body %s)", c.describe(r), r.ID, r.Body))
			continue
		}
		if *body.Tenant != ev.Tenant {
			bad = append(bad, fmt.Sprintf("%s: body of tenant %s for %s", c.describe(r), chaosTenant(*body.Tenant), ev))
			continue
		}
		if ev.Tenant != r.Consumer.tenant {
			// Was it routed to the endpoint while the endpoint was the event's tenant's?
			routed := "no delivery row records its routing to the endpoint"
			if p := pairs[pairKey{r.ID, r.Consumer.ep.id}]; p != nil && !p.routedAt.IsZero() {
				routed = fmt.Sprintf("routed to %s by %s, while %s was not tenant %s's", p.ep.label, c.rel(p.routedAt), p.ep.label, chaosTenant(ev.Tenant))
				for _, st := range p.ep.possible(ev.Start, p.routedAt) {
					if st.Exists && st.Tenant == ev.Tenant {
						routed = fmt.Sprintf("routed to %s by %s, while %s was tenant %s's, and sent after its tenant changed",
							p.ep.label, c.rel(p.routedAt), p.ep.label, chaosTenant(ev.Tenant))
						stale++
						break
					}
				}
			}
			bad = append(bad, fmt.Sprintf("expected only tenant %s's events at %s; got %s (enqueued at %s, step %d) in %s; %s; %s's history:%s",
				chaosTenant(r.Consumer.tenant), r.Consumer, ev, c.rel(ev.Start), ev.Step, c.describe(r), routed, r.Consumer.ep.label,
				r.Consumer.ep.history(c, ev.Start, r.At)))
		}
	}
	c.report("(a) CROSS-TENANT", len(bad), fmt.Sprintf("requests reached a consumer of another tenant than their event's (%d of them deliveries routed while the endpoint was the event's tenant's)", stale), bad)
}

// checkSignatures is (b): every signature verifies with a secret valid for the endpoint when
// the request was signed.
func (c *chaos) checkSignatures(reqs []*chaosRequest) {
	var bad []string
	var lagged int
	var maxLag time.Duration
	for _, r := range reqs {
		why, lag := c.verify(r)
		if why != "" {
			bad = append(bad, why)
		}
		if lag > 0 {
			lagged++
			maxLag = max(maxLag, lag)
		}
	}
	c.t.Logf("(b) %d requests were signed by a secret that had stopped being valid before their signing second, at most %s before (allowed: %s)",
		lagged, maxLag, chaosSignLag)
	c.report("(b) SIGNATURE", len(bad), "requests were not signed with a secret valid for their endpoint when they were signed", bad)
}

// signedWith reports whether r's signature headers, in st's scheme, verify with the secrets
// st held at from (the previous one while in its grace).
func signedWith(r *chaosRequest, st epState, from time.Time) bool {
	secrets := []string{st.Secret}
	if st.Prev != "" && st.PrevUntil.After(from) {
		secrets = append(secrets, st.Prev)
	}
	switch {
	case st.Scheme == endpoints.SchemeFluxora && r.Header.Get(sign.HeaderSignature) != "":
		keys := make([][]byte, len(secrets))
		for i, s := range secrets {
			keys[i] = []byte(s)
		}
		return sign.VerifyFluxora(r.Header, r.Body, r.At, 0, keys...) == nil
	case st.Scheme == endpoints.SchemeStandard && r.Header.Get(sign.HeaderWebhookSignature) != "":
		ts, err := strconv.ParseInt(r.Header.Get(sign.HeaderWebhookTimestamp), 10, 64)
		if err != nil {
			return false
		}
		// Every signature the header lists must be one of these secrets' (a rotation sends
		// two), and the Standard Webhooks library must accept the request.
		var want []string
		verified := false
		for _, s := range secrets {
			wh, err := standardwebhooks.NewWebhook(s)
			if err != nil {
				return false
			}
			sig, err := wh.Sign(r.ID, time.Unix(ts, 0), r.Body)
			if err != nil {
				return false
			}
			want = append(want, sig)
			verified = verified || wh.Verify(r.Body, r.Header) == nil
		}
		for _, sig := range strings.Fields(r.Header.Get(sign.HeaderWebhookSignature)) {
			if !slices.Contains(want, sig) {
				return false
			}
		}
		return verified
	}
	return false
}

// verify returns why r's signature is not one its endpoint could have made when r was signed
// ("" when it is), and how long before r's signing second the secret that signed it was last
// valid (0 when it was valid then).
func (c *chaos) verify(r *chaosRequest) (string, time.Duration) {
	ep := r.Consumer.ep
	tsHeader := r.Header.Get(sign.HeaderTimestamp)
	scheme := endpoints.SchemeFluxora
	if r.Header.Get(sign.HeaderSignature) == "" {
		tsHeader, scheme = r.Header.Get(sign.HeaderWebhookTimestamp), endpoints.SchemeStandard
	}
	ts, err := strconv.ParseInt(tsHeader, 10, 64)
	if err != nil {
		return fmt.Sprintf("%s: no usable signing time (headers %v)", c.describe(r), r.Header), 0
	}
	signed := time.Unix(ts, 0)
	valid := func(lag time.Duration) bool {
		from := signed.Add(-lag)
		for _, st := range ep.possible(from, r.At) {
			if st.Exists && signedWith(r, st, from) {
				return true
			}
		}
		return false
	}
	if valid(0) {
		return "", 0
	}
	if valid(chaosSignLag) {
		lo, hi := time.Duration(0), chaosSignLag
		for hi-lo > 10*time.Millisecond {
			if mid := (lo + hi) / 2; valid(mid) {
				hi = mid
			} else {
				lo = mid
			}
		}
		return "", hi
	}
	from := signed.Add(-chaosSignLag)
	// Which of the endpoint's secrets, ever, did sign it?
	by := "none of the endpoint's secrets, ever"
	for _, h := range ep.hist {
		if h.State.Exists && signedWith(r, epState{Scheme: h.State.Scheme, Secret: h.State.Secret}, from) {
			by = fmt.Sprintf("the secret of step %d (%s)", h.Step, h.State)
			break
		}
	}
	return fmt.Sprintf("expected a %s signature (signed at %s, second %d) by a secret %s held between %s and its arrival; it was signed by %s; %s; %s's history:%s",
		scheme, c.rel(signed), ts, ep.label, c.rel(from), by, c.describe(r), ep.label, ep.history(c, from, r.At)), 0
}

// checkOrder is (c): on an endpoint that orders streams, the first 2xx of each stream's
// deliveries routed with an order key come in key order, for every two such deliveries while
// the endpoint ordered throughout (from the first one's routing to the later 2xx).
func (c *chaos) checkOrder(pairs map[pairKey]*chaosPair) {
	type streamKey struct {
		ep     *chaosEndpoint
		stream string
	}
	streams := map[streamKey][]*chaosPair{}
	for _, p := range pairs {
		if p.orderKey == 0 {
			continue
		}
		if p.ev.Stream == "" || p.orderKey != p.ev.ID {
			c.t.Errorf("(c) %s to %s carries order key %d, expected its event id %d and a stream", p.ev, p.ep.label, p.orderKey, p.ev.ID)
			continue
		}
		if p.first2xx != nil {
			streams[streamKey{p.ep, p.ev.Stream}] = append(streams[streamKey{p.ep, p.ev.Stream}], p)
		}
	}
	// One example per stream (its first), since one stale claim puts many pairs out of order.
	var bad []string
	violations := 0
	compared, keyed := 0, 0
	for _, list := range streams {
		keyed += len(list)
	}
	for sk, list := range streams {
		slices.SortFunc(list, func(a, b *chaosPair) int { return int(a.orderKey - b.orderKey) })
		for i, early := range list {
			for _, late := range list[i+1:] {
				if early.routedAt.IsZero() || late.routedAt.IsZero() {
					continue // (d) reports rows without a routing time
				}
				from := early.routedAt
				if late.routedAt.Before(from) {
					from = late.routedAt
				}
				// Out of order when the later key's first 2xx came first: by then, the earlier
				// delivery was still undelivered (and not dead-lettered: a 2xx came after).
				to := late.first2xx.At
				if !sk.ep.orderedThroughout(from, to) {
					continue
				}
				compared++
				if late.first2xx.Seq < early.first2xx.Seq {
					if violations++; len(bad) > 0 && strings.HasPrefix(bad[len(bad)-1], fmt.Sprintf("%s stream %s:", sk.ep.label, sk.stream)) {
						continue
					}
					bad = append(bad, fmt.Sprintf("%s stream %s: expected the first 2xx of %s (key %d, routed %s) before that of %s (key %d, routed %s); seen %s, sent by %s, first, then %s, sent by %s; ordered throughout (%s to %s); history:%s",
						sk.ep.label, sk.stream, early.ev, early.orderKey, c.rel(early.routedAt), late.ev, late.orderKey, c.rel(late.routedAt),
						c.describe(late.first2xx), late.sentBy(late.first2xx), c.describe(early.first2xx), early.sentBy(early.first2xx),
						c.rel(from), c.rel(to), sk.ep.history(c, from, to)))
				}
			}
		}
	}
	c.report("(c) ORDER", violations, fmt.Sprintf("pairs of ordered deliveries (of %d compared), in %d streams, had their first 2xx out of key order; the first pair of each stream", compared, len(bad)), bad)
	switch {
	case compared == 0:
		c.t.Logf("(c) compared no two ordered deliveries (%d delivered with an order key): no stream was ordered long enough", keyed)
	default:
		c.t.Logf("(c) compared %d pairs of the %d deliveries delivered with an order key", compared, keyed)
	}
}

// orderedThroughout: no change that left the endpoint unordered (ordering none, disabled,
// removed) may have been in effect at any moment of [from, to]. The state at from is ordered:
// the deliveries compared carry order keys, which the routing statement sets only then.
func (e *chaosEndpoint) orderedThroughout(from, to time.Time) bool {
	for _, h := range e.hist {
		if !h.State.ordered() && !h.After.Before(from) && !h.Before.After(to) {
			return false
		}
	}
	return true
}

// checkSettled is (d): each event routed once, to as many endpoints as it has deliveries;
// every delivery delivered or dead-lettered with a reason, none pending; a delivery the log
// calls delivered was answered 2xx by a consumer of its endpoint.
func (c *chaos) checkSettled(events []*chaosEvent, routings map[string]int, pairs map[pairKey]*chaosPair) {
	perEvent := map[*chaosEvent]int{}
	var unsettled, routing, phantom []string
	for _, p := range pairs {
		perEvent[p.ev]++
		switch {
		case p.pending:
			unsettled = append(unsettled, fmt.Sprintf("%s to %s: still pending (%s)", p.ev, p.ep.label, strings.Join(p.statuses, "; ")))
		case !p.delivered && len(p.deadWhy) == 0:
			unsettled = append(unsettled, fmt.Sprintf("expected %s to %s delivered or dead-lettered; its rows: %s, and no dead letter",
				p.ev, p.ep.label, strings.Join(p.statuses, "; ")))
		case !p.delivered && slices.ContainsFunc(p.deadWhy, func(s string) bool { return strings.TrimSpace(s) == "" }):
			unsettled = append(unsettled, fmt.Sprintf("%s to %s: dead-lettered without a reason", p.ev, p.ep.label))
		case p.delivered && p.first2xx == nil:
			phantom = append(phantom, fmt.Sprintf("%s to %s: logged delivered (%s), but no consumer of %s answered it 2xx",
				p.ev, p.ep.label, strings.Join(p.statuses, "; "), p.ep.label))
		}
	}
	for _, ev := range events {
		switch n := routings[ev.DeliveryID]; {
		case n == 0:
			routing = append(routing, fmt.Sprintf("LOST: expected %s (enqueued at %s, step %d) to be routed; the delivery log has no routing row for it",
				ev, c.rel(ev.Start), ev.Step))
		case n > 1:
			routing = append(routing, fmt.Sprintf("expected %s routed once; routed %d times", ev, n))
		case ev.routedTo != perEvent[ev]:
			routing = append(routing, fmt.Sprintf("%s: its routing row says %q, but %d endpoints have deliveries or dead letters of it",
				ev, ev.routingError, perEvent[ev]))
		}
	}
	c.report("(d) UNSETTLED", len(unsettled), "routed deliveries are neither delivered nor dead-lettered with a reason", unsettled)
	c.report("(d) ROUTED", len(routing), "events were not routed exactly once to the deliveries they have", routing)
	c.report("(d) PHANTOM", len(phantom), "deliveries are logged delivered without a 2xx from their endpoint's consumers", phantom)
}

// checkRouting is (e): an event's deliveries go to endpoints that matched it at some moment
// between its enqueue and its routing row, and to every endpoint that matched it throughout.
func (c *chaos) checkRouting(events []*chaosEvent, pairs map[pairKey]*chaosPair) {
	var wrong, missed []string
	for _, ev := range events {
		if ev.routedAt.IsZero() {
			continue // (d) reported it
		}
		for _, ep := range c.eps {
			states := ep.possible(ev.Start, ev.routedAt)
			some, all := false, true
			for _, st := range states {
				m := st.matches(ev, ev.enqueuedAt)
				some, all = some || m, all && m
			}
			p := pairs[pairKey{ev.DeliveryID, ep.id}]
			switch {
			case p != nil && !some:
				wrong = append(wrong, fmt.Sprintf("%s (enqueued %s, routed by %s) went to %s, which matched it at no moment in between; history:%s",
					ev, c.rel(ev.Start), c.rel(ev.routedAt), ep.label, ep.history(c, ev.Start, ev.routedAt)))
			case p == nil && all && len(states) > 0:
				missed = append(missed, fmt.Sprintf("%s (enqueued %s, routed by %s: %q) never went to %s, which matched it throughout; history:%s",
					ev, c.rel(ev.Start), c.rel(ev.routedAt), ev.routingError, ep.label, ep.history(c, ev.Start, ev.routedAt)))
			}
		}
	}
	c.report("(e) MISROUTED", len(wrong), "deliveries went to an endpoint that never matched their event meanwhile", wrong)
	c.report("(e) NOT ROUTED", len(missed), "events did not reach an endpoint that matched them from enqueue to routing", missed)
}

// report fails the test with one message for a check: how many, what was expected, and
// examples of what was seen (sorted, so that a rerun shows the same kind first).
func (c *chaos) report(check string, n int, what string, examples []string) {
	c.t.Helper()
	if n == 0 {
		return
	}
	slices.Sort(examples)
	shown := examples
	if len(shown) > chaosExamples {
		shown = shown[:chaosExamples]
	}
	c.t.Errorf("%s: %d %s (seed %d); first %d:\n\t%s", check, n, what, c.seed, len(shown), strings.Join(shown, "\n\t"))
}
