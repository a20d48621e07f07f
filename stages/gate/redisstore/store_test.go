package redisstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// counter counts the store's round trips by op, through the hook the dispatcher's
// fluxora_webhook_gate_store_round_trips_total is fed by (Store.CountRoundTrips).
type counter struct {
	mu  sync.Mutex
	ops map[redisstore.Op]int64
}

// countRoundTrips installs a counter on s.
func countRoundTrips(s *redisstore.Store) *counter {
	c := &counter{ops: map[redisstore.Op]int64{}}
	s.CountRoundTrips(func(op redisstore.Op) {
		c.mu.Lock()
		c.ops[op]++
		c.mu.Unlock()
	})
	return c
}

// of returns the round trips made for op since the last reset.
func (c *counter) of(op redisstore.Op) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[op]
}

// roundTrips returns every round trip since the last reset, whatever its op.
func (c *counter) roundTrips() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, v := range c.ops {
		n += v
	}
	return n
}

func (c *counter) reset() {
	c.mu.Lock()
	clear(c.ops)
	c.mu.Unlock()
}

func endpoint(url string) *delivery.Endpoint {
	sum := sha256.Sum256([]byte(url))
	return &delivery.Endpoint{URL: url, Hash: hex.EncodeToString(sum[:])}
}

// batch returns n rows spread over eps, every third one a retry.
func batch(n int, eps ...*delivery.Endpoint) []*delivery.Delivery {
	out := make([]*delivery.Delivery, n)
	for i := range out {
		out[i] = &delivery.Delivery{ID: int64(i + 1), Attempt: 1 + i%3/2, Endpoint: eps[i%len(eps)]}
	}
	return out
}

