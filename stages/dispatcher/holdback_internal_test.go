package dispatcher

import (
	"testing"
	"time"
)

// The hold-back's rules after skipAfter has passed, with explicit times: only claims that skip
// are held back, only after one that skipped and found nothing, for ten times its duration capped at maxHoldback, while
// every endpoint it skipped is still skipped; a claim that skips and finds rows lifts it.
func TestSkipHoldback(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	a, ab := []string{"a"}, []string{"a", "b"}
	var h skipHoldback
	blocks := func(now time.Time, skip []string) bool {
		h.unseen()
		h.hold(now.Add(-time.Hour), skip) // saturated since long ago (TestSkipAfter covers the start)
		_, held := h.hold(now, skip)
		return held
	}
	if blocks(t0, a) {
		t.Fatal("held back before any claim")
	}
	h.observe(t0, nil, 0, time.Second) // found nothing, skipped nothing: the backlog is empty
	if blocks(t0, a) {
		t.Fatal("held back after an empty claim that skipped nothing")
	}

	h.observe(t0, a, 0, 20*time.Millisecond) // skipped a, found nothing: a full scan
	if !blocks(t0.Add(199*time.Millisecond), a) || !blocks(t0.Add(time.Millisecond), ab) {
		t.Fatal("a claim skipping a (or more) was not held back for 10x the fruitless claim's 20 ms")
	}
	if blocks(t0.Add(201*time.Millisecond), a) {
		t.Fatal("held back beyond 10x the fruitless claim's duration")
	}
	if blocks(t0.Add(time.Millisecond), nil) {
		t.Fatal("a claim that skips nothing (a has room) was held back")
	}
	if blocks(t0.Add(time.Millisecond), []string{"b"}) {
		t.Fatal("a claim that no longer skips a (a has room, b is saturated) was held back")
	}

	// A claim that skips nothing and finds rows (a had room for a moment) says nothing about
	// rows outside a: the hold stays.
	h.observe(t0.Add(time.Millisecond), nil, 100, time.Millisecond)
	if !blocks(t0.Add(2*time.Millisecond), a) {
		t.Fatal("a fruitful claim that skipped nothing lifted the hold")
	}
	// A claim that skipped a and found rows: other endpoints have rows again.
	h.observe(t0.Add(3*time.Millisecond), a, 5, time.Millisecond)
	if blocks(t0.Add(4*time.Millisecond), a) {
		t.Fatal("still held back after a claim skipping a found rows")
	}

	h.observe(t0, a, 0, time.Minute)
	if blocks(t0.Add(maxHoldback+time.Millisecond), a) {
		t.Fatalf("held back longer than maxHoldback (%s)", maxHoldback)
	}
}

// TestSkipAfter: each endpoint's saturation is waited out for skipAfter before claims skip
// it; the wait starts with that endpoint's saturation, ends when it does, starts afresh with
// the next, and is not shortened by another endpoint saturated for longer.
func TestSkipAfter(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	a, ab := []string{"a"}, []string{"a", "b"}
	var h skipHoldback
	check := func(now time.Time, saturated []string, wantHeld bool, wantUntil time.Time, what string) {
		t.Helper()
		until, held := h.hold(now, saturated)
		if held != wantHeld || (held && !until.Equal(wantUntil)) {
			t.Fatalf("%s: held %v until %s, want held %v until %s", what, held, until.Sub(t0), wantHeld, wantUntil.Sub(t0))
		}
	}
	check(t0, nil, false, time.Time{}, "nothing saturated")
	check(t0, a, true, t0.Add(skipAfter), "a saturation just seen")
	check(t0.Add(skipAfter-time.Millisecond), a, true, t0.Add(skipAfter), "while it lasts")
	check(t0.Add(skipAfter), a, false, time.Time{}, "once it outlasted skipAfter")
	// b saturates while a still is: b's own start counts, a's older one does not cut it short.
	check(t0.Add(time.Second), ab, true, t0.Add(time.Second+skipAfter), "a second endpoint saturating")
	check(t0.Add(time.Second+skipAfter), ab, false, time.Time{}, "both saturated long enough")
	// a's saturation ends and a new one begins: it is waited out again from its start.
	check(t0.Add(2*time.Second), []string{"b"}, false, time.Time{}, "a has room again")
	check(t0.Add(3*time.Second), ab, true, t0.Add(3*time.Second+skipAfter), "a saturating anew")
	// The loop stopped looking (no free capacity): what it saw before is forgotten.
	h.unseen()
	check(t0.Add(4*time.Second), []string{"b"}, true, t0.Add(4*time.Second+skipAfter), "after a spell without looking")
}
