package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// Corrupt state: an endpoint's key holds something the scripts never write (a key of another
// type, a field they cannot have written, a key without expiry, window entries from the far
// future). The store must never fail on it, answer as if the endpoint had no state, repair the
// key, and from the next call on behave exactly as on clean keys: the breaker opens at the
// threshold, the limiter admits its limit.

// corruptParams: a breaker that opens at the third failure and a limiter of 3 per second.
var corruptParams = gate.Params{Threshold: 3, Reset: time.Minute, RetryRPS: 3, Window: time.Second,
	ProbeTimeout: 30 * time.Second}.WithDefaults()

// which key of an endpoint a corruption writes.
const (
	breakerKey = iota
	probeKey
	windowKey
	retriesKey
	slotKey
)

type corruption struct {
	name  string
	key   int
	write func(ctx context.Context, c redis.UniversalClient, key string, now time.Time) error
}

func str(v string, ttl time.Duration) func(context.Context, redis.UniversalClient, string, time.Time) error {
	return func(ctx context.Context, c redis.UniversalClient, key string, _ time.Time) error {
		return c.Set(ctx, key, v, ttl).Err()
	}
}

func list(ctx context.Context, c redis.UniversalClient, key string, _ time.Time) error {
	return c.RPush(ctx, key, "a", "b", "c").Err()
}

func set(ctx context.Context, c redis.UniversalClient, key string, _ time.Time) error {
	return c.SAdd(ctx, key, "a", "b").Err()
}

func zset(ctx context.Context, c redis.UniversalClient, key string, _ time.Time) error {
	return c.ZAdd(ctx, key, redis.Z{Score: 1, Member: "a"}, redis.Z{Score: 2, Member: "b"}).Err()
}

func hash(ctx context.Context, c redis.UniversalClient, key string, _ time.Time) error {
	return c.HSet(ctx, key, "state", "open", "token", "x").Err()
}

// fields writes a breaker hash with the given fields, expiring after ttl (0: never).
func fields(ttl time.Duration, kv ...string) func(context.Context, redis.UniversalClient, string, time.Time) error {
	return func(ctx context.Context, c redis.UniversalClient, key string, now time.Time) error {
		args := make([]any, len(kv))
		for i, v := range kv {
			if v == "<in a century>" {
				v = strconv.FormatInt(now.Add(100*365*24*time.Hour).UnixMicro(), 10)
			}
			args[i] = v
		}
		if err := c.HSet(ctx, key, args...).Err(); err != nil {
			return err
		}
		if ttl > 0 {
			return c.PExpire(ctx, key, ttl).Err()
		}
		return nil
	}
}

// scores writes window entries with non-numeric members at the given scores (µs).
func scores(score func(now time.Time) float64, n int) func(context.Context, redis.UniversalClient, string, time.Time) error {
	return func(ctx context.Context, c redis.UniversalClient, key string, now time.Time) error {
		zs := make([]redis.Z, n)
		for i := range zs {
			zs[i] = redis.Z{Score: score(now), Member: fmt.Sprintf("garbage-%d-\xff", i)}
		}
		return c.ZAdd(ctx, key, zs...).Err()
	}
}