func newGate(t testing.TB, s gate.Store, p gate.Params) *gate.BreakerGate {
	t.Helper()
	p.StoreTimeout = 10 * time.Second
	g, err := gate.NewBreakerGate(s, p, gate.Hooks{OnFailOpen: func() { t.Errorf("gate failed open") }})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestOneRoundTripPerBatch: a claimed batch of 100 rows over 3 endpoints is decided with one
// round trip, and its settled outcomes recorded with one more; after Redis loses its script
// cache, the first batch costs one extra round trip (EVAL), and then one again.
func TestOneRoundTripPerBatch(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	s, err := redisstore.Open(srv.URL(), redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	c := countRoundTrips(s)
	g := newGate(t, s, gate.Params{Threshold: 5, RetryRPS: 1000, Reset: time.Minute})
	eps := []*delivery.Endpoint{endpoint("https://a.example/"), endpoint("https://b.example/"), endpoint("https://c.example/")}
	ctx := context.Background()

	check := func(want int64, when string) []*delivery.Delivery {
		t.Helper()
		rows := batch(100, eps...)
		c.reset()
		g.Check(ctx, rows)
		if got := c.roundTrips(); got != want || c.of(redisstore.OpDecide) != want {
			t.Fatalf("%s: Check of 100 rows over 3 endpoints took %d round trips (%d counted as decide), want %d", when, got, c.of(redisstore.OpDecide), want)
		}
		return rows
	}
	// Warm up the connection (its handshake is not a batch's cost).
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.of(redisstore.OpOther); got != 1 || c.roundTrips() != 1 {
		t.Fatalf("a PING on a new connection counted as %d round trips (%d other), want 1 other: the handshake is not a round trip of ours", c.roundTrips(), got)
	}
	check(2, "first batch after start (EVALSHA answered NOSCRIPT, then EVAL)")
	rows := check(1, "cached scripts")
	for i, d := range rows {
		if d.Outcome.Kind != delivery.Undecided {
			t.Fatalf("row %d held: %q", i, d.Outcome.Reason)
		}
		d.Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503}
	}
	c.reset()
	g.Record(ctx, rows)
	if got := c.of(redisstore.OpRecord); got != 2 || c.roundTrips() != got {
		// record.lua is not cached yet either
		t.Fatalf("first Record took %d round trips, want 2 (EVALSHA, then EVAL)", got)
	}
	c.reset()
	g.Record(ctx, rows)
	if got := c.of(redisstore.OpRecord); got != 1 || c.roundTrips() != got {
		t.Fatalf("Record of 100 rows over 3 endpoints took %d round trips, want 1", got)
	}
	// The breakers are open now: every row is deferred, still in one round trip.
	rows = check(1, "open circuits")
	for i, d := range rows {
		if d.Outcome.Kind != delivery.Defer {
			t.Fatalf("row %d not deferred by the open circuit", i)
		}
	}
	if err := s.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	check(2, "after SCRIPT FLUSH")
	check(1, "scripts cached again")
	c.reset()
	if _, err := s.Inspect(ctx, []string{eps[0].Hash, eps[1].Hash}); err != nil {
		t.Fatal(err)
	}
	if got := c.of(redisstore.OpInspect); got < 1 || c.roundTrips() != got {
		t.Fatalf("Inspect counted %d round trips of %d as inspect, want all of them", got, c.roundTrips())
	}
}

// TestKeys checks the key names, that every key expires, and that no URL is stored.
func TestKeys(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	s := redistest.Open(t, prefix)
	reset := time.Minute
	g := newGate(t, s, gate.Params{Threshold: 1, Reset: reset, RetryRPS: 5, ProbeTimeout: 30 * time.Second})
	url := "https://consumer.example/hook?token=secret-in-url"
	ep := endpoint(url)
	ctx := context.Background()

	rows := batch(6, ep) // four first attempts and two retries, all within the limit of 5 and the reserve of 3
	g.Check(ctx, rows)
	rows[0].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 503}
	g.Record(ctx, rows[:1])

	cb, probe, rl := s.Keys(ep.Hash)
	retries, slot := s.RetryKeys(ep.Hash)
	front := s.FrontKey(ep.Hash)
	all := []string{cb, probe, rl, retries, slot, front}
	for _, k := range all {
		if !strings.HasPrefix(k, prefix) || !strings.Contains(k, "{"+ep.Hash+"}") {
			t.Fatalf("key %q: want the prefix and the full hash in braces", k)
		}
	}
	for k, want := range map[string]string{
		cb:      "webhook_cb:{",
		probe:   "webhook_cb_probe:{",
		rl:      "webhook_rl:{",
		retries: "webhook_rl_retry:{",
		slot:    "webhook_rl_slot:{",
		front:   "webhook_rl_front:{",
	} {
		if want = prefix + want + ep.Hash + "}"; k != want {
			t.Fatalf("key %q, want %q", k, want)
		}
	}
	client := s.Client()
	// The cluster slot of every key is the hash's.
	hashSlot := redisSlot(ep.Hash)
	for _, k := range all {
		if redisSlot(k) != hashSlot {
			t.Fatalf("key %q is not in the endpoint's cluster slot", k)
		}
	}

	// The breaker opened: take the rate-limit keys alone on a second endpoint, with retries
	// refused so that a slot is handed out.
	ep2 := endpoint(url + "&other")
	rows2 := batch(12, ep2)
	for _, d := range rows2 {
		d.Attempt = 2
	}
	g.Check(ctx, rows2)
	if d := rows2[len(rows2)-1]; d.Outcome.Kind != delivery.Defer {
		t.Fatalf("the 12th retry against a limit of 5 was not deferred: %s", d.Outcome.Kind)
	}
	lastDelay := rows2[len(rows2)-1].Outcome.Delay
	// A retry back from its deferral and refused again is promised a place (the front key).
	back := batch(1, ep2)
	back[0].Attempt, back[0].DeferredBy = 2, gate.DeferRateLimit.String()
	if g.Check(ctx, back); back[0].Outcome.Kind != delivery.Defer {
		t.Fatalf("a returning retry against a full window was not deferred: %s", back[0].Outcome.Kind)
	}
	_, _, rl2 := s.Keys(ep2.Hash)
	retries2, slot2 := s.RetryKeys(ep2.Hash)
	front2 := s.FrontKey(ep2.Hash)

	keys, err := client.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	want := []string{cb, rl, retries, rl2, retries2, slot2, front2} // no probe yet; no slot for ep
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	for _, k := range keys {
		ttl, err := client.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > gate.StateTTL+reset {
			t.Fatalf("key %q has TTL %s: every key must expire, within %s", k, ttl, gate.StateTTL+reset)
		}
		dump, err := client.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(dump, "consumer.example") || strings.Contains(dump, "secret-in-url") || strings.Contains(k, "example") {
			t.Fatalf("key %q stores the endpoint URL", k)
		}
	}
	for _, k := range []string{rl, retries, rl2, retries2} {
		if ttl := client.PTTL(ctx, k).Val(); ttl > 2*time.Second {
			t.Fatalf("rate-limit key %q TTL %s, want about the window", k, ttl)
		}
		if n := client.ZCard(ctx, k).Val(); n < 1 || n > 5 {
			t.Fatalf("rate-limit key %q holds %d entries, want 1 to the limit (5)", k, n)
		}
	}
	// The slot key expires a window and a second after the last slot handed out.
	if ttl := client.PTTL(ctx, slot2).Val(); ttl < lastDelay || ttl > lastDelay+2*time.Second+time.Millisecond {
		t.Fatalf("slot key TTL %s, want a window and a second after the last slot (%s from now)", ttl, lastDelay)
	}
	if ttl := client.PTTL(ctx, cb).Val(); ttl < reset {
		t.Fatalf("open breaker TTL %s, shorter than the reset time", ttl)
	}
}

