package gate_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/memstore"
)

// fakeStore answers from functions and records what it was asked.
type fakeStore struct {
	mu      sync.Mutex
	decide  func(ctx context.Context, checks []gate.EndpointCheck) ([]gate.EndpointDecision, error)
	record  func(results []gate.EndpointResult) ([]gate.Transition, error)
	checks  [][]gate.EndpointCheck
	results [][]gate.EndpointResult
}

func (f *fakeStore) Decide(ctx context.Context, _ gate.Params, checks []gate.EndpointCheck) ([]gate.EndpointDecision, error) {
	f.mu.Lock()
	f.checks = append(f.checks, checks)
	fn := f.decide
	f.mu.Unlock()
	if fn != nil {
		return fn(ctx, checks)
	}
	out := make([]gate.EndpointDecision, len(checks))
	for i, c := range checks {
		out[i].Rows = make([]gate.RowDecision, len(c.Retry))
	}
	return out, nil
}

func (f *fakeStore) Record(_ context.Context, _ gate.Params, results []gate.EndpointResult) ([]gate.Transition, error) {
	f.mu.Lock()
	f.results = append(f.results, results)
	fn := f.record
	f.mu.Unlock()
	if fn != nil {
		return fn(results)
	}
	return nil, nil
}

func (f *fakeStore) Inspect(context.Context, []string) ([]gate.Snapshot, error) { return nil, nil }

func (f *fakeStore) calls() (decides, records int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.checks), len(f.results)
}

func ep(url string) *delivery.Endpoint {
	return &delivery.Endpoint{URL: url, Hash: strings.Repeat(url[len(url)-1:], 64)}
}

func rows(e *delivery.Endpoint, attempts ...int) []*delivery.Delivery {
	out := make([]*delivery.Delivery, len(attempts))
	for i, a := range attempts {
		out[i] = &delivery.Delivery{ID: int64(i + 1), Attempt: a, Endpoint: e}
	}
	return out
}

