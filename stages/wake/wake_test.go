package wake_test

import (
	"context"
	"errors"
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

func newWaker(rec *recorder, poll time.Duration) *wake.Waker {
	return wake.New(wake.Config{
		// No database in these tests: the listener keeps failing to connect, which must not
		// disturb the timers.
		Connect:      func(context.Context) (*pgx.Conn, error) { return nil, errors.New("no database") },
		PollInterval: poll,
		OnWake:       rec.add,
	})
}

func TestDueTimerFiresAtTheEarliestDueTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		w := newWaker(rec, time.Hour)
		w.Start(context.Background())
		defer w.Stop()

		w.DueIn(5 * time.Second)
		w.DueIn(time.Second) // earlier: replaces the 5 s timer
		w.DueIn(3 * time.Second)
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		if got := rec.take(); len(got) != 0 {
			t.Fatalf("woke %v before the earliest due time", got)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if got := rec.take(); len(got) != 1 || got[0] != wake.Timer {
			t.Fatalf("at the due time: %v, want one timer wake-up", got)
		}
		<-w.C()
		// The later due times were superseded, not queued: nothing more until the poll.
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := rec.take(); len(got) != 0 {
			t.Fatalf("later wake-ups %v; superseded timers must not fire", got)
		}
	})
}

// TestWatchSharesTheTimerWithItsOwnSource: the dispatcher's looks after arming use the one
// due timer (the earliest request wins, whoever made it) and are counted as Watch, so that
// wakeups_total tells them from rows coming due.
func TestWatchSharesTheTimerWithItsOwnSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		w := newWaker(rec, time.Hour)
		w.Start(context.Background())
		defer w.Stop()

		w.WatchIn(100 * time.Millisecond)
		w.DueIn(time.Second) // later: the look stays
		time.Sleep(101 * time.Millisecond)
		synctest.Wait()
		if got := rec.take(); len(got) != 1 || got[0] != wake.Watch {
			t.Fatalf("after 100 ms: %v, want one watch wake-up", got)
		}
		<-w.C()

		w.WatchIn(time.Second)
		w.DueIn(200 * time.Millisecond) // earlier: a row comes due first, and the look is superseded
		time.Sleep(201 * time.Millisecond)
		synctest.Wait()
		if got := rec.take(); len(got) != 1 || got[0] != wake.Timer {
			t.Fatalf("after 200 ms: %v, want one timer wake-up", got)
		}
		<-w.C()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := rec.take(); len(got) != 0 {
			t.Fatalf("later wake-ups %v; a superseded look must not fire", got)
		}
	})
}

func TestPollIsAJitteredBackstop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		w := newWaker(rec, 10*time.Second)
		w.Start(context.Background())
		defer w.Stop()
		time.Sleep(8999 * time.Millisecond) // jitter is ±10%: nothing before 9 s
		synctest.Wait()
		if got := rec.take(); len(got) != 0 {
			t.Fatalf("woke %v before 9 s", got)
		}
		time.Sleep(2002 * time.Millisecond) // and a poll by 11 s
		synctest.Wait()
		if got := rec.take(); len(got) != 1 || got[0] != wake.Poll {
			t.Fatalf("by 11 s: %v, want one poll", got)
		}
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