// redisSlot is the Redis Cluster key slot (CRC16 of the hash tag, mod 16384).
func redisSlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

// TestFailOpenAndRecovery: with Redis down the gate allows every row and counts it; when a
// Redis answers on the same address again, the gate uses it without a restart.
func TestFailOpenAndRecovery(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	s, err := redisstore.Open(srv.URL(), redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	var failOpen atomic.Int64
	g, err := gate.NewBreakerGate(s, gate.Params{Threshold: 1, Reset: time.Minute, RetryRPS: -1, StoreRetry: 50 * time.Millisecond, StoreTimeout: 2 * time.Second},
		gate.Hooks{OnFailOpen: func() { failOpen.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	ep := endpoint("https://down.example/")
	ctx := context.Background()
	fail := func() {
		rows := batch(1, ep)
		rows[0].Outcome = delivery.Outcome{Kind: delivery.Retry, Error: "connection refused"}
		g.Record(ctx, rows)
	}
	fail()
	rows := batch(3, ep)
	g.Check(ctx, rows)
	if rows[0].Outcome.Kind != delivery.Defer || failOpen.Load() != 0 {
		t.Fatalf("with Redis up the breaker did not open (outcome %s, fail-open %d)", rows[0].Outcome.Kind, failOpen.Load())
	}

	srv.Stop()
	start := time.Now()
	rows = batch(3, ep)
	g.Check(ctx, rows)
	for _, d := range rows {
		if d.Outcome.Kind != delivery.Undecided {
			t.Fatalf("with Redis down a row was held: %s", d.Outcome.Kind)
		}
	}
	if n := failOpen.Load(); n != 3 {
		t.Fatalf("fail-open counted %d rows, want 3", n)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("failing open took %s", took)
	}
	fail() // best effort: lost, no panic, no wait

	srv.Start() // a new, empty Redis on the same port (no persistence)
	deadline := time.Now().Add(5 * time.Second)
	for {
		fail()
		rows = batch(1, ep)
		g.Check(ctx, rows)
		if rows[0].Outcome.Kind == delivery.Defer {
			break // the breaker works again, on the new Redis
		}
		if time.Now().After(deadline) {
			t.Fatal("the gate did not use Redis again after it came back")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPartialFailure: an endpoint whose script fails is allowed (fail open) while the others
// in the same batch are decided.
func TestPartialFailure(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	s := redistest.Open(t, prefix)
	var failOpen atomic.Int64
	g, err := gate.NewBreakerGate(s, gate.Params{Threshold: 1, Reset: time.Minute, RetryRPS: -1, StoreTimeout: 10 * time.Second},
		gate.Hooks{OnFailOpen: func() { failOpen.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	good, broken := endpoint("https://good.example/"), endpoint("https://broken.example/")
	ctx := context.Background()
	for _, ep := range []*delivery.Endpoint{good, broken} {
		rows := batch(1, ep)
		rows[0].Outcome = delivery.Outcome{Kind: delivery.Retry, Status: 500}
		g.Record(ctx, rows)
	}
	// The broken endpoint's script now fails (its Cluster node unreachable, or Redis refusing
	// it, as it does a script that writes once maxmemory is reached): a hook replaces its
	// answer with an error. (A key of the wrong type no longer fails a script: see
	// corrupt_test.go.)
	cb, _, _ := s.Keys(broken.Hash)
	s.Client().AddHook(failKey(cb))

	rows := batch(4, good, broken)
	g.Check(ctx, rows)
	for _, d := range rows {
		want := delivery.Defer
		if d.Endpoint == broken {
			want = delivery.Undecided
		}
		if d.Outcome.Kind != want {
			t.Fatalf("row to %s: %s, want %s", d.Endpoint.URL, d.Outcome.Kind, want)
		}
	}
	if n := failOpen.Load(); n != 2 {
		t.Fatalf("fail-open counted %d rows, want the 2 to the broken endpoint", n)
	}
}

// failKey is a go-redis hook that fails every pipelined command naming key.
type failKey string

func (f failKey) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f failKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (f failKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if slices.Contains(cmd.Args(), any(string(f))) {
				cmd.SetErr(errors.New("OOM command not allowed when used memory > 'maxmemory'"))
			}
		}
		return err
	}
}

func TestNewClient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url  string
		kind string // "client", "cluster", "failover", or "" for an error
	}{
		{"redis://localhost:6379/0", "client"},
		{"redis://user:pw@localhost/2?dial_timeout=3s&pool_size=5", "client"},
		{"rediss://cache.example:6380", "client"},
		{"unix:///run/redis.sock?db=1", "client"},
		{"redis://s1:26379/0?master_name=primary&addr=s2:26379&addr=s3:26379&password=pw", "failover"},
		{"redis://n1:7000?cluster=true&addr=n2:7000&addr=n3:7000", "cluster"},
		{"rediss://n1:7000?cluster=1", "cluster"},
		{"redis://n1:7000?cluster=false", "client"},
		{"", ""},
		{"localhost:6379", ""},
		{"http://localhost:6379", ""},
		{"redis://h/notadb", ""},
		{"redis://h:1?addr=h2:1", ""},
		{"redis://h:1?cluster=yes-please", ""},
		{"redis://h:1/3?cluster=true", ""},
		{"redis://h:1?cluster=true&master_name=m", ""},
		{"redis://h:1?no_such_option=1", ""},
		{"redis://user:hunter2@h:1/%zz", ""},
	} {
		client, err := redisstore.NewClient(tc.url)
		if tc.kind == "" {
			if err == nil {
				client.Close()
				t.Errorf("%q: no error", tc.url)
				continue
			}
			if !strings.HasPrefix(err.Error(), "REDIS_URL:") || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("%q: error %q must start with REDIS_URL: and not repeat the password", tc.url, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.url, err)
			continue
		}
		var kind string
		switch c := client.(type) {
		case *redis.ClusterClient:
			kind = "cluster"
			if o := c.Options(); o.DialTimeout != redisstore.DefaultDialTimeout || !o.ContextTimeoutEnabled || len(o.Addrs) < 1 {
				t.Errorf("%q: cluster options %+v", tc.url, o)
			}
		case *redis.Client:
			kind = "client"
			o := c.Options()
			if strings.Contains(tc.url, "master_name") {
				kind = "failover"
			}
			// go-redis stores "no retries" (-1) as 0 once the client is built.
			if !o.ContextTimeoutEnabled || o.MaxRetries != 0 || o.DialerRetries != 1 {
				t.Errorf("%q: options: context timeouts %v, max retries %d", tc.url, o.ContextTimeoutEnabled, o.MaxRetries)
			}
			if strings.Contains(tc.url, "dial_timeout=3s") != (o.DialTimeout == 3*time.Second) {
				t.Errorf("%q: dial timeout %s", tc.url, o.DialTimeout)
			}
		default:
			kind = "other"
		}
		if kind != tc.kind {
			t.Errorf("%q: got a %s client, want %s", tc.url, kind, tc.kind)
		}
		client.Close()
	}
}

// TestOpenDoesNotConnect: a Redis that is down at startup is not an error (the gate fails
// open until it answers).
func TestOpenDoesNotConnect(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s, err := redisstore.Open("redis://"+addr, redisstore.Options{})
	if err != nil {
		t.Fatalf("Open with Redis down: %v", err)
	}
	defer s.Close()
	if err := s.Ping(context.Background()); err == nil {
		t.Fatal("Ping succeeded on a closed port")
	}
	if _, err := redisstore.Open("redis://"+addr, redisstore.Options{KeyPrefix: "a{b"}); err == nil {
		t.Fatal("a key prefix with a brace was accepted")
	}
}
