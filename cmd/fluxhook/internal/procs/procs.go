// Package procs runs serve's Go runtime on one processor while its work fits on one, and on
// the runtime's default number when it does not.
//
// Live webhook traffic is many small hand-offs: a NOTIFY wakes the claim, the claim's rows go
// to a sender, the sender's answer to the settle. With several processors and little work,
// each hand-off wakes an idle thread that finds nothing to do and sleeps again, and on a
// virtual machine those wake-ups cost more than the work itself. On one processor the
// goroutine that is handed the work runs when the one handing it over waits, on the same
// thread. Measured with `fluxhook bench --workload steady --rate 1000` on 2 CPUs, with the
// controller against two processors throughout: 8.5 context switches per event against 14.5,
// and 272 µs of dispatcher CPU per event against 337. A drain of 60,000 events ran as fast on
// one (20,054–20,363 events/s against 20,272–20,401) at 9% less CPU per event: with the
// database and the consumer on the same two CPUs, more processors only add wake-ups. Where
// the dispatcher's own work needs more than one processor (one 80% busy over a second), the
// controller widens to the default, and narrows again only after the load has stayed low.
//
// Setting GOMAXPROCS in the environment turns the controller off: the operator's number holds.
package procs

import (
	"context"
	"runtime"
	"sync"
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

// Controller adapts GOMAXPROCS to the load from its own goroutine: a change stops the world,
// which waits for a garbage collection's marking to end, and no stage of the pipeline may
// wait for that. Stop is safe on a nil Controller, which adapts nothing.
type Controller struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	prev   int // GOMAXPROCS before Adapt, given back by Stop
}

// Adapt starts a controller unless the environment sets GOMAXPROCS (envGOMAXPROCS is its
// value), another one runs in this process, or GOMAXPROCS is already one (it returns nil
// then). It narrows at once: a daemon starts with little to do.
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
	c := &Controller{done: make(chan struct{}), prev: prev}
	ctx, c.cancel = context.WithCancel(ctx)
	d := decision{narrow: true}
	apply := func(narrow bool, cpus float64) {
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
			case <-t.C:
				used, now := o.CPUTime(), time.Now()
				cpus := float64(used-last) / float64(now.Sub(lastAt))
				last, lastAt = used, now
				if narrow, change := d.next(cpus); change {
					apply(narrow, cpus)
				}
			}
		}
	}()
	return c
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
		active.Unlock()
	})
}

// decision is the controller's rule, apart from the clock and the runtime so that it can be
// tested.
type decision struct {
	narrow bool
	quiet  int // consecutive quiet intervals while wide
}

// next takes the CPUs the process used over the last interval and says whether to change,
// and to what.
func (d *decision) next(cpus float64) (narrow, change bool) {
	busy := cpus >= widenAt
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