var corruptions = []corruption{
	{"clean", breakerKey, nil}, // the control: every assertion holds on clean keys too

	{"breaker/string", breakerKey, str("not a hash", time.Hour)},
	{"breaker/string without expiry", breakerKey, str("open", 0)},
	{"breaker/list", breakerKey, list},
	{"breaker/set", breakerKey, set},
	{"breaker/zset", breakerKey, zset},
	{"breaker/state banana", breakerKey, fields(time.Hour, "state", "banana", "failures", "0", "open_until", "0")},
	{"breaker/failures x", breakerKey, fields(time.Hour, "state", "closed", "failures", "x", "open_until", "0")},
	{"breaker/open_until soon", breakerKey, fields(time.Hour, "state", "open", "failures", "0", "open_until", "soon")},
	{"breaker/all garbage", breakerKey, fields(0, "state", "banana", "failures", "x", "open_until", "soon")},
	{"breaker/negative failures", breakerKey, fields(time.Hour, "state", "closed", "failures", "-1000", "open_until", "0")},
	{"breaker/fractional failures", breakerKey, fields(time.Hour, "state", "closed", "failures", "1.5", "open_until", "0")},
	{"breaker/failures nan", breakerKey, fields(time.Hour, "state", "closed", "failures", "nan", "open_until", "0")},
	{"breaker/failures inf", breakerKey, fields(time.Hour, "state", "closed", "failures", "inf", "open_until", "0")},
	{"breaker/failures 1e400", breakerKey, fields(time.Hour, "state", "closed", "failures", "1e400", "open_until", "0")},
	{"breaker/failures huge", breakerKey, fields(time.Hour, "state", "closed", "failures", "123456789012345678901234567890", "open_until", "0")},
	{"breaker/half_open without open_until", breakerKey, fields(time.Hour, "state", "half_open")},
	{"breaker/failures only", breakerKey, fields(time.Hour, "failures", "2")},
	{"breaker/open for a century without expiry", breakerKey, fields(0, "state", "open", "failures", "0", "open_until", "<in a century>")},

	{"probe/hash", probeKey, hash},
	{"probe/list", probeKey, list},
	{"probe/zset", probeKey, zset},

	{"window/string", windowKey, str("not a zset", time.Hour)},
	{"window/hash", windowKey, hash},
	{"window/list", windowKey, list},
	{"window/set", windowKey, set},
	{"window/scores +inf", windowKey, scores(func(time.Time) float64 { return math.Inf(1) }, 10)},
	{"window/scores in an hour", windowKey, scores(func(now time.Time) float64 { return float64(now.Add(time.Hour).UnixMicro()) }, 10)},
	{"window/scores -inf", windowKey, scores(func(time.Time) float64 { return math.Inf(-1) }, 10)},

	{"retries/string", retriesKey, str("not a zset", time.Hour)},
	{"retries/hash", retriesKey, hash},
	{"retries/list", retriesKey, list},
	{"retries/scores +inf", retriesKey, scores(func(time.Time) float64 { return math.Inf(1) }, 10)},
	{"retries/scores in an hour", retriesKey, scores(func(now time.Time) float64 { return float64(now.Add(time.Hour).UnixMicro()) }, 10)},
	{"retries/scores -inf", retriesKey, scores(func(time.Time) float64 { return math.Inf(-1) }, 10)},

	{"slot/hash", slotKey, hash},
	{"slot/zset", slotKey, zset},
	{"slot/not a number", slotKey, str("soon", time.Hour)},
	{"slot/negative", slotKey, str("-5", time.Hour)},
	{"slot/fractional", slotKey, str("1.5", time.Hour)},
	{"slot/in a minute without expiry", slotKey, at(time.Minute, 0)},
	{"slot/in a century expiring in an hour", slotKey, at(100*365*24*time.Hour, time.Hour)},
}

// at writes a slot key holding the time after from now (µs), expiring after ttl (0: never).
func at(after, ttl time.Duration) func(context.Context, redis.UniversalClient, string, time.Time) error {
	return func(ctx context.Context, c redis.UniversalClient, key string, now time.Time) error {
		return c.Set(ctx, key, strconv.FormatInt(now.Add(after).UnixMicro(), 10), ttl).Err()
	}
}

