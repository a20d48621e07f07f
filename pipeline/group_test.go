package pipeline_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fluxora/fluxhook/pipeline"
)

// item is what flows through the fake pipelines: the stage marks it when its blocking work
// (a request) was cancelled, the sink records whether its own context had ended.
type item struct {
	n         int
	cancelled bool
}

// fake is a three-role pipeline made of fakes: a source that takes items as fast as the
// channels let it until it is stopped, a stage of two workers that each hold an item until
// release is closed or their context ends, and a sink that records what reaches it.
type fake struct {
	g           pipeline.Group
	release     chan struct{}
	sourceEnded chan struct{} // closed once the source returned and closed its output

	produced atomic.Int64
	mu       sync.Mutex
	got      []item
	sinkErrs int // items the sink received after its context ended
}

func newFake() *fake {
	f := &fake{release: make(chan struct{}), sourceEnded: make(chan struct{})}
	taken := make(chan item, 4)
	passed := make(chan item, 4)
	f.g.Source(func(ctx context.Context) {
		for i := 0; ; i++ {
			select {
			case taken <- item{n: i}:
				f.produced.Add(1)
			case <-ctx.Done():
				return
			}
		}
	}, func() {
		close(taken)
		close(f.sourceEnded)
	})
	f.g.Stage(2, func(ctx context.Context) {
		for it := range taken {
			select {
			case <-f.release:
			case <-ctx.Done():
				it.cancelled = true
			}
			passed <- it
		}
	}, func() { close(passed) })
	f.g.Sink(func(ctx context.Context) {
		for it := range passed {
			f.mu.Lock()
			f.got = append(f.got, it)
			if ctx.Err() != nil {
				f.sinkErrs++
			}
			f.mu.Unlock()
		}
	})
	return f
}

// startFull starts f and waits until the source is blocked on full channels: work is in
// every part of the pipeline when Stop begins.
func (f *fake) startFull(t *testing.T) {
	t.Helper()
	if err := f.g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// 4 queued between source and stage, 2 held by the stage's workers.
	deadline := time.Now().Add(10 * time.Second)
	for f.produced.Load() < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("the source took %d items, want 6 before the pipeline is full", f.produced.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// checkEverythingArrived fails unless every item the source took reached the sink once.
func (f *fake) checkEverythingArrived(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	ns := make([]int, 0, len(f.got))
	for _, it := range f.got {
		ns = append(ns, it.n)
	}
	slices.Sort(ns)
	if int64(len(ns)) != f.produced.Load() {
		t.Fatalf("sink got %d items, the source took %d", len(ns), f.produced.Load())
	}
	for i, n := range ns {
		if n != i {
			t.Fatalf("sink got items %v: item %d lost or duplicated", ns, i)
		}
	}
}

// TestGroupStopDrainsEverythingTaken: Stop stops the source, waits while work is held in the
// stage, and returns nil only after every item taken has reached the sink, with no context
// cancelled on the way.
func TestGroupStopDrainsEverythingTaken(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.g.OnCutShort = func(error) { t.Error("OnCutShort called during an orderly drain") }
	f.startFull(t)
	stopped := make(chan error, 1)
	go func() { stopped <- f.g.Stop(context.Background()) }()
	select {
	case <-f.sourceEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not stop the source")
	}
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while the stage still held work", err)
	default:
	}
	close(f.release)
	if err := <-stopped; err != nil {
		t.Fatalf("orderly drain: Stop returned %v", err)
	}
	f.checkEverythingArrived(t)
	for _, it := range f.got {
		if it.cancelled {
			t.Fatalf("item %d was cancelled in an orderly drain", it.n)
		}
	}
	if f.sinkErrs != 0 {
		t.Fatalf("the sink's context ended before it had flushed %d items", f.sinkErrs)
	}
}

// TestGroupCutShortCancelsStagesAndSinkFlushes: when Stop's context ends (a second signal),
// the stage's blocking work is cancelled, and everything, cancelled or not, still reaches
// a sink whose context is intact; Stop's error carries the cause.
func TestGroupCutShortCancelsStagesAndSinkFlushes(t *testing.T) {
	t.Parallel()
	f := newFake()
	var causes []error
	f.g.OnCutShort = func(cause error) { causes = append(causes, cause) }
	f.startFull(t)
	secondSignal := errors.New("second signal")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(secondSignal)
	err := f.g.Stop(ctx)
	if !errors.Is(err, secondSignal) {
		t.Fatalf("Stop returned %v, want the cause %q", err, secondSignal)
	}
	if len(causes) != 1 || causes[0] != secondSignal {
		t.Fatalf("OnCutShort called with %v, want once with the cause", causes)
	}
	f.checkEverythingArrived(t)
	cancelled := 0
	for _, it := range f.got {
		if it.cancelled {
			cancelled++
		}
	}
	if cancelled == 0 {
		t.Fatal("no item's blocking work was cancelled (release was never closed)")
	}
	if f.sinkErrs != 0 {
		t.Fatalf("the sink was cancelled although it finished within the bound (%d items)", f.sinkErrs)
	}
	close(f.release)
}

// TestGroupAbandonsAStuckSink: a sink that blocks (its database is gone) is cancelled
// SinkBound after the drain was cut short, and Stop then returns.
func TestGroupAbandonsAStuckSink(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var g pipeline.Group
		g.SinkBound = 7 * time.Second
		out := make(chan int, 1)
		g.Source(func(ctx context.Context) {
			out <- 1
			<-ctx.Done()
		}, func() { close(out) })
		var abandonedAt time.Duration
		start := time.Now()
		g.Sink(func(ctx context.Context) {
			for range out {
				<-ctx.Done() // a settle that only gives up when cancelled
				abandonedAt = time.Since(start)
			}
		})
		if err := g.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the sink is stuck on the item
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := g.Stop(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Stop returned %v, want the drain cut short by context.Canceled", err)
		}
		if abandonedAt != g.SinkBound {
			t.Fatalf("sink cancelled after %s, want after SinkBound %s", abandonedAt, g.SinkBound)
		}
	})
}