func newGate(t *testing.T, s gate.Store, p gate.Params, h gate.Hooks) *gate.BreakerGate {
	t.Helper()
	g, err := gate.NewBreakerGate(s, p, h)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

var errDown = errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")

func TestCheckGroupsByEndpointInOneCall(t *testing.T) {
	t.Parallel()
	a, b := ep("https://a.example/1"), ep("https://b.example/2")
	f := &fakeStore{decide: func(_ context.Context, checks []gate.EndpointCheck) ([]gate.EndpointDecision, error) {
		return []gate.EndpointDecision{
			{Rows: []gate.RowDecision{{Verdict: gate.Probe}, {Verdict: gate.DeferProbe, Delay: time.Second}, {Verdict: gate.DeferProbe, Delay: time.Second}}},
			{Rows: []gate.RowDecision{{Verdict: gate.Allow}, {Verdict: gate.DeferRateLimit, Delay: 300 * time.Millisecond}}},
		}, nil
	}}
	g := newGate(t, f, gate.Params{Threshold: 1}, gate.Hooks{})
	batch := []*delivery.Delivery{
		{ID: 1, Attempt: 1, Endpoint: a}, {ID: 2, Attempt: 2, Endpoint: b}, {ID: 3, Attempt: 3, Endpoint: a},
		{ID: 4, Attempt: 2, Endpoint: b}, {ID: 5, Attempt: 1, Endpoint: a},
	}
	g.Check(context.Background(), batch)
	if len(f.checks) != 1 {
		t.Fatalf("%d store calls for one batch", len(f.checks))
	}
	checks := f.checks[0]
	if len(checks) != 2 || checks[0].Hash != a.Hash || checks[1].Hash != b.Hash {
		t.Fatalf("checks not grouped by endpoint in batch order: %+v", checks)
	}
	if got := checks[0].Retry; len(got) != 3 || got[0] || !got[1] || got[2] {
		t.Fatalf("retry flags for a: %v, want [false true false]", got)
	}
	if checks[0].Token == "" || checks[0].Token == checks[1].Token {
		t.Fatal("each check needs its own token")
	}
	if batch[0].GateToken != checks[0].Token || batch[0].Outcome.Kind != delivery.Undecided {
		t.Fatalf("the probe row: token %q, outcome %s", batch[0].GateToken, batch[0].Outcome.Kind)
	}
	for _, i := range []int{2, 4} {
		if o := batch[i].Outcome; o.Kind != delivery.Defer || o.Delay != time.Second || o.Reason != gate.DeferProbe.String() {
			t.Fatalf("row %d: %+v", i+1, o)
		}
	}
	if batch[1].Outcome.Kind != delivery.Undecided || batch[1].GateToken != "" {
		t.Fatal("allowed row changed")
	}
	if o := batch[3].Outcome; o.Kind != delivery.Defer || o.Delay != 300*time.Millisecond || o.Reason != "retry rate limit" {
		t.Fatalf("rate-limited row: %+v", o)
	}
}

func TestDisabledGateNeverCallsTheStore(t *testing.T) {
	t.Parallel()
	f := &fakeStore{}
	g := newGate(t, f, gate.Params{Threshold: 0, RetryRPS: -1}, gate.Hooks{})
	batch := rows(ep("https://a.example/1"), 1, 2, 3)
	g.Check(context.Background(), batch)
	settleAll(batch, delivery.Outcome{Kind: delivery.Retry, Status: 503})
	g.Record(context.Background(), batch)
	if d, r := f.calls(); d != 0 || r != 0 {
		t.Fatalf("store called %d/%d times", d, r)
	}
	// Threshold 0 with the limiter on: decisions, but nothing to record.
	g = newGate(t, f, gate.Params{Threshold: 0}, gate.Hooks{})
	g.Check(context.Background(), rows(ep("https://a.example/1"), 2))
	g.Record(context.Background(), batch)
	if d, r := f.calls(); d != 1 || r != 0 {
		t.Fatalf("store called %d/%d times, want one decision and no record", d, r)
	}
}

func settleAll(batch []*delivery.Delivery, o delivery.Outcome) {
	for _, d := range batch {
		d.Outcome = o
	}
}

func TestRecordTellsTheBreakerWhatEachOutcomeMeans(t *testing.T) {
	t.Parallel()
	f := &fakeStore{}
	g := newGate(t, f, gate.Params{Threshold: 3}, gate.Hooks{})
	a := ep("https://a.example/1")
	batch := []*delivery.Delivery{
		{Endpoint: a, Outcome: delivery.Outcome{Kind: delivery.Delivered, Status: 204}},
		{Endpoint: a, Outcome: delivery.Outcome{Kind: delivery.Retry, Status: 503}},
		{Endpoint: a, Outcome: delivery.Outcome{Kind: delivery.Retry, Error: "timeout"}},
		// settle turned an exhausted retry into Permanent: still a retryable failure
		{Endpoint: a, Outcome: delivery.Outcome{Kind: delivery.Permanent, Status: 429, Reason: "attempts exhausted"}},
		{Endpoint: a, Outcome: delivery.Outcome{Kind: delivery.Permanent, Error: "connection refused", Reason: "attempts exhausted"}},
		// permanent answers and invalid rows: nothing to tell
		{Endpoint: a, Outcome: delivery.Outcome{Kind: delivery.Permanent, Status: 404}},
		{Endpoint: a, Outcome: delivery.Outcome{Kind: delivery.Permanent, Reason: "invalid row: event_type is empty"}},
		// never attempted: nothing, unless it holds the probe
		{Endpoint: a, Outcome: delivery.Outcome{Kind: delivery.Defer, Delay: time.Second}},
		{Endpoint: a, Outcome: delivery.Outcome{Kind: delivery.Release}},
		{Endpoint: a, GateToken: "tok-1", Outcome: delivery.Outcome{Kind: delivery.Release, Error: "shutdown"}},
		{Endpoint: a, GateToken: "tok-2", Outcome: delivery.Outcome{Kind: delivery.Permanent, Status: 410}},
		{Endpoint: nil, Outcome: delivery.Outcome{Kind: delivery.Retry, Status: 500}},
	}
	g.Record(context.Background(), batch)
	if len(f.results) != 1 || len(f.results[0]) != 1 {
		t.Fatalf("record calls %v", f.results)
	}
	got := f.results[0][0].Rows
	want := []gate.RowResult{
		{Result: gate.Success}, {Result: gate.Failure}, {Result: gate.Failure}, {Result: gate.Failure}, {Result: gate.Failure},
		{Result: gate.NotAttempted, Token: "tok-1"}, {Result: gate.Neutral, Token: "tok-2"},
	}
	if len(got) != len(want) {
		t.Fatalf("results %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("result %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestFailOpenThenRecover runs in a synctest bubble: the gate's StoreRetry pause and the
// store timeout are timers, and the bubble's clock moves them without waiting.
func TestFailOpenThenRecover(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		down := true
		f := &fakeStore{}
		f.decide = func(_ context.Context, checks []gate.EndpointCheck) ([]gate.EndpointDecision, error) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				return nil, errDown
			}
			out := make([]gate.EndpointDecision, len(checks))
			for i, c := range checks {
				for range c.Retry {
					out[i].Rows = append(out[i].Rows, gate.RowDecision{Verdict: gate.DeferOpen, Delay: time.Minute})
				}
			}
			return out, nil
		}
		core, logs := observer.New(zapcore.InfoLevel)
		failOpen := 0
		g := newGate(t, f, gate.Params{Threshold: 1, StoreRetry: time.Second}, gate.Hooks{
			OnFailOpen: func() { failOpen++ },
			Logger:     zap.New(core),
		})
		a := ep("https://a.example/1")
		ctx := context.Background()

		batch := rows(a, 1, 2, 3)
		g.Check(ctx, batch)
		for _, d := range batch {
			if d.Outcome.Kind != delivery.Undecided {
				t.Fatal("a row was held while the store is down")
			}
		}
		if failOpen != 3 {
			t.Fatalf("fail-open counted %d, want one per row (3)", failOpen)
		}
		// Within StoreRetry the gate does not call the store again.
		for range 10 {
			g.Check(ctx, rows(a, 1))
			time.Sleep(50 * time.Millisecond)
		}
		if d, _ := f.calls(); d != 1 {
			t.Fatalf("store called %d times within StoreRetry, want 1", d)
		}
		if failOpen != 13 {
			t.Fatalf("fail-open counted %d, want 13", failOpen)
		}
		time.Sleep(time.Second)
		g.Check(ctx, rows(a, 1)) // tries again, still down
		if d, _ := f.calls(); d != 2 {
			t.Fatalf("store called %d times after StoreRetry, want 2", d)
		}

		mu.Lock()
		down = false
		mu.Unlock()
		time.Sleep(time.Second)
		batch = rows(a, 1)
		g.Check(ctx, batch)
		if batch[0].Outcome.Kind != delivery.Defer {
			t.Fatal("the gate did not use the store again after it recovered")
		}
		if n := logs.FilterMessageSnippet("gate store unavailable").Len(); n != 1 {
			t.Fatalf("outage logged %d times, want once", n)
		}
		if n := logs.FilterMessage("gate store available again").Len(); n != 1 {
			t.Fatalf("recovery logged %d times, want once", n)
		}
	})
}

