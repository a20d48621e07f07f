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
		h.from = time.Time{} // saturated since long ago (TestSkipAfter covers the start)
		h.hold(now.Add(-time.Hour), skip)
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

// TestSkipAfter: a saturation is waited out for skipAfter before claims skip the endpoint;
// the wait starts with the saturation, ends when it does, and starts afresh with the next.
func TestSkipAfter(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	a := []string{"a"}
	var h skipHoldback
	if _, held := h.hold(t0, nil); held {
		t.Fatal("a claim that skips nothing was held")
	}
	until, held := h.hold(t0, a)
	if !held || !until.Equal(t0.Add(skipAfter)) {
		t.Fatalf("a saturation just seen: held %v until %s, want held until skipAfter later", held, until.Sub(t0))
	}
	if until, held := h.hold(t0.Add(skipAfter-time.Millisecond), a); !held || !until.Equal(t0.Add(skipAfter)) {
		t.Fatal("the wait moved or ended while the saturation lasted")
	}
	if _, held := h.hold(t0.Add(skipAfter), a); held {
		t.Fatal("still held once the saturation outlasted skipAfter")
	}
	// The saturation passes, and a new one begins: it is waited out again.
	h.hold(t0.Add(time.Second), nil)
	if until, held := h.hold(t0.Add(2*time.Second), a); !held || !until.Equal(t0.Add(2*time.Second+skipAfter)) {
		t.Fatal("a new saturation was not waited out from its start")
	}
}
