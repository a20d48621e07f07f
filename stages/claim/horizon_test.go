package claim_test

import (
	"strconv"
	"testing"

	"github.com/fluxora/fluxhook/stages/claim"
)

// TestHorizon: the horizon moves to a reading's last id only once none of the transactions
// that held the outbox's lock at that reading is running (a later reading does not list them),
// at once when there were none, and never backwards.
func TestHorizon(t *testing.T) {
	var h claim.Horizon
	step := func(reading string, wantMoved bool, wantSafe int64, wantWaiting bool) {
		t.Helper()
		moved, err := h.Observe(reading)
		if err != nil {
			t.Fatalf("Observe(%q): %v", reading, err)
		}
		if moved != wantMoved || h.Safe() != wantSafe || h.Waiting() != wantWaiting {
			t.Fatalf("after %q: moved %v, safe %d, waiting %v; want %v, %d, %v",
				reading, moved, h.Safe(), h.Waiting(), wantMoved, wantSafe, wantWaiting)
		}
	}
	step("10:", true, 10, false)        // nobody holds the lock: every id up to 10 is settled
	step("10:", false, 10, false)       // nothing new
	step("15:3/7,4/9", false, 10, true) // 3/7 or 4/9 may still commit an id up to 15
	step("20:4/9,5/2", false, 10, true) // 3/7 ended, 4/9 has not
	step("20:5/2", true, 15, true)      // 4/9 ended: 15 is settled; 20 waits for 5/2
	step("22:6/1", true, 20, true)      // 5/2 ended
	step("22:", true, 22, false)        // nobody holds it: 22
	step("5:", false, 22, false)        // never backwards (a reset sequence)
	if _, err := h.Observe("x:1/2"); err == nil {
		t.Error("a malformed reading was accepted")
	}
}

// TestHorizonBoundsReadings: while one transaction stays open, readings are kept up to a
// bound, and the horizon moves past all of them once it ends.
func TestHorizonBoundsReadings(t *testing.T) {
	var h claim.Horizon
	for i := range 1000 {
		if _, err := h.Observe(strconv.Itoa(100+i) + ":9/9"); err != nil {
			t.Fatal(err)
		}
	}
	if h.Safe() != 0 || !h.Waiting() {
		t.Fatalf("safe %d waiting %v while 9/9 is open; want 0 and true", h.Safe(), h.Waiting())
	}
	if moved, _ := h.Observe("1100:8/8"); !moved || h.Safe() != 1099 {
		t.Fatalf("after 9/9 ended: safe %d, want 1099 (the newest reading it held)", h.Safe())
	}
}

// TestHorizonAcrossPrepareTransaction: a producer that drew id 1 is listed under its session's
// virtual transaction id; once it runs PREPARE TRANSACTION its lock belongs to a prepared
// transaction ('p' and another id, the same across a restart of the server). Its session's
// id is gone from the readings, but the transaction is not over: nothing up to 1 is settled
// until the prepared one ends too. Another id's prepared transaction listed at a reading is
// waited for like any holder.
func TestHorizonAcrossPrepareTransaction(t *testing.T) {
	var h claim.Horizon
	step := func(reading string, wantSafe int64) {
		t.Helper()
		if _, err := h.Observe(reading); err != nil {
			t.Fatalf("Observe(%q): %v", reading, err)
		}
		if h.Safe() != wantSafe {
			t.Fatalf("after %q: safe %d, want %d", reading, h.Safe(), wantSafe)
		}
	}
	step("0:", 0)
	step("1:3/9", 0)     // the producer inserted id 1
	step("2:p-1/726", 0) // it prepared; a second producer committed id 2
	step("2:p-1/726", 0) // the server restarted: the prepared transaction is back, same id
	step("3:p-1/726,5/1", 0)
	step("3:5/1", 2) // COMMIT PREPARED: 1 and 2 are settled; 3 waits for 5/1
	step("3:", 3)
}