func TestStoreTimeoutBoundsCheck(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{decide: func(ctx context.Context, _ []gate.EndpointCheck) ([]gate.EndpointDecision, error) {
			<-ctx.Done() // a Redis that never answers
			return nil, ctx.Err()
		}}
		failOpen := 0
		g := newGate(t, f, gate.Params{Threshold: 1, StoreTimeout: 200 * time.Millisecond}, gate.Hooks{OnFailOpen: func() { failOpen++ }})
		start := time.Now()
		g.Check(context.Background(), rows(ep("https://a.example/1"), 1, 1))
		if took := time.Since(start); took != 200*time.Millisecond {
			t.Fatalf("Check took %s, want the store timeout (200ms)", took)
		}
		if failOpen != 2 {
			t.Fatalf("fail-open counted %d, want 2", failOpen)
		}
	})
}

func TestPartialDecisionFailsOpenOnlyThatEndpoint(t *testing.T) {
	t.Parallel()
	a, b := ep("https://a.example/1"), ep("https://b.example/2")
	f := &fakeStore{decide: func(_ context.Context, checks []gate.EndpointCheck) ([]gate.EndpointDecision, error) {
		return []gate.EndpointDecision{
			{Rows: []gate.RowDecision{{Verdict: gate.DeferOpen, Delay: time.Minute}}},
			{Err: errDown},
		}, nil
	}}
	failOpen := 0
	g := newGate(t, f, gate.Params{Threshold: 1}, gate.Hooks{OnFailOpen: func() { failOpen++ }})
	batch := []*delivery.Delivery{{Attempt: 1, Endpoint: a}, {Attempt: 1, Endpoint: b}, {Attempt: 1, Endpoint: b}}
	g.Check(context.Background(), batch)
	if batch[0].Outcome.Kind != delivery.Defer || batch[1].Outcome.Kind != delivery.Undecided || batch[2].Outcome.Kind != delivery.Undecided {
		t.Fatalf("outcomes %s %s %s", batch[0].Outcome.Kind, batch[1].Outcome.Kind, batch[2].Outcome.Kind)
	}
	if failOpen != 2 {
		t.Fatalf("fail-open counted %d, want 2", failOpen)
	}
}

