package pipeline_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/fluxora/fluxhook/pipeline"
)

func TestSignalCoalesces(t *testing.T) {
	t.Parallel()
	s := pipeline.NewSignal()
	for range 100 {
		s.Notify()
	}
	<-s.C()
	select {
	case <-s.C():
		t.Fatal("100 notifications produced more than one wake-up")
	default:
	}
}

func TestSignalClearDropsOnlyWhatIsPending(t *testing.T) {
	t.Parallel()
	s := pipeline.NewSignal()
	s.Clear() // nothing pending: must not block
	s.Notify()
	s.Clear()
	select {
	case <-s.C():
		t.Fatal("a wake-up survived Clear")
	default:
	}
	s.Notify() // a wake-up after Clear is delivered
	select {
	case <-s.C():
	default:
		t.Fatal("the wake-up sent after Clear was lost")
	}
}

func TestSlotsCapacity(t *testing.T) {
	t.Parallel()
	s := pipeline.NewSlots(4)
	s.Take(3)
	if s.Free() != 1 || s.InUse() != 3 {
		t.Fatalf("free %d in use %d", s.Free(), s.InUse())
	}
	select {
	case <-s.Freed():
		t.Fatal("Freed signalled before anything was released")
	default:
	}
	s.Release(2)
	s.Release(1)
	<-s.Freed() // the two releases coalesce into one wake-up
	select {
	case <-s.Freed():
		t.Fatal("two releases produced two wake-ups")
	default:
	}
	if s.Free() != 4 || s.InUse() != 0 {
		t.Fatalf("after release: free %d in use %d", s.Free(), s.InUse())
	}
}

func TestBatchFlushesWhatIsQueuedAndEverything(t *testing.T) {
	t.Parallel()
	in := make(chan int, 100)
	for i := range 25 {
		in <- i
	}
	close(in)
	var sizes []int
	seen := 0
	pipeline.Batch(in, 10, func(b []int) {
		for _, v := range b {
			if v != seen {
				t.Fatalf("item %d out of order (want %d)", v, seen)
			}
			seen++
		}
		sizes = append(sizes, len(b))
	})
	if seen != 25 || len(sizes) != 3 || sizes[0] != 10 || sizes[2] != 5 {
		t.Fatalf("batches %v, %d items", sizes, seen)
	}
}

func TestBatchDoesNotWaitForMore(t *testing.T) {
	t.Parallel()
	in := make(chan int)
	flushed := make(chan []int)
	go pipeline.Batch(in, 10, func(b []int) { flushed <- append([]int(nil), b...) })
	in <- 1
	select {
	case b := <-flushed:
		if len(b) != 1 {
			t.Fatalf("batch %v", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lone item was held back waiting for a fuller batch")
	}
	close(in)
}

// TestBatchUntilLingersForAFullerBatch: items arriving within the linger go into one flush;
// the flush happens at the linger, not before, while complete says more are coming.
func TestBatchUntilLingersForAFullerBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		in := make(chan int)
		type flushAt struct {
			items []int
			at    time.Duration
		}
		flushed := make(chan flushAt, 10)
		start := time.Now()
		go pipeline.BatchUntil(in, 10, 5*time.Millisecond, func(int) bool { return false }, func(b []int) {
			flushed <- flushAt{append([]int(nil), b...), time.Since(start)}
		})
		in <- 1
		time.Sleep(2 * time.Millisecond)
		in <- 2
		time.Sleep(2 * time.Millisecond)
		in <- 3
		got := <-flushed
		if len(got.items) != 3 || got.at != 5*time.Millisecond {
			t.Fatalf("flushed %v at %s, want 3 items at the 5ms linger", got.items, got.at)
		}
		close(in)
	})
}

// TestBatchUntilFlushesAtOnceWhenComplete: a lone item that is all there is (an idle
// dispatcher's one row) is not held for the linger; a full batch is not either.
func TestBatchUntilFlushesAtOnceWhenComplete(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		in := make(chan int, 20)
		flushed := make(chan []int, 10)
		start := time.Now()
		var at []time.Duration
		go pipeline.BatchUntil(in, 3, time.Second, func(n int) bool { return n == 1 }, func(b []int) {
			at = append(at, time.Since(start))
			flushed <- append([]int(nil), b...)
		})
		in <- 1
		if b := <-flushed; len(b) != 1 {
			t.Fatalf("first flush %v", b)
		}
		for i := range 3 {
			in <- 10 + i
		}
		if b := <-flushed; len(b) != 3 {
			t.Fatalf("second flush %v, want the full batch of 3", b)
		}
		close(in)
		synctest.Wait()
		if at[0] != 0 || at[1] != 0 {
			t.Fatalf("flushed at %v, want both at once (no linger)", at)
		}
	})
}