// TestCorruptKeys writes each corruption, makes a first call (Decide, Record or Inspect), and
// checks that no call fails, that the first answers as for an endpoint with no state, and that
// the endpoint then behaves exactly as a clean one: the limiter admits 3 of 5 retries and spaces
// the other 2, the breaker stays closed for 2 failures and opens at the 3rd, and the keys are
// of their types again, with an expiry.
func TestCorruptKeys(t *testing.T) {
	t.Parallel()
	for _, c := range corruptions {
		for _, first := range []string{"Decide", "Record", "Inspect"} {
			t.Run(c.name+"/"+first+" first", func(t *testing.T) {
				t.Parallel()
				s := redistest.Open(t, redistest.Prefix(t))
				ep := endpoint("https://corrupt.example/" + c.name)
				corrupt(t, s, ep, c)
				cs := &checker{t: t, s: s, hash: ep.Hash}

				failures := 0
				switch first {
				case "Record":
					cs.record(gate.Failure)
					failures = 1
					cs.inspect(gate.Closed, failures)
				case "Inspect":
					cs.inspect(gate.Closed, 0)
				}
				cs.limiter() // the first call when first == "Decide"
				for failures < corruptParams.Threshold-1 {
					cs.record(gate.Failure)
					failures++
					cs.inspect(gate.Closed, failures)
					cs.expect(cs.decide(false, false), gate.Allow, gate.Allow)
				}
				if trans := cs.record(gate.Failure); !slices.Equal(trans, []gate.Transition{{Hash: ep.Hash, From: gate.Closed, To: gate.Open}}) {
					t.Fatalf("failure %d of %d: transitions %v, want closed>open", failures+1, corruptParams.Threshold, trans)
				}
				cs.inspect(gate.Open, 0)
				cs.expect(cs.decide(false, true), gate.DeferOpen, gate.DeferOpen)

				cb, _, rl := s.Keys(ep.Hash)
				retries, slot := s.RetryKeys(ep.Hash)
				cs.key(cb, "hash")
				cs.key(rl, "zset")
				cs.key(retries, "zset")
				cs.key(slot, "string")
			})
		}
	}
}

// TestCorruptProbe: a probe key that no decide.lua wrote (another type, no expiry, an expiry
// no probe gets) does not hold the half-open circuit: the first row checked probes, and its
// success closes the circuit, exactly as with no probe key.
func TestCorruptProbe(t *testing.T) {
	t.Parallel()
	probes := []corruption{
		{"clean", probeKey, nil},
		{"hash", probeKey, hash},
		{"list", probeKey, list},
		{"zset", probeKey, zset},
		{"set", probeKey, set},
		{"string without expiry", probeKey, str("someone", 0)},
		{"string expiring in ten years", probeKey, str("someone", 10*365*24*time.Hour)},
	}
	for _, c := range probes {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Open(t, redistest.Prefix(t))
			ep := endpoint("https://probe.example/" + c.name)
			p := corruptParams
			p.Reset = 100 * time.Millisecond
			cs := &checker{t: t, s: s, hash: ep.Hash, p: p}
			for range p.Threshold {
				cs.record(gate.Failure)
			}
			cs.inspect(gate.Open, 0)
			redistest.WaitFor(t, s.Client(), p.Reset)
			corrupt(t, s, ep, c)
			if snap := cs.snapshot(); snap.State != gate.Open || snap.ProbeHeld {
				t.Fatalf("after the reset: %+v, want open (reset passed) with no probe held", snap)
			}

			dec, token := cs.decideToken(false, true, true)
			rows := cs.expect(dec, gate.Probe, gate.DeferProbe, gate.DeferProbe)
			for _, r := range rows[1:] {
				if r.Delay <= 0 || r.Delay > p.ProbeTimeout {
					t.Fatalf("row deferred behind the probe for %s, want until it expires, at most %s", r.Delay, p.ProbeTimeout)
				}
			}
			if !slices.Equal(dec.Transitions, []gate.Transition{{Hash: ep.Hash, From: gate.Open, To: gate.HalfOpen}}) {
				t.Fatalf("transitions %v, want open>half_open", dec.Transitions)
			}
			if snap := cs.snapshot(); snap.State != gate.HalfOpen || !snap.ProbeHeld {
				t.Fatalf("after the probe was granted: %+v", snap)
			}
			trans, err := s.Record(context.Background(), p, []gate.EndpointResult{{Hash: ep.Hash, Rows: []gate.RowResult{{Result: gate.Success, Token: token}}}})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(trans, []gate.Transition{{Hash: ep.Hash, From: gate.HalfOpen, To: gate.Closed}}) {
				t.Fatalf("probe success: transitions %v, want half_open>closed", trans)
			}
			cs.inspect(gate.Closed, 0)
			_, probe, _ := s.Keys(ep.Hash)
			cs.key(probe, "none")
		})
	}
}

