package pipeline_test

import (
	"context"
	"sync/atomic"
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

func TestSlotsDrain(t *testing.T) {
	t.Parallel()
	s := pipeline.NewSlots(4)
	s.Take(3)
	if s.Free() != 1 || s.InUse() != 3 {
		t.Fatalf("free %d in use %d", s.Free(), s.InUse())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.WaitIdle(ctx); err == nil {
		t.Fatal("WaitIdle returned nil with work in flight")
	}
	done := make(chan error, 1)
	go func() { done <- s.WaitIdle(context.Background()) }()
	s.Release(2)
	<-s.Freed()
	s.Release(1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s.Free() != 4 {
		t.Fatalf("free after drain = %d", s.Free())
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

func TestWorkersFixedPool(t *testing.T) {
	t.Parallel()
	in := make(chan int)
	var running, peak atomic.Int32
	release := make(chan struct{})
	done := pipeline.Workers(3, in, func(int) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		running.Add(-1)
	})
	go func() {
		for i := range 10 {
			in <- i
		}
		close(in)
	}()
	for peak.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	<-done
	if peak.Load() != 3 {
		t.Fatalf("peak concurrency %d, want the pool size 3", peak.Load())
	}
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
