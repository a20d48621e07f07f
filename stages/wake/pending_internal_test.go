package wake

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// notifier returns a function that hands w a NOTIFY on the outbox channel, as the listener
// would.
func notifier(w *Waker) func(payload string) {
	h := outboxHandler{w}
	return func(payload string) {
		_ = h.HandleNotification(context.Background(), &pgconn.Notification{Channel: Channel, Payload: payload}, nil)
	}
}

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
	notify := notifier(w)
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

// A connection that died silently is found out within PingInterval plus PingTimeout of the
// last notification, and /readyz believes Connected until then: the defaults keep that within
// about seven seconds, and a connection attempt on a dead network gives up within ten.
func TestDefaultLivenessCheckFindsADeadConnectionWithinSeconds(t *testing.T) {
	w := New(Config{})
	if got := w.cfg.PingInterval + w.cfg.PingTimeout; w.cfg.PingInterval <= 0 || w.cfg.PingTimeout <= 0 || got > 7*time.Second {
		t.Fatalf("default PingInterval %s + PingTimeout %s, want both positive and at most 7s together", w.cfg.PingInterval, w.cfg.PingTimeout)
	}
	if d := w.cfg.ConnectTimeout; d <= 0 || d > 10*time.Second {
		t.Fatalf("default ConnectTimeout = %s, want (0, 10s]", d)
	}
}

// A ping on PingChannel, the waker's own or another dispatcher's, is proof of life and
// nothing else: it must neither wake the claiming loop nor count as a wake-up.
func TestPingNotificationDoesNotWake(t *testing.T) {
	t.Parallel()
	var wakes int
	w := New(Config{OnWake: func(Source) { wakes++ }})
	before := time.Now()
	for _, payload := range []string{w.pingToken + "-1", "another-1", "123"} {
		_ = pingHandler{w}.HandleNotification(context.Background(), &pgconn.Notification{Channel: PingChannel, Payload: payload}, nil)
	}
	if pending(w) || wakes != 0 {
		t.Fatalf("pings woke the loop (pending %t, %d wake-ups counted)", pending(w), wakes)
	}
	w.live.Lock()
	heard := w.live.heard
	w.live.Unlock()
	if heard.Before(before) {
		t.Fatal("a ping did not count as proof of life")
	}
}

// NotifiesOnly tells a pacing claiming loop which wake-ups it may wait through: only those
// made of NOTIFYs alone. A timer (an ordered stream that moved, a row coming due), the poll or
// a NOTIFY without a transaction id must end its wait.
func TestNotifiesOnly(t *testing.T) {
	t.Parallel()
	w := New(Config{})
	notify := notifier(w)
	if w.NotifiesOnly() {
		t.Fatal("no wake-up at all reads as NOTIFYs only")
	}
	notify("100")
	notify("101")
	if !pending(w) || !w.NotifiesOnly() {
		t.Fatal("two NOTIFYs with ids did not read as NOTIFYs only")
	}
	w.Wake(Timer) // after the loop took the first signal and waits on
	if !pending(w) || w.NotifiesOnly() {
		t.Fatal("a timer after the NOTIFYs still reads as NOTIFYs only")
	}
	w.Clear()
	notify("")
	if w.NotifiesOnly() {
		t.Fatal("a NOTIFY without a transaction id read as NOTIFYs only")
	}
	w.Clear()
	w.Wake(Poll)
	if w.NotifiesOnly() {
		t.Fatal("the poll reads as NOTIFYs only")
	}
}