// TestGroupStopTwice: concurrent and later Stops wait for the first and return its result.
func TestGroupStopTwice(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.startFull(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- f.g.Stop(ctx) }()
	}
	first, second := <-errs, <-errs
	if !errors.Is(first, context.Canceled) || first != second {
		t.Fatalf("concurrent Stops returned %v and %v, want the same cut-short error", first, second)
	}
	if err := f.g.Stop(context.Background()); err != first {
		t.Fatalf("a later Stop returned %v, want %v", err, first)
	}
	f.checkEverythingArrived(t)
	close(f.release)
}

// TestGroupStopBeforeStart: Stop on a group that never started returns at once, and the
// group cannot be started afterwards (it would run with nobody left to stop it).
func TestGroupStopBeforeStart(t *testing.T) {
	t.Parallel()
	var empty pipeline.Group
	if err := empty.Stop(context.Background()); err != nil {
		t.Fatalf("Stop on a zero Group: %v", err)
	}
	f := newFake()
	if err := f.g.Stop(context.Background()); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	if err := f.g.Start(context.Background()); err == nil {
		t.Fatal("Start after Stop succeeded")
	}
	if err := f.g.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop before Start: %v", err)
	}
}

func TestGroupStartMisuse(t *testing.T) {
	t.Parallel()
	var g pipeline.Group
	if err := g.Start(context.Background()); err == nil {
		t.Fatal("Start without a sink succeeded")
	}
	g.Sink(func(context.Context) {})
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err == nil {
		t.Fatal("second Start succeeded")
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestGroupStageIsAFixedPool: a stage runs exactly its workers, not a goroutine per item,
// and closes its output once, after the last worker returned.
func TestGroupStageIsAFixedPool(t *testing.T) {
	t.Parallel()
	var g pipeline.Group
	in := make(chan int)
	out := make(chan int, 10)
	var running, peak atomic.Int32
	release := make(chan struct{})
	g.Source(func(ctx context.Context) {
		for i := range 10 {
			in <- i
		}
		<-ctx.Done()
	}, func() { close(in) })
	g.Stage(3, func(context.Context) {
		for v := range in {
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			<-release
			running.Add(-1)
			out <- v
		}
	}, func() {
		if running.Load() != 0 {
			t.Error("the stage's output was closed while a worker was still running")
		}
		close(out)
	})
	var sunk atomic.Int32
	g.Sink(func(context.Context) {
		for range out {
			sunk.Add(1)
		}
	})
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for peak.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("peak concurrency %d, want the pool size 3", peak.Load())
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if peak.Load() != 3 || sunk.Load() != 10 {
		t.Fatalf("peak concurrency %d (want 3), %d items sunk (want 10)", peak.Load(), sunk.Load())
	}
}
