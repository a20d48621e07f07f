package wake

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func pending(w *Waker) bool {
	select {
	case <-w.C():
		return true
	default:
		return false
	}
}

// DropSeen must drop a wake-up only when every part of it was a NOTIFY the last claim had
// already seen; anything else (an unseen transaction, a timer, a payload without an id) must
// still wake the claiming loop, or a row would wait for the poll.
func TestDropSeenKeepsWhatTheClaimDidNotSee(t *testing.T) {
	t.Parallel()
	w := New(Config{})
	h := handler{w}
	notify := func(payload string) {
		_ = h.HandleNotification(context.Background(), &pgconn.Notification{Payload: payload}, nil)
	}
	seenUpTo := func(max uint64) func(uint64) bool { return func(x uint64) bool { return x <= max } }

	notify("100")
	notify("101")
	w.DropSeen(seenUpTo(101))
	if pending(w) {
		t.Fatal("NOTIFYs from transactions the claim saw still woke the loop")
	}

	notify("100")
	notify("102")
	w.DropSeen(seenUpTo(101))
	if !pending(w) {
		t.Fatal("a NOTIFY from a transaction the claim did not see was dropped")
	}

	w.Clear()
	notify("100")
	w.Wake(Timer)
	w.DropSeen(seenUpTo(1000))
	if !pending(w) {
		t.Fatal("a timer wake-up was dropped with the seen NOTIFYs")
	}

	w.Clear()
	notify("") // a schema-2 trigger, or a NOTIFY someone else sent on the channel
	w.DropSeen(seenUpTo(1000))
	if !pending(w) {
		t.Fatal("a NOTIFY without a transaction id was dropped")
	}

	// Clear forgets what was pending: ids seen before it do not linger into the next claim.
	notify("500")
	w.Clear()
	notify("100")
	w.DropSeen(seenUpTo(101))
	if pending(w) {
		t.Fatal("an id from before Clear kept the wake-up")
	}
}

// The listener's default reconnect delay bounds how long NOTIFYs go unheard after a lost
// connection (README: "reconnects within ~0.5 s"); the dispatcher relies on the default.
func TestDefaultReconnectDelayIsAtMostASecond(t *testing.T) {
	w := New(Config{})
	if d := w.cfg.ReconnectDelay; d <= 0 || d > time.Second {
		t.Fatalf("default ReconnectDelay = %s, want (0, 1s]", d)
	}
}
