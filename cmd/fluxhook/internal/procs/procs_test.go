package procs

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestDecision(t *testing.T) {
	type step struct {
		cpus   float64
		narrow bool // the state after the step
		change bool
	}
	cases := map[string][]step{
		"narrowed, a busy processor widens": {{cpus: 0.85, narrow: false, change: true}},
		"narrowed, moderate load stays":     {{cpus: 0.7, narrow: true}, {cpus: 0.2, narrow: true}},
	}
	for name, steps := range cases {
		t.Run(name, func(t *testing.T) {
			d := decision{narrow: true}
			for i, s := range steps {
				narrow, change := d.next(s.cpus)
				if narrow != s.narrow || change != s.change {
					t.Fatalf("step %d (cpus %.2f): got narrow %v change %v, want %v %v", i, s.cpus, narrow, change, s.narrow, s.change)
				}
			}
		})
	}
	t.Run("wide, narrows only after narrowAfter quiet intervals in a row", func(t *testing.T) {
		d := decision{}
		for i := range narrowAfter - 1 {
			if _, change := d.next(0.1); change {
				t.Fatalf("narrowed after %d quiet intervals, want %d", i+1, narrowAfter)
			}
		}
		// Load between the thresholds starts the count again.
		if _, change := d.next(narrowBelow); change {
			t.Fatal("changed on load between the thresholds")
		}
		for i := range narrowAfter - 1 {
			if _, change := d.next(0.1); change {
				t.Fatalf("narrowed %d intervals after load between the thresholds, want %d", i+1, narrowAfter)
			}
		}
		if narrow, change := d.next(0.1); !narrow || !change {
			t.Fatalf("after %d quiet intervals: narrow %v change %v, want a change to narrow", narrowAfter, narrow, change)
		}
	})
}

// waitFor polls the runtime's GOMAXPROCS until it is want, failing after five seconds.
func waitFor(t *testing.T, want int, why string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.GOMAXPROCS(0) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: GOMAXPROCS is %d, want %d", why, runtime.GOMAXPROCS(0), want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAdapt(t *testing.T) {
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	if def < 2 {
		t.Skipf("the runtime's default is %d processor: nothing to narrow", def)
	}
	if c := Adapt(context.Background(), "3", Options{}); c != nil {
		c.Stop()
		t.Fatal("Adapt ran with GOMAXPROCS set in the environment: the operator's number must hold")
	}
	if runtime.GOMAXPROCS(0) != def {
		t.Fatalf("GOMAXPROCS changed to %d with the controller off", runtime.GOMAXPROCS(0))
	}

	// The fake process's CPU time, growing at rate thousandths of a CPU.
	var mu sync.Mutex
	var used time.Duration
	var rate int64
	at := time.Now()
	cpu := func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		used += time.Duration(int64(now.Sub(at)) * rate / 1000)
		at = now
		return used
	}
	setRate := func(r int64) {
		cpu() // what was used so far, at the old rate
		mu.Lock()
		rate = r
		mu.Unlock()
	}
	c := Adapt(context.Background(), "", Options{Interval: 5 * time.Millisecond, CPUTime: cpu})
	if c == nil {
		t.Fatal("Adapt did not start")
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop()
		}
	}()
	if Adapt(context.Background(), "", Options{}) != nil {
		t.Fatal("a second controller started in the same process")
	}
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("after Adapt: GOMAXPROCS %d, want 1 (a daemon starts narrow)", got)
	}
	setRate(2000) // a process busy on its one processor widens at the next reading
	waitFor(t, def, "a saturated processor")
	setRate(0) // quiet intervals narrow it again
	waitFor(t, 1, "quiet intervals")
	setRate(2000)
	waitFor(t, def, "a saturated processor again")
	setRate(0)
	waitFor(t, 1, "quiet again")
	c.Stop()
	stopped = true
	if got := runtime.GOMAXPROCS(0); got != def {
		t.Fatalf("after Stop: GOMAXPROCS %d, want %d back, as Adapt found it", got, def)
	}
	if c := Adapt(context.Background(), "", Options{}); c == nil {
		t.Fatal("Adapt did not start after the first controller stopped")
	} else {
		c.Stop()
	}
	var none *Controller
	none.Stop()
}