// TestCorruptWindowHugeCount: a window holding far more entries than the limit, with scores
// that are fine (now) and members the script never writes, admits retries only within their
// reserve and refuses the others for at most about a window (as a full window would), is
// trimmed to the limit by the first admitted attempt, and one window later admits the limit
// again.
func TestCorruptWindowHugeCount(t *testing.T) {
	t.Parallel()
	s := redistest.Open(t, redistest.Prefix(t))
	ep := endpoint("https://huge-window.example/")
	ctx := context.Background()
	_, _, rl := s.Keys(ep.Hash)
	// Written inside Redis (fast), scored by its clock at that moment.
	fill := redis.NewScript(`
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
for i = 1, tonumber(ARGV[1]), 1000 do
  local args = {}
  for j = i, i + 999 do
    args[#args + 1] = now
    args[#args + 1] = 'junk:' .. j
  end
  redis.call('ZADD', KEYS[1], unpack(args))
end
return redis.call('ZCARD', KEYS[1])`)
	if n, err := fill.Run(ctx, s.Client(), []string{rl}, 100000).Int(); err != nil || n != 100000 {
		t.Fatalf("filling the window: %d entries, %v", n, err)
	}
	// A window long enough that the entries are still in it when the store reads them, however
	// loaded the machine running the tests.
	p := corruptParams
	p.Window = 3 * time.Second
	cs := &checker{t: t, s: s, hash: ep.Hash, p: p}
	// One first attempt (counted, never refused) and three retries: the two of the reserve
	// (ceil(3 × 0.5)) admitted, the third refused.
	rows := cs.expect(cs.decide(false, true, true, true),
		gate.Allow, gate.Allow, gate.Allow, gate.DeferRateLimit)
	w := p.Window
	if r := rows[3]; r.Delay <= 0 || r.Delay > w+time.Microsecond {
		t.Fatalf("refused retry deferred for %s, want at most %s", r.Delay, w)
	}
	if n := s.Client().ZCard(ctx, rl).Val(); n > int64(p.RetryRPS) {
		t.Fatalf("window holds %d entries after an admitted attempt, want at most the limit %d", n, p.RetryRPS)
	}
	cs.key(rl, "zset")
	redistest.WaitFor(t, s.Client(), w)
	cs.limiter()
}

// TestCorruptKeysThroughGate: with all three keys of an endpoint of the wrong type, the gate
// decides (no fail-open: newGate fails the test on one), and the breaker opens at the
// threshold.
func TestCorruptKeysThroughGate(t *testing.T) {
	t.Parallel()
	s := redistest.Open(t, redistest.Prefix(t))
	ep := endpoint("https://corrupt-gate.example/")
	for _, c := range []corruption{{"", breakerKey, list}, {"", probeKey, zset}, {"", windowKey, hash}} {
		corrupt(t, s, ep, c)
	}
	g := newGate(t, s, corruptParams)
	ctx := context.Background()
	for i := range corruptParams.Threshold {
		rows := batch(2, ep)
		g.Check(ctx, rows)
		for _, d := range rows {
			if d.Outcome.Kind != delivery.Undecided {
				t.Fatalf("check %d: row held (%s) before the threshold", i+1, d.Outcome.Reason)
			}
		}
		rows[0].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503}
		g.Record(ctx, rows[:1])
	}
	rows := batch(2, ep)
	g.Check(ctx, rows)
	for _, d := range rows {
		if d.Outcome.Kind != delivery.Defer || d.Outcome.Reason != gate.DeferOpen.String() {
			t.Fatalf("after %d failures: %s %q, want deferred by the open circuit", corruptParams.Threshold, d.Outcome.Kind, d.Outcome.Reason)
		}
	}
}

// corrupt writes c's value over ep's key (replacing whatever is there).
func corrupt(t *testing.T, s *redisstore.Store, ep *delivery.Endpoint, c corruption) {
	t.Helper()
	if c.write == nil {
		return
	}
	ctx := context.Background()
	keys := make([]string, 5)
	keys[breakerKey], keys[probeKey], keys[windowKey] = s.Keys(ep.Hash)
	keys[retriesKey], keys[slotKey] = s.RetryKeys(ep.Hash)
	now, err := redistest.Now(ctx, s.Client())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Client().Del(ctx, keys[c.key]).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.write(ctx, s.Client(), keys[c.key], now); err != nil {
		t.Fatalf("writing the corrupt value: %v", err)
	}
}

