package redisstore_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// The spell of an open circuit (open_since, failed_probes) is two extra fields of the breaker
// hash. These tests pin what the contract suite cannot see: the fields as stored, keys written
// by a fluxhook that did not write them (a rolling upgrade), and values no script wrote.

// breakerFields returns the breaker hash of the checker's endpoint.
func breakerFields(t *testing.T, s *redisstore.Store, hash string) map[string]string {
	t.Helper()
	cb, _, _ := s.Keys(hash)
	m, err := s.Client().HGetAll(context.Background(), cb).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// writeBreaker replaces the checker's breaker key with a hash of kv, expiring in an hour.
func writeBreaker(t *testing.T, s *redisstore.Store, hash string, kv ...string) {
	t.Helper()
	ctx := context.Background()
	cb, _, _ := s.Keys(hash)
	args := make([]any, len(kv))
	for i, v := range kv {
		args[i] = v
	}
	if err := s.Client().Del(ctx, cb).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Client().HSet(ctx, cb, args...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Client().PExpire(ctx, cb, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
}

func redisNow(t *testing.T, s *redisstore.Store) time.Time {
	t.Helper()
	now, err := redistest.Now(context.Background(), s.Client())
	if err != nil {
		t.Fatal(err)
	}
	return now
}

func micros(t time.Time) string { return strconv.FormatInt(t.UnixMicro(), 10) }

// probeFails grants the probe (the reset has passed) and records its failure.
func (c *checker) probeFails() {
	c.t.Helper()
	dec, token := c.decideToken(false)
	c.expect(dec, gate.Probe)
	trans, err := c.s.Record(context.Background(), c.params(), []gate.EndpointResult{{Hash: c.hash, Rows: []gate.RowResult{{Result: gate.Failure, Token: token}}}})
	if err != nil {
		c.t.Fatal(err)
	}
	if !slices.Equal(trans, []gate.Transition{{Hash: c.hash, From: gate.HalfOpen, To: gate.Open}}) {
		c.t.Fatalf("probe failure: transitions %v, want half_open>open", trans)
	}
}

// TestSpellFields: record.lua writes open_since (µs by Redis's clock) and failed_probes while
// the circuit is open or half-open, keeps open_since across a failed probe, writes neither on
// a closed circuit with failures, and a closed circuit deletes the key as before.
func TestSpellFields(t *testing.T) {
	t.Parallel()
	s := redistest.Open(t, redistest.Prefix(t))
	ep := endpoint("https://spell.example/")
	p := corruptParams
	p.Reset = 50 * time.Millisecond
	cs := &checker{t: t, s: s, hash: ep.Hash, p: p}

	cs.record(gate.Failure)
	if f := breakerFields(t, s, ep.Hash); f["failures"] != "1" || f["open_since"] != "" || f["failed_probes"] != "" {
		t.Fatalf("closed with a failure: %v, want no spell fields", f)
	}
	before := redisNow(t, s)
	for range p.Threshold - 1 {
		cs.record(gate.Failure)
	}
	after := redisNow(t, s)
	f := breakerFields(t, s, ep.Hash)
	since, err := strconv.ParseInt(f["open_since"], 10, 64)
	if err != nil || since < before.UnixMicro() || since > after.UnixMicro() || f["failed_probes"] != "0" || f["state"] != "open" {
		t.Fatalf("opened: %v, want open_since between %d and %d (Redis's clock, µs) and failed_probes 0", f, before.UnixMicro(), after.UnixMicro())
	}
	snap := cs.snapshot()
	if snap.OpenSince.UnixMicro() != since || snap.FailedProbes != 0 || snap.At.Before(snap.OpenSince) {
		t.Fatalf("opened: %+v, want OpenSince %d", snap, since)
	}

	redistest.WaitFor(t, s.Client(), p.Reset)
	cs.probeFails()
	if f := breakerFields(t, s, ep.Hash); f["open_since"] != strconv.FormatInt(since, 10) || f["failed_probes"] != "1" || f["state"] != "open" {
		t.Fatalf("after a failed probe: %v, want open_since %d unchanged and failed_probes 1", f, since)
	}

	redistest.WaitFor(t, s.Client(), p.Reset)
	dec, token := cs.decideToken(false)
	cs.expect(dec, gate.Probe)
	if f := breakerFields(t, s, ep.Hash); f["state"] != "half_open" || f["open_since"] != strconv.FormatInt(since, 10) || f["failed_probes"] != "1" {
		t.Fatalf("half-open: %v, want the spell's fields kept", f)
	}
	if _, err := s.Record(context.Background(), p, []gate.EndpointResult{{Hash: ep.Hash, Rows: []gate.RowResult{{Result: gate.Success, Token: token}}}}); err != nil {
		t.Fatal(err)
	}
	cb, _, _ := s.Keys(ep.Hash)
	cs.key(cb, "none")
}

// TestLegacyBreakerKey: a breaker key as the previous version of the scripts wrote it (no
// open_since, no failed_probes) is still a valid open circuit: nothing deletes it, Inspect
// reports it open with the spell's start unknown (zero), a failed probe counts from 0 and
// leaves the start unknown (nothing is invented), and the probe's success closes it.
func TestLegacyBreakerKey(t *testing.T) {
	t.Parallel()
	s := redistest.Open(t, redistest.Prefix(t))
	ep := endpoint("https://legacy.example/")
	p := corruptParams
	p.Reset = 50 * time.Millisecond
	cs := &checker{t: t, s: s, hash: ep.Hash, p: p}
	now := redisNow(t, s)
	writeBreaker(t, s, ep.Hash, "state", "open", "failures", "0", "open_until", micros(now.Add(time.Minute)))

	snap := cs.snapshot()
	if snap.State != gate.Open || snap.OpenFor <= 0 || !snap.OpenSince.IsZero() || snap.FailedProbes != 0 {
		t.Fatalf("legacy open key: %+v, want open, OpenSince unknown (zero), no failed probes", snap)
	}
	cs.expect(cs.decide(false), gate.DeferOpen)

	// The reset passes (rewritten as the old scripts would have after a reset), the probe fails.
	writeBreaker(t, s, ep.Hash, "state", "open", "failures", "0", "open_until", micros(now))
	cs.probeFails()
	snap = cs.snapshot()
	if snap.State != gate.Open || !snap.OpenSince.IsZero() || snap.FailedProbes != 1 {
		t.Fatalf("legacy key after a failed probe: %+v, want open, OpenSince still unknown, 1 failed probe", snap)
	}
	if f := breakerFields(t, s, ep.Hash); f["failed_probes"] != "1" {
		t.Fatalf("legacy key after a failed probe: %v, want failed_probes 1", f)
	} else if _, ok := f["open_since"]; ok {
		t.Fatalf("legacy key after a failed probe: %v, want no open_since (unknown)", f)
	}
}

// TestCorruptSpellFields: an open_since or failed_probes no script wrote, on an otherwise valid
// breaker key, reads as absent (the spell's start unknown, 0 failed probes) while the rest of
// the key is read as written and kept (the circuit stays open); the next write drops the bad
// value: a failed probe counts from 0 and leaves an unknown start unknown.
func TestCorruptSpellFields(t *testing.T) {
	t.Parallel()
	const valid = "<valid>"
	cases := []struct {
		name                    string
		openSince, failedProbes string
	}{
		{"clean", valid, "3"},
		{"open_since soon", "soon", "3"},
		{"open_since negative", "-5", "3"},
		{"open_since fractional", "1.5", "3"},
		{"open_since zero", "0", "3"},
		{"open_since nan", "nan", "3"},
		{"open_since inf", "inf", "3"},
		{"open_since 1e400", "1e400", "3"},
		{"open_since after open_until", "<after open_until>", "3"},
		{"open_since empty", "", "3"},
		{"failed_probes x", valid, "x"},
		{"failed_probes negative", valid, "-1"},
		{"failed_probes fractional", valid, "2.5"},
		{"failed_probes inf", valid, "inf"},
		{"failed_probes huge", valid, "123456789012345678901234567890"},
		{"both garbage", "soon", "x"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Open(t, redistest.Prefix(t))
			ep := endpoint("https://spell-corrupt.example/" + tc.name)
			cs := &checker{t: t, s: s, hash: ep.Hash}
			now := redisNow(t, s)
			openSince := now.Add(-time.Hour).Truncate(time.Microsecond)
			write := func(openUntil time.Time) {
				v := tc.openSince
				switch v {
				case valid:
					v = micros(openSince)
				case "<after open_until>":
					v = strconv.FormatInt(openUntil.UnixMicro()+1, 10)
				}
				writeBreaker(t, s, ep.Hash, "state", "open", "failures", "0", "open_until", micros(openUntil),
					"open_since", v, "failed_probes", tc.failedProbes)
			}
			wantSince, wantProbes := time.Time{}, 0
			if tc.openSince == valid {
				wantSince = openSince
			}
			if tc.failedProbes == "3" {
				wantProbes = 3
			}

			write(now.Add(time.Minute))
			snap := cs.snapshot()
			if snap.State != gate.Open || snap.OpenFor <= 0 || !snap.OpenSince.Equal(wantSince) || snap.FailedProbes != wantProbes {
				t.Fatalf("Inspect: %+v, want open, OpenSince %v, %d failed probes", snap, wantSince, wantProbes)
			}
			cs.expect(cs.decide(false, true), gate.DeferOpen, gate.DeferOpen)

			// The reset has passed: the probe fails, the key is rewritten without the bad value.
			write(now)
			cs.probeFails()
			snap = cs.snapshot()
			if snap.State != gate.Open || !snap.OpenSince.Equal(wantSince) || snap.FailedProbes != wantProbes+1 {
				t.Fatalf("after a failed probe: %+v, want open, OpenSince %v, %d failed probes", snap, wantSince, wantProbes+1)
			}
			f := breakerFields(t, s, ep.Hash)
			if f["failed_probes"] != strconv.Itoa(wantProbes+1) {
				t.Fatalf("after a failed probe: %v, want failed_probes %d", f, wantProbes+1)
			}
			if v, ok := f["open_since"]; wantSince.IsZero() == ok || (ok && v != micros(wantSince)) {
				t.Fatalf("after a failed probe: %v, want open_since %v (absent when unknown)", f, wantSince)
			}
			cb, _, _ := s.Keys(ep.Hash)
			cs.key(cb, "hash")
		})
	}
}

// TestSpellFieldsOnAClosedCircuit: spell fields on a closed circuit (no script writes them
// there) are ignored, and dropped by the next write.
func TestSpellFieldsOnAClosedCircuit(t *testing.T) {
	t.Parallel()
	s := redistest.Open(t, redistest.Prefix(t))
	ep := endpoint("https://spell-closed.example/")
	cs := &checker{t: t, s: s, hash: ep.Hash}
	writeBreaker(t, s, ep.Hash, "state", "closed", "failures", "1", "open_until", "0",
		"open_since", micros(redisNow(t, s)), "failed_probes", "4")
	if snap := cs.snapshot(); snap.State != gate.Closed || snap.Failures != 1 || !snap.OpenSince.IsZero() || snap.FailedProbes != 0 {
		t.Fatalf("closed key with spell fields: %+v, want closed with 1 failure, no spell", snap)
	}
	cs.record(gate.Failure)
	cs.inspect(gate.Closed, 2)
	if f := breakerFields(t, s, ep.Hash); f["open_since"] != "" || f["failed_probes"] != "" || f["failures"] != "2" {
		t.Fatalf("after a failure: %v, want 2 failures and no spell fields", f)
	}
}
