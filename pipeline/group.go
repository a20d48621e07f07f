package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultSinkBound is how long Stop waits, once the drain is cut short, for the sink to
// finish what came back before cancelling it too. Long enough for a database transaction
// under load; short enough that a database that is gone cannot hold a shutdown for long.
const DefaultSinkBound = 10 * time.Second

// Group owns the long-lived goroutines of one staged pipeline and stops them in two phases.
// Its goroutines have one of three roles, each with its own context, because each role is
// stopped at a different moment:
//
//   - sources take work in (a claiming loop) or keep the pipeline going (listeners,
//     housekeeping). Stop cancels them first: no new work is taken.
//   - stages pass work on through bounded channels and may block on the outside world (an
//     HTTP request). Their context is cancelled only when the drain is cut short.
//   - the sink finishes work (commits outcomes). Its context is cancelled only as a last
//     resort, when it has not finished within SinkBound of the drain being cut short: work
//     that was cancelled still comes back through it and must be recorded.
//
// A stage's goroutines return once their input channel is closed; the group calls the
// stage's closeOut once all of them have returned. So a source closing its output on return
// ends the stage after it, which ends the next, down to the sink: the drain closes channels
// in pipeline order and never drops an item that is already inside. The group adds nothing
// per item: items move over the callers' own channels.
//
// Register every goroutine with Source, Stage and Sink, then Start once and Stop (any number
// of times, also before Start). Set the exported fields before Start.
type Group struct {
	// SinkBound is how long Stop waits for the sink once the drain is cut short; 0 means
	// DefaultSinkBound.
	SinkBound time.Duration
	// OnCutShort, if set, is called once when Stop's ctx ends before the drain finished,
	// before any stage is cancelled: the moment to say (log, count) what is being abandoned.
	OnCutShort func(cause error)

	mu       sync.Mutex
	sources  []role
	stages   []role
	sink     func(ctx context.Context)
	started  bool
	stopping bool
	stopped  chan struct{} // closed when the first Stop has returned
	err      error         // what the first Stop returned

	stopSources, cancelStages, cancelSink context.CancelFunc
	sourcesDone, sinkDone                 chan struct{}
	all                                   sync.WaitGroup
}

// role is one registered piece: workers goroutines running run, and closeOut once they all
// returned.
type role struct {
	workers  int
	run      func(ctx context.Context)
	closeOut func()
}

// Source registers a goroutine that takes work in. run must return once ctx ends; closeOut
// (may be nil) is called after it returned and normally closes the channel it feeds, which
// starts the drain of the stages after it.
func (g *Group) Source(run func(ctx context.Context), closeOut func()) {
	g.add(&g.sources, role{workers: 1, run: run, closeOut: closeOut})
}

// Stage registers workers goroutines (at least one) that each run run until the stage's
// input is closed, then return. closeOut (may be nil) is called once, after every one of
// them returned, and normally closes the stage's output. ctx ends only when the drain is cut
// short: run then gives up on what blocks (requests) and still passes every item on.
func (g *Group) Stage(workers int, run func(ctx context.Context), closeOut func()) {
	g.add(&g.stages, role{workers: max(workers, 1), run: run, closeOut: closeOut})
}

// Sink registers the one goroutine that finishes work. run must return once its input is
// closed; Stop's drain is done when it has. ctx ends only when the sink is abandoned (see
// SinkBound): run then still drains its input, failing fast.
func (g *Group) Sink(run func(ctx context.Context)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		panic("pipeline: Sink after Start")
	}
	if g.sink != nil {
		panic("pipeline: a Group has one sink")
	}
	g.sink = run
}

func (g *Group) add(list *[]role, r role) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		panic("pipeline: stage registered after Start")
	}
	*list = append(*list, r)
}

// Start launches every registered goroutine. Their contexts carry ctx's values but not its
// cancellation: ctx only bounds starting, and the goroutines run until Stop. It fails if the
// group has no sink, was started already or was stopped before it started.
func (g *Group) Start(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.started:
		return errors.New("pipeline: group already started")
	case g.stopping:
		return errors.New("pipeline: group stopped before it started")
	case g.sink == nil:
		return errors.New("pipeline: group has no sink; register one with Sink before Start")
	}
	g.started = true
	base := context.WithoutCancel(ctx)
	var sourceCtx, stageCtx, sinkCtx context.Context
	sourceCtx, g.stopSources = context.WithCancel(base)
	stageCtx, g.cancelStages = context.WithCancel(base)
	sinkCtx, g.cancelSink = context.WithCancel(base)
	g.sourcesDone = make(chan struct{})
	g.sinkDone = make(chan struct{})

	// The last source to return says the sources are done: no goroutine just to wait.
	var sourcesLeft atomic.Int32
	sourcesLeft.Store(int32(len(g.sources)))
	if len(g.sources) == 0 {
		close(g.sourcesDone)
	}
	for _, r := range g.sources {
		g.launch(sourceCtx, r, func() {
			if sourcesLeft.Add(-1) == 0 {
				close(g.sourcesDone)
			}
		})
	}
	for _, r := range g.stages {
		g.launch(stageCtx, r, nil)
	}
	g.launch(sinkCtx, role{workers: 1, run: g.sink}, func() { close(g.sinkDone) })
	return nil
}

// launch starts r's goroutines; the last of them to return calls r.closeOut, then after.
func (g *Group) launch(ctx context.Context, r role, after func()) {
	var left atomic.Int32
	left.Store(int32(r.workers))
	g.all.Add(r.workers)
	for range r.workers {
		go func() {
			defer g.all.Done()
			r.run(ctx)
			if left.Add(-1) == 0 {
				if r.closeOut != nil {
					r.closeOut()
				}
				if after != nil {
					after()
				}
			}
		}()
	}
}

// Stop shuts the group down in two phases. First it cancels the sources and waits until they
// and the sink have returned: everything taken in has gone through every stage. If ctx ends
// first, it calls OnCutShort, cancels the stages (their blocking work gives up and the items
// still flow on to the sink), waits up to SinkBound for the sink, and then cancels the sink
// too. Either way it returns only once every goroutine of the group has returned; the error
// says whether the drain was cut short, and why (context.Cause of ctx).
//
// Stop before Start returns nil at once (and Start then fails); a second Stop waits for the
// first and returns what it returned.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	if g.stopping {
		g.mu.Unlock()
		if g.stopped != nil {
			<-g.stopped
		}
		return g.err
	}
	g.stopping = true
	if !g.started {
		g.mu.Unlock()
		return nil
	}
	g.stopped = make(chan struct{})
	g.mu.Unlock()
	defer close(g.stopped)

	g.stopSources()
	if !waitOrDone(ctx, g.sourcesDone) || !waitOrDone(ctx, g.sinkDone) {
		cause := context.Cause(ctx)
		g.err = fmt.Errorf("drain cut short (%w)", cause)
		if g.OnCutShort != nil {
			g.OnCutShort(cause)
		}
		g.cancelStages()
		bound := g.SinkBound
		if bound <= 0 {
			bound = DefaultSinkBound
		}
		t := time.NewTimer(bound)
		select {
		case <-g.sinkDone:
		case <-t.C:
			// The sink is stuck (its database is gone): abandon what it holds.
			g.cancelSink()
		}
		t.Stop()
	}
	g.cancelStages()
	g.cancelSink()
	g.all.Wait()
	return g.err
}

// waitOrDone waits for done and reports true, or reports false once ctx ends first.
func waitOrDone(ctx context.Context, done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	case <-ctx.Done():
		// Both may be ready: a drain that finished is not cut short.
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}