// checker calls the store directly, so that an error is seen rather than turned into a
// fail-open, and fails the test on any.
type checker struct {
	t    *testing.T
	s    *redisstore.Store
	hash string
	p    gate.Params // corruptParams when zero
	seq  int
}

func (c *checker) params() gate.Params {
	if c.p.Threshold == 0 {
		return corruptParams
	}
	return c.p
}

func (c *checker) decideToken(retry ...bool) (gate.EndpointDecision, string) {
	c.t.Helper()
	c.seq++
	token := "corrupt-test-" + strconv.Itoa(c.seq)
	decs, err := c.s.Decide(context.Background(), c.params(), []gate.EndpointCheck{{Hash: c.hash, Token: token, Retry: retry}})
	if err != nil {
		c.t.Fatalf("Decide: %v", err)
	}
	if len(decs) != 1 || decs[0].Err != nil {
		c.t.Fatalf("Decide: %+v", decs)
	}
	return decs[0], token
}

func (c *checker) decide(retry ...bool) gate.EndpointDecision {
	c.t.Helper()
	dec, _ := c.decideToken(retry...)
	return dec
}

// expect checks the verdicts of dec's rows and returns them.
func (c *checker) expect(dec gate.EndpointDecision, want ...gate.Verdict) []gate.RowDecision {
	c.t.Helper()
	got := make([]gate.Verdict, len(dec.Rows))
	for i, r := range dec.Rows {
		got[i] = r.Verdict
	}
	if !slices.Equal(got, want) {
		c.t.Fatalf("verdicts %v, want %v", got, want)
	}
	return dec.Rows
}

// limiter checks a clean window: of 5 retries 3 are admitted and the other 2 deferred about one
// window, spaced by window/limit.
func (c *checker) limiter() {
	c.t.Helper()
	rows := c.expect(c.decide(true, true, true, true, true),
		gate.Allow, gate.Allow, gate.Allow, gate.DeferRateLimit, gate.DeferRateLimit)
	w := c.params().Window
	step := w / time.Duration(c.params().RetryRPS)
	for k, r := range rows[3:] {
		// The script rounds each delay up to the microsecond.
		if want := w + time.Duration(k)*step; r.Delay < want || r.Delay > want+time.Microsecond {
			c.t.Fatalf("refused retry %d deferred for %s, want %s (a full window from now, then spaced)", k+1, r.Delay, want)
		}
	}
}

func (c *checker) record(r gate.Result) []gate.Transition {
	c.t.Helper()
	trans, err := c.s.Record(context.Background(), c.params(), []gate.EndpointResult{{Hash: c.hash, Rows: []gate.RowResult{{Result: r}}}})
	if err != nil {
		c.t.Fatalf("Record: %v", err)
	}
	return trans
}

func (c *checker) snapshot() gate.Snapshot {
	c.t.Helper()
	snaps, err := c.s.Inspect(context.Background(), []string{c.hash})
	if err != nil {
		c.t.Fatalf("Inspect: %v", err)
	}
	return snaps[0]
}

func (c *checker) inspect(state gate.State, failures int) {
	c.t.Helper()
	snap := c.snapshot()
	if snap.State != state || snap.Failures != failures || snap.ProbeHeld || (state == gate.Closed) != (snap.OpenFor == 0) {
		c.t.Fatalf("Inspect: %+v, want %s with %d failures and no probe", snap, state, failures)
	}
}

// key checks that key is of type typ and, unless absent, expires.
func (c *checker) key(key, typ string) {
	c.t.Helper()
	ctx := context.Background()
	if got := c.s.Client().Type(ctx, key).Val(); got != typ {
		c.t.Fatalf("key %q is a %s, want a %s", key, got, typ)
	}
	if typ != "none" {
		if ttl := c.s.Client().PTTL(ctx, key).Val(); ttl <= 0 {
			c.t.Fatalf("key %q does not expire (PTTL %s)", key, ttl)
		}
	}
}