// TestOpeningLoggedOnce: a settled batch of many failures opens the circuit once: one
// transition, one log line, which names the endpoint by its URL's origin (the hash too at
// debug), never by the URL's path or query, where tokens live.
func TestOpeningLoggedOnce(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zapcore.DebugLevel)
	var trans []string
	g := newGate(t, memstore.New(memstore.Options{}), gate.Params{Threshold: 3, Reset: time.Minute}, gate.Hooks{
		OnTransition: func(from, to string) { trans = append(trans, from+">"+to) },
		Logger:       zap.New(core),
	})
	a := ep("https://a.example/secret-path?token=x")
	ctx := context.Background()
	for range 3 {
		batch := rows(a, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
		settleAll(batch, delivery.Outcome{Kind: delivery.Retry, Status: 503})
		g.Record(ctx, batch)
	}
	batch := rows(a, 1, 2, 3)
	g.Check(ctx, batch)
	if len(trans) != 1 || trans[0] != "closed>open" {
		t.Fatalf("transitions %v, want one closed>open", trans)
	}
	opened := logs.FilterMessage("circuit breaker opened").All()
	if len(opened) != 1 {
		t.Fatalf("opening logged %d times", len(opened))
	}
	f := opened[0].ContextMap()
	if opened[0].Level != zapcore.WarnLevel || f["origin"] != "https://a.example" || f["endpoint_hash"] != a.Hash || f["reset_ms"] != int64(60000) {
		t.Fatalf("opening log: %v %v, want a warning with origin https://a.example, endpoint_hash and reset_ms 60000", opened[0].Level, f)
	}
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			if s, ok := v.(string); ok && (strings.Contains(s, "secret-path") || strings.Contains(s, "token")) {
				t.Fatalf("log %q field %s holds the URL", e.Message, k)
			}
		}
	}
	if logs.Len() != 1 {
		t.Fatalf("%d log lines for one transition and 33 rows: %v", logs.Len(), logs.All())
	}
}

