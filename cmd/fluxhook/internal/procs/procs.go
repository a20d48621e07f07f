// Package procs runs serve's Go runtime on one processor while its work fits on one, and on
// the runtime's default number when it does not or rows are waiting.
//
// Live webhook traffic is many small hand-offs: a NOTIFY wakes the claim, the claim's rows go
// to a sender, the sender's answer to the settle. With several processors and little work,
// each hand-off wakes an idle thread that finds nothing to do and sleeps again, and on a
// virtual machine those wake-ups cost more than the work itself. On one processor the
// goroutine that is handed the work runs when the one handing it over waits, on the same
// thread. Measured with `fluxhook bench --workload steady --rate 1000` on 2 CPUs, with the
// controller against two processors throughout: 8.5 context switches per event against 14.5,
// and 272 µs of dispatcher CPU per event against 337. A drain is what more processors are for
// (a drain on one ran about 5% fewer events per second), so the controller widens at the first
// full claim or a busy processor, and narrows only after the load has stayed low for a while.
//
// Setting GOMAXPROCS in the environment turns the controller off: the operator's number holds.
package procs

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Thresholds, in CPUs used by the whole process over one interval. Widening reacts to one
// busy interval, narrowing waits for narrowAfter quiet ones: a process that is narrowed too
// early costs a little throughput until the next interval, one widened too early only the
// wake-ups it would have had anyway.
const (
	// widenAt: one processor is this busy, so the process may need more.
	widenAt = 0.8
	// narrowBelow: on the default number of processors, the process uses less than this.
	// Work costs less on one processor, so this is well under widenAt: no flapping.
	narrowBelow = 0.4
	// narrowAfter is how many consecutive quiet intervals narrow the process.
	narrowAfter = 3
)

// Interval is how often the controller reads the process's CPU time: one getrusage call and
// one wake-up a second.
const Interval = time.Second

// Options configure Adapt; the zero value is the production setting.
type Options struct {
	// Interval between readings; 0 means Interval.
	Interval time.Duration
	// CPUTime reads the process's CPU time (user and system) so far; nil reads getrusage.
	// Tests replace it.
	CPUTime func() time.Duration
	// Logger receives one debug line per change; nil logs nothing.
	Logger *zap.Logger
}

// active is held while one controller runs: GOMAXPROCS is the process's, and two serves in
// one process (tests run serve in theirs) must not fight over it.
var active sync.Mutex

// Controller adapts GOMAXPROCS to the load. Only its own goroutine changes GOMAXPROCS: a
// change stops the world, which waits for a garbage collection's marking to end, and the
// claiming loop that reports a backlog must not wait for that. Its methods are safe on a nil
// Controller, which adapts nothing.
type Controller struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	prev   int // GOMAXPROCS before Adapt, given back by Stop

	narrowed atomic.Bool   // read on every Backlog call, which must cost nothing while wide
	backlog  atomic.Bool   // Backlog was called since the last reading
	widen    chan struct{} // Backlog's request to widen now, one pending at most
}

// Adapt starts a controller unless the environment sets GOMAXPROCS (envGOMAXPROCS is its
// value), another one runs in this process, or GOMAXPROCS is already one (it returns nil
// then). It narrows at once; a backlog widens it (Backlog).
func Adapt(ctx context.Context, envGOMAXPROCS string, o Options) *Controller {
	if envGOMAXPROCS != "" || !active.TryLock() {
		return nil
	}
	prev := runtime.GOMAXPROCS(0)
	if prev <= 1 {
		active.Unlock()
		return nil
	}
	if o.Interval <= 0 {
		o.Interval = Interval
	}
	if o.CPUTime == nil {
		o.CPUTime = cpuTime
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	c := &Controller{done: make(chan struct{}), prev: prev, widen: make(chan struct{}, 1)}
	ctx, c.cancel = context.WithCancel(ctx)
	var d decision
	apply := func(narrow bool, cpus float64) {
		d.narrow = narrow
		c.narrowed.Store(narrow)
		if narrow {
			runtime.GOMAXPROCS(1)
		} else {
			runtime.SetDefaultGOMAXPROCS()
		}
		o.Logger.Debug("runtime processors changed", zap.Int("gomaxprocs", runtime.GOMAXPROCS(0)), zap.Float64("cpus_used", cpus))
	}
	apply(true, 0)
	go func() {
		defer close(c.done)
		t := time.NewTicker(o.Interval)
		defer t.Stop()
		last, lastAt := o.CPUTime(), time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.widen:
				if d.narrow {
					d.narrow, d.quiet = false, 0
					apply(false, -1)
				}
			case <-t.C:
				used, now := o.CPUTime(), time.Now()
				cpus := float64(used-last) / float64(now.Sub(lastAt))
				last, lastAt = used, now
				if narrow, change := d.next(cpus, c.backlog.Swap(false)); change {
					apply(narrow, cpus)
				}
			}
		}
	}()
	return c
}

// Backlog says rows are waiting (a claim came back full): a narrowed process widens at once,
// since a drain is where more processors pay. It never blocks, and costs an atomic load while
// the process is wide.
func (c *Controller) Backlog() {
	if c == nil {
		return
	}
	c.backlog.Store(true)
	if !c.narrowed.Load() {
		return
	}
	select {
	case c.widen <- struct{}{}:
	default: // a request is pending already
	}
}

// Stop ends the controller and gives GOMAXPROCS back as Adapt found it. Serve calls it when
// it starts draining, on whatever number of processors the drain then needs.
func (c *Controller) Stop() {
	if c == nil {
		return
	}
	c.once.Do(func() {
		c.cancel()
		<-c.done
		runtime.SetDefaultGOMAXPROCS()
		if runtime.GOMAXPROCS(0) != c.prev {
			runtime.GOMAXPROCS(c.prev)
		}
		c.narrowed.Store(false)
		active.Unlock()
	})
}

// decision is the controller's rule, apart from the clock and the runtime so that it can be
// tested.
type decision struct {
	narrow bool
	quiet  int // consecutive quiet intervals while wide
}

// next takes the CPUs the process used over the last interval and whether a backlog was
// seen in it, and says whether to change, and to what.
func (d *decision) next(cpus float64, backlog bool) (narrow, change bool) {
	busy := backlog || cpus >= widenAt
	if d.narrow {
		if busy {
			d.narrow, d.quiet = false, 0
			return false, true
		}
		return true, false
	}
	if busy || cpus >= narrowBelow {
		d.quiet = 0
		return false, false
	}
	d.quiet++
	if d.quiet < narrowAfter {
		return false, false
	}
	d.narrow, d.quiet = true, 0
	return true, true
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
