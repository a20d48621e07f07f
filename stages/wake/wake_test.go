package wake_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/stages/wake"
)

// recorder collects wake-up sources.
type recorder struct {
	mu  sync.Mutex
	got []wake.Source
}

func (r *recorder) add(s wake.Source) {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
}

func (r *recorder) take() []wake.Source {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out
}

// startedWaker starts a Waker with the poll interval poll inside the current synctest bubble,
// recording its wake-ups; it is stopped when the test ends.
func startedWaker(t *testing.T, poll time.Duration) (*wake.Waker, *recorder) {
	rec := &recorder{}
	w := newWaker(rec, poll)
	w.Start(context.Background())
	t.Cleanup(w.Stop)
	return w, rec
}

func newWaker(rec *recorder, poll time.Duration) *wake.Waker {
	return wake.New(wake.Config{
		// No database in these tests: the listener keeps failing to connect, which must not
		// disturb the timers.
		Connect:      func(context.Context) (*pgx.Conn, error) { return nil, errors.New("no database") },
		PollInterval: poll,
		OnWake:       rec.add,
	})
}

// after lets d pass on the bubble's clock, waits for the waker's goroutines to settle, and
// requires exactly the wake-ups want (none when want is empty) in that time.
func after(t *testing.T, rec *recorder, d time.Duration, why string, want ...wake.Source) {
	t.Helper()
	time.Sleep(d)
	synctest.Wait()
	if got := rec.take(); !slices.Equal(got, want) {
		t.Fatalf("%s: wake-ups %v, want %v", why, got, want)
	}
}

func TestDueTimerFiresAtTheEarliestDueTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, rec := startedWaker(t, time.Hour)

		w.DueIn(5 * time.Second)
		w.DueIn(time.Second) // earlier: replaces the 5 s timer
		w.DueIn(3 * time.Second)
		after(t, rec, 999*time.Millisecond, "before the earliest due time")
		after(t, rec, 2*time.Millisecond, "at the due time", wake.Timer)
		<-w.C()
		// The later due times were superseded, not queued: nothing more until the poll.
		after(t, rec, 10*time.Second, "superseded timers must not fire")
	})
}

// TestWatchSharesTheTimerWithItsOwnSource: the dispatcher's looks after arming use the one
// due timer (the earliest request wins, whoever made it) and are counted as Watch, so that
// wakeups_total tells them from rows coming due.
func TestWatchSharesTheTimerWithItsOwnSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, rec := startedWaker(t, time.Hour)

		w.WatchIn(100 * time.Millisecond)
		w.DueIn(time.Second) // later: the look stays
		after(t, rec, 101*time.Millisecond, "after 100 ms", wake.Watch)
		<-w.C()

		w.WatchIn(time.Second)
		w.DueIn(200 * time.Millisecond) // earlier: a row comes due first, and the look is superseded
		after(t, rec, 201*time.Millisecond, "after 200 ms", wake.Timer)
		<-w.C()
		after(t, rec, 10*time.Second, "a superseded look must not fire")
	})
}

func TestPollIsAJitteredBackstop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, rec := startedWaker(t, 10*time.Second)
		after(t, rec, 8999*time.Millisecond, "jitter is ±10%: nothing before 9 s")
		after(t, rec, 2002*time.Millisecond, "and a poll by 11 s", wake.Poll)
	})
}

func TestStopIsSafeBeforeStartAndTwice(t *testing.T) {
	w := newWaker(&recorder{}, time.Hour)
	w.Stop()
	w.Start(context.Background()) // after Stop: does nothing
	w.Stop()
	if w.Connected() {
		t.Fatal("a stopped waker reports a connected listener")
	}
}