func TestParams(t *testing.T) {
	t.Parallel()
	p := gate.Params{}.WithDefaults()
	if p.Breaker() || !p.Limiter() || p.RetryRPS != 10 || p.Reset != 5*time.Minute || p.Window != time.Second || p.ProbeTimeout != 30*time.Second {
		t.Fatalf("defaults: %+v", p)
	}
	if _, err := gate.NewBreakerGate(&fakeStore{}, gate.Params{Threshold: -1}, gate.Hooks{}); err == nil ||
		!strings.Contains(err.Error(), "WEBHOOK_CIRCUIT_BREAKER_THRESHOLD") {
		t.Fatalf("negative threshold: %v", err)
	}
	if _, err := gate.NewBreakerGate(nil, gate.Params{}, gate.Hooks{}); err == nil {
		t.Fatal("nil store accepted")
	}
	if p.RetryShare != 0.5 || p.RetryReserve() != 5 {
		t.Fatalf("default retry share %v, reserve %d; want 0.5 and 5", p.RetryShare, p.RetryReserve())
	}
	for _, share := range []float64{-0.5, 1.01, 2, math.NaN(), math.Inf(1)} {
		if _, err := gate.NewBreakerGate(&fakeStore{}, gate.Params{RetryShare: share}, gate.Hooks{}); err == nil ||
			!strings.Contains(err.Error(), "WEBHOOK_RETRY_SHARE") {
			t.Fatalf("retry share %v: %v, want an error naming WEBHOOK_RETRY_SHARE", share, err)
		}
	}
	for _, share := range []float64{0.001, 0.5, 1} {
		if _, err := gate.NewBreakerGate(&fakeStore{}, gate.Params{RetryShare: share}, gate.Hooks{}); err != nil {
			t.Fatalf("retry share %v refused: %v", share, err)
		}
	}
	for _, tc := range []struct {
		rps   int
		share float64
		want  int
	}{
		{10, 0, 5}, {10, 0.5, 5}, {10, 0.25, 3}, {10, 0.7, 7}, {10, 0.3, 3}, {3, 0.5, 2}, {1, 0.5, 1},
		{10, 0.01, 1}, {10, 1, 10}, {7, 1, 7}, {100, 0.07, 7}, {-1, 0.5, 0}, {10, 3, 5},
	} {
		if got := (gate.Params{RetryRPS: tc.rps, RetryShare: tc.share}).RetryReserve(); got != tc.want {
			t.Errorf("RetryRPS %d, RetryShare %v: reserve %d, want %d", tc.rps, tc.share, got, tc.want)
		}
	}
}

// TestOnClosed: the hook is called once per closing the store reports from Record, after
// OnTransition, with the endpoint's hash, and for no other transition.
func TestOnClosed(t *testing.T) {
	t.Parallel()
	a, b := ep("https://a.example/1"), ep("https://b.example/2")
	f := &fakeStore{record: func([]gate.EndpointResult) ([]gate.Transition, error) {
		return []gate.Transition{
			{Hash: a.Hash, From: gate.HalfOpen, To: gate.Closed},
			{Hash: b.Hash, From: gate.HalfOpen, To: gate.Open},
			{Hash: b.Hash, From: gate.Closed, To: gate.Open},
		}, nil
	}}
	var calls []string
	g := newGate(t, f, gate.Params{Threshold: 1}, gate.Hooks{
		OnTransition: func(from, to string) { calls = append(calls, from+">"+to) },
		OnClosed:     func(hash string) { calls = append(calls, "closed "+hash) },
	})
	batch := rows(a, 1)
	settleAll(batch, delivery.Outcome{Kind: delivery.Delivered, Status: 200})
	g.Record(context.Background(), batch)
	want := []string{"half_open>closed", "closed " + a.Hash, "half_open>open", "closed>open"}
	if !slices.Equal(calls, want) {
		t.Fatalf("hook calls %v, want %v", calls, want)
	}
}

// TestCancelledCheckIsNotAnOutage: a batch cancelled by a forced shutdown fails the store
// call, but the store is not at fault: no fail-open count, no outage, no pause.
func TestCancelledCheckIsNotAnOutage(t *testing.T) {
	t.Parallel()
	f := &fakeStore{decide: func(ctx context.Context, checks []gate.EndpointCheck) ([]gate.EndpointDecision, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return []gate.EndpointDecision{{Rows: make([]gate.RowDecision, len(checks[0].Retry))}}, nil
	}}
	core, logs := observer.New(zapcore.InfoLevel)
	failOpen := 0
	g := newGate(t, f, gate.Params{Threshold: 1}, gate.Hooks{OnFailOpen: func() { failOpen++ }, Logger: zap.New(core)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g.Check(ctx, rows(ep("https://a.example/1"), 1))
	g.Check(context.Background(), rows(ep("https://a.example/1"), 1))
	if d, _ := f.calls(); d != 2 || failOpen != 0 || logs.Len() != 0 {
		t.Fatalf("store calls %d (want 2), fail-open %d, logs %d", d, failOpen, logs.Len())
	}
}
