package redisstore_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// TestRollingUpgradeSharesTheRetryQueue: during a rolling upgrade, instances that predate the
// returning retries' place (gate.EndpointCheck.Returning) run the decide.lua they were built
// with (testdata/decide_before_returning.lua, called with its nine arguments) on the keys the
// new script writes. Both must read the other's slot as valid and keep one queue: the old
// script queues after the new one's last slot, and a returning retry refused by the new script
// takes the window's next free place without moving the queue's end, which the old script then
// still queues after.
func TestRollingUpgradeSharesTheRetryQueue(t *testing.T) {
	t.Parallel()
	state, err := os.ReadFile("state.lua")
	if err != nil {
		t.Fatal(err)
	}
	oldDecide, err := os.ReadFile("testdata/decide_before_returning.lua")
	if err != nil {
		t.Fatal(err)
	}
	old := redis.NewScript(string(state) + string(oldDecide))
	s := redistest.Open(t, redistest.Prefix(t))
	p := gate.Params{RetryRPS: 2, Window: time.Second}.WithDefaults()
	hash := "upgrade-test"
	cb, probe, rl := s.Keys(hash)
	retries, slot := s.RetryKeys(hash)
	seq := 0
	decideNew := func(c gate.EndpointCheck) []gate.RowDecision {
		t.Helper()
		seq++
		c.Hash, c.Token = hash, "new-"+strconv.Itoa(seq)
		decs, err := s.Decide(context.Background(), p, []gate.EndpointCheck{c})
		if err != nil || len(decs) != 1 || decs[0].Err != nil {
			t.Fatalf("new Decide: %v %+v", err, decs)
		}
		return decs[0].Rows
	}
	decideOld := func() time.Duration {
		t.Helper()
		seq++
		vals, err := old.Run(context.Background(), s.Client(), []string{cb, probe, rl, retries, slot},
			0, p.RetryRPS, p.Window.Microseconds(), p.ProbeTimeout.Milliseconds(), gate.StateTTL.Milliseconds(),
			p.RetryReserve(), "old-"+strconv.Itoa(seq), "1", p.Reset.Milliseconds()).Slice()
		if err != nil || len(vals) != 3 {
			t.Fatalf("old decide.lua: %v %v", err, vals)
		}
		if vals[1] != int64(gate.DeferRateLimit) {
			t.Fatalf("old decide.lua: verdict %v, want a rate-limit deferral", vals[1])
		}
		return time.Duration(vals[2].(int64)) * time.Microsecond
	}
	within := func(what string, got, want time.Duration, since time.Time) {
		t.Helper()
		// Redis's clock runs on between the calls: a delay can only be shorter than the ideal.
		if got > want+time.Millisecond || got < want-time.Since(since)-time.Millisecond {
			t.Fatalf("%s: deferred by %s, want %s", what, got, want)
		}
	}

	start := time.Now()
	rows := decideNew(gate.EndpointCheck{Retry: []bool{true, true, true, true}})
	if rows[0].Verdict != gate.Allow || rows[1].Verdict != gate.Allow {
		t.Fatalf("retries refused with an empty window: %+v", rows)
	}
	within("new script, refused retry 1", rows[2].Delay, time.Second, start)
	within("new script, refused retry 2", rows[3].Delay, 1500*time.Millisecond, start)
	within("old script after the new one's slots", decideOld(), 2*time.Second, start)
	back := decideNew(gate.EndpointCheck{Retry: []bool{true}, Returning: []bool{true}})
	within("new script, returning retry", back[0].Delay, time.Second, start)
	within("old script after a returning retry's place", decideOld(), 2500*time.Millisecond, start)
}