// TestForgedOpenUntilIsBoundedByTheReset: a breaker opened by something other than the scripts
// (anyone who may write to Redis), well-formed and with an expiry, but open for a day, holds
// the endpoint's rows back for at most this configuration's reset, after which a probe goes:
// what the gate believes is bounded by its own settings, not by what it reads.
func TestForgedOpenUntilIsBoundedByTheReset(t *testing.T) {
	t.Parallel()
	s := redistest.Open(t, redistest.Prefix(t))
	c := &checker{t: t, s: s, hash: "forged-open-until", p: gate.Params{Threshold: 3, Reset: 500 * time.Millisecond,
		RetryRPS: 3, Window: time.Second, ProbeTimeout: 30 * time.Second}.WithDefaults()}
	ep := &delivery.Endpoint{Hash: c.hash}
	corrupt(t, s, ep, corruption{"open for a day", breakerKey,
		func(ctx context.Context, cl redis.UniversalClient, key string, now time.Time) error {
			return fields(48*time.Hour, "state", "open", "failures", "3",
				"open_until", strconv.FormatInt(now.Add(24*time.Hour).UnixMicro(), 10))(ctx, cl, key, now)
		}})
	dec := c.decide(true)
	if v := dec.Rows[0]; v.Verdict != gate.DeferOpen || v.Delay > c.p.Reset {
		t.Fatalf("a row behind a circuit forged open for a day: %v for %s, want deferred for at most the reset (%s)", v.Verdict, v.Delay, c.p.Reset)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		dec = c.decide(true)
		if dec.Rows[0].Verdict == gate.Probe {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no probe 10 s after a reset of %s: the forged open_until held (last verdict %v)", c.p.Reset, dec.Rows[0].Verdict)
		}
		time.Sleep(50 * time.Millisecond) // polling the store's own clock: no event to wait on
	}
}

// TestCorruptFront: the key of the last place promised to a returning retry (FrontKey,
// '<µs>:<n>') holding something no script wrote is no promise: a returning retry refused on a full window is
// promised the window's first free place (a window on, the window having filled at once), as
// with no key, and the key is rewritten as a time that expires.
func TestCorruptFront(t *testing.T) {
	t.Parallel()
	for _, c := range []corruption{
		{"clean", slotKey, nil},
		{"hash", slotKey, hash},
		{"zset", slotKey, zset},
		{"not a number", slotKey, str("soon", time.Hour)},
		{"negative", slotKey, str("-5", time.Hour)},
		{"in a minute without expiry", slotKey, at(time.Minute, 0)},
		{"in a century expiring in an hour", slotKey, at(100*365*24*time.Hour, time.Hour)},
		{"a place without its count", slotKey, at(time.Minute, time.Hour)},
		{"a count of none", slotKey, func(ctx context.Context, c redis.UniversalClient, key string, now time.Time) error {
			return c.Set(ctx, key, strconv.FormatInt(now.Add(time.Minute).UnixMicro(), 10)+":0", time.Hour).Err()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Open(t, redistest.Prefix(t))
			ep := endpoint("https://corrupt.example/front/" + c.name)
			ctx := context.Background()
			if c.write != nil {
				now, err := redistest.Now(ctx, s.Client())
				if err != nil {
					t.Fatal(err)
				}
				if err := c.write(ctx, s.Client(), s.FrontKey(ep.Hash), now); err != nil {
					t.Fatal(err)
				}
			}
			p := corruptParams
			decs, err := s.Decide(ctx, p, []gate.EndpointCheck{{Hash: ep.Hash, Token: "front-test",
				Retry: []bool{true, true, true, true}, Returning: []bool{false, false, false, true}}})
			if err != nil || len(decs) != 1 || decs[0].Err != nil {
				t.Fatalf("Decide: %v %+v", err, decs)
			}
			rows := decs[0].Rows
			if r := rows[3]; r.Verdict != gate.DeferRateLimit || r.Delay < p.Window || r.Delay > p.Window+time.Microsecond {
				t.Fatalf("returning retry: %+v, want deferred a window (%s), to the window's first free place", r, p.Window)
			}
			cs := &checker{t: t, s: s, hash: ep.Hash}
			cs.key(s.FrontKey(ep.Hash), "string")
		})
	}
}
