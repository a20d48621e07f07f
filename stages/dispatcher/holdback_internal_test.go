package dispatcher

import (
	"testing"
	"time"
)

// The hold-back's rules, with explicit times: only claims that skip are held back, only after
// one that skipped and found nothing, for ten times its duration capped at maxHoldback, while
// every endpoint it skipped is still skipped; a claim that skips and finds rows lifts it.
func TestSkipHoldback(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	a, ab := []string{"a"}, []string{"a", "b"}
	var h skipHoldback
	if h.blocks(t0, a) {
		t.Fatal("held back before any claim")
	}
	h.observe(t0, nil, 0, time.Second) // found nothing, skipped nothing: the backlog is empty
	if h.blocks(t0, a) {
		t.Fatal("held back after an empty claim that skipped nothing")
	}

	h.observe(t0, a, 0, 20*time.Millisecond) // skipped a, found nothing: a full scan
	if !h.blocks(t0.Add(199*time.Millisecond), a) || !h.blocks(t0.Add(time.Millisecond), ab) {
		t.Fatal("a claim skipping a (or more) was not held back for 10x the fruitless claim's 20 ms")
	}
	if h.blocks(t0.Add(201*time.Millisecond), a) {
		t.Fatal("held back beyond 10x the fruitless claim's duration")
	}
	if h.blocks(t0.Add(time.Millisecond), nil) {
		t.Fatal("a claim that skips nothing (a has room) was held back")
	}
	if h.blocks(t0.Add(time.Millisecond), []string{"b"}) {
		t.Fatal("a claim that no longer skips a (a has room, b is saturated) was held back")
	}

	// A claim that skips nothing and finds rows (a had room for a moment) says nothing about
	// rows outside a: the hold stays.
	h.observe(t0.Add(time.Millisecond), nil, 100, time.Millisecond)
	if !h.blocks(t0.Add(2*time.Millisecond), a) {
		t.Fatal("a fruitful claim that skipped nothing lifted the hold")
	}
	// A claim that skipped a and found rows: other endpoints have rows again.
	h.observe(t0.Add(3*time.Millisecond), a, 5, time.Millisecond)
	if h.blocks(t0.Add(4*time.Millisecond), a) {
		t.Fatal("still held back after a claim skipping a found rows")
	}

	h.observe(t0, a, 0, time.Minute)
	if h.blocks(t0.Add(maxHoldback+time.Millisecond), a) {
		t.Fatalf("held back longer than maxHoldback (%s)", maxHoldback)
	}
}
