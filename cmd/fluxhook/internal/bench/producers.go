package bench

// The producers workload: what the wake-up trigger costs the application's inserts.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// How long after switching the trigger a segment starts counting. Switched per session (SET
// session_replication_role) a producer follows the switch before its next insert, so a few
// milliseconds; switched for the table, ALTER TABLE waits for the producers' open transactions,
// holds the next ones back for a moment, and every producer re-plans its insert once. None of
// that is the trigger's cost.
const (
	sessionSwitchSettle = 30 * time.Millisecond
	tableSwitchSettle   = 200 * time.Millisecond
)

// producers: commit throughput of C concurrent single-row producers with the trigger firing and
// not, while a dispatcher is busy draining a backlog. By design a busy dispatcher is not armed,
// so no insert should NOTIFY, and the comparison is the trigger's own cost under load. The
// NOTIFYs the dispatcher received anyway are reported.
//
// The two sides are not separate runs but segments of one run: the producers keep inserting
// and the trigger is switched between segments, so each segment with the trigger has a
// neighbour without it under the same dispatcher, backlog and machine load. Two designs, each
// reported:
//
//   - whole: every producer with the trigger, then every producer without (ABBA order); the
//     cost is the median over neighbouring pairs of (1 − with/without). This is the budget's
//     own question, but on a shared 2-core VM neighbouring segments still differ by the
//     machine's load at the time: single pairs spread ±10–50%.
//   - split: half of the producers with the trigger and half without at the same moment,
//     the halves swapped every segment; the cost is the median over segments of
//     (1 − commits per producer with / commits per producer without). Both sides see exactly
//     the same load, so the machine's swings cancel. Under CPU saturation every producer
//     backend gets an equal share, so the ratio is the one a whole run with the trigger would
//     have; the whole design checks that without relying on it.
//
// The trigger is switched per producer session with session_replication_role (a trigger in
// its default ENABLE state does not fire for a session in replica mode: exactly a disabled
// trigger, without a lock on the table). That needs a superuser or, from PostgreSQL 15, GRANT
// SET ON PARAMETER session_replication_role; without it the bench switches the table's
// trigger with ALTER TABLE and runs the whole design only. Session 4 switched with ALTER TABLE
// in 2-second segments; the lock and re-planning after each switch made short segments
// impossible.
//
// Where PostgreSQL runs on this machine the producers' backends' CPU per commit is reported
// for each side too, read from /proc.
func (b *bench) producers(ctx context.Context) (*producersResult, error) {
	r := &producersResult{DurationSeconds: b.opts.producerDuration.Seconds(), Mode: b.opts.producerMode}
	defer func() {
		// Whatever happened, leave the trigger enabled.
		_ = b.db.exec(context.WithoutCancel(ctx), `ALTER TABLE webhook_outbox ENABLE TRIGGER webhook_outbox_notify`)
	}()
	for _, c := range b.opts.producerConns {
		cmp, runs, err := b.producerComparison(ctx, c)
		r.Runs = append(r.Runs, runs...)
		if err != nil {
			return nil, err
		}
		r.Comparisons = append(r.Comparisons, cmp)
		cpu := ""
		if cmp.CPUPerCommitWith > 0 {
			cpu = fmt.Sprintf("; backend CPU %.1f vs %.1f µs per commit", cmp.CPUPerCommitWith, cmp.CPUPerCommitWithout)
		}
		split := ""
		if cmp.Split != nil {
			split = fmt.Sprintf("; split: cost %.1f%% (segments %.1f%% to %.1f%%), backend CPU %.1f vs %.1f µs per commit",
				cmp.Split.CostPercent, cmp.Split.CostRange[0], cmp.Split.CostRange[1], cmp.Split.CPUPerCommitWith, cmp.Split.CPUPerCommitWithout)
		}
		b.logf("  %d producers: %.0f commits/s with the trigger, %.0f without: cost %.1f%% (pairs %.1f%% to %.1f%%)%s%s",
			c, cmp.WithTrigger, cmp.WithoutTrigger, cmp.CostPercent, cmp.PairCostRange[0], cmp.PairCostRange[1], cpu, split)
	}
	return r, nil
}

// producerSegment is what one segment asks of each producer: whether its inserts fire the
// trigger.
type producerSegment struct {
	split   bool
	trigger []bool // by producer
}

// producerSegments lays out reps rounds for n producers: a whole pair (ABBA across rounds) and,
// when the trigger can be switched per session, a split pair (each half with the trigger once).
func producerSegments(n, reps int, perSession bool) []producerSegment {
	all := func(on bool) producerSegment {
		s := producerSegment{trigger: make([]bool, n)}
		for i := range s.trigger {
			s.trigger[i] = on
		}
		return s
	}
	half := func(parity int) producerSegment {
		s := producerSegment{split: true, trigger: make([]bool, n)}
		for i := range s.trigger {
			s.trigger[i] = i%2 == parity
		}
		return s
	}
	var segs []producerSegment
	for r := range reps {
		first := r%2 == 0 // ABBA: with, without, without, with, ...
		segs = append(segs, all(first), all(!first))
		if perSession && n >= 2 {
			segs = append(segs, half(r%2), half(1-r%2))
		}
	}
	return segs
}

// producerComparison runs nconns producers through the segments of producerSegments.
func (b *bench) producerComparison(ctx context.Context, nconns int) (producerComparison, []producerRun, error) {
	cmp := producerComparison{Connections: nconns}
	var runs []producerRun
	if err := b.resetTables(ctx); err != nil {
		return cmp, nil, err
	}
	if err := b.db.exec(ctx, `ALTER TABLE webhook_outbox ENABLE TRIGGER webhook_outbox_notify`); err != nil {
		return cmp, nil, err
	}
	// Whether this role may set session_replication_role: a local setting, gone with the
	// statement's own transaction.
	perSession := b.db.exec(ctx, `SELECT set_config('session_replication_role', 'replica', true)`) == nil
	if b.opts.producerNull && !perSession {
		return cmp, nil, fmt.Errorf("--producer-null needs a role that may set session_replication_role")
	}
	if !perSession {
		b.logf("  this role may not set session_replication_role: switching the trigger with ALTER TABLE, whole segments only")
	}
	cmp.SwitchedPerSession = perSession
	settle := tableSwitchSettle
	if perSession {
		settle = sessionSwitchSettle
	}
	segs := producerSegments(nconns, b.opts.producerReps, perSession)
	total := time.Duration(len(segs)) * (b.opts.producerDuration + settle)
	// Enough backlog that the dispatcher stays busy through the run at a generous drain rate.
	if err := b.prefill(ctx, max(20000, int(8000*(total.Seconds()+2)))); err != nil {
		return cmp, nil, err
	}
	s, err := b.startSession(ctx, nil)
	if err != nil {
		return cmp, nil, err
	}
	defer s.stop()
	if _, err := b.consumer.waitReceived(ctx, 1, 30*time.Second, s.disp); err != nil {
		return cmp, nil, err
	}
	conns, closeConns, err := b.producerConns(ctx, nconns, b.opts.producerMode)
	if err != nil {
		return cmp, nil, err
	}
	defer closeConns()
	backends, err := backendPIDs(ctx, conns)
	if err != nil {
		return cmp, nil, err
	}

	commits := make([]atomic.Int64, nconns)
	var current atomic.Pointer[producerSegment]
	var failure atomic.Pointer[error]
	runCtx, stopProducers := context.WithCancel(ctx)
	// One failure ends the run with its error: a broken connection would fail every later
	// statement at once and spin on a CPU the other producers need.
	fail := func(err error) {
		if runCtx.Err() == nil {
			failure.CompareAndSwap(nil, &err)
			stopProducers()
		}
	}
	if b.opts.producerNull {
		cmp.NullControl = true
		for _, conn := range conns {
			if err := setReplicationRole(ctx, conn, true); err != nil {
				return cmp, nil, fmt.Errorf("null control: %w", err)
			}
		}
	}
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Go(func() {
			// A string: without a prepared statement to describe, pgx would send []byte as bytea.
			pad := string(b.payload(0))
			var id pgtype.UUID
			firing := true
			for runCtx.Err() == nil {
				if seg := current.Load(); perSession && seg != nil && seg.trigger[i] != firing {
					// The null control switches too (the same SET), but never to the trigger.
					if err := setReplicationRole(runCtx, conn, !seg.trigger[i] || b.opts.producerNull); err != nil {
						fail(fmt.Errorf("switching a producer's trigger: %w", err))
						return
					}
					firing = seg.trigger[i]
				}
				if err := conn.QueryRow(runCtx, benchInsert, "bench.producers", pad).Scan(&id); err != nil {
					fail(fmt.Errorf("a producer's insert: %w", err))
					return
				}
				commits[i].Add(1)
			}
		})
	}
	stop := func() {
		stopProducers()
		wg.Wait()
	}
	defer stop()

	var with, without, pairCosts, splitCosts, splitPairCosts []float64
	var pendingRatio float64 // the first segment of a split pair's with/without ratio
	var whole, split runTotals
	cpuOK := backends != nil
	tableFiring := true
	for k, seg := range segs {
		if !perSession && seg.trigger[0] != tableFiring {
			state := "DISABLE"
			if seg.trigger[0] {
				state = "ENABLE"
			}
			if err := b.db.exec(ctx, `ALTER TABLE webhook_outbox `+state+` TRIGGER webhook_outbox_notify`); err != nil {
				return cmp, runs, err
			}
			tableFiring = seg.trigger[0]
		}
		current.Store(&seg)
		if err := sleepCtx(runCtx, settle); err != nil {
			break
		}
		m0 := s.disp.scrape(ctx)
		c0, t0 := snapshotCommits(commits), time.Now()
		cpu0, ok0 := ticksEach(backends)
		if err := sleepCtx(runCtx, b.opts.producerDuration); err != nil {
			break
		}
		c1, t1 := snapshotCommits(commits), time.Now()
		cpu1, ok1 := ticksEach(backends)
		m1 := s.disp.scrape(ctx)
		cpuOK = cpuOK && ok0 && ok1
		secs := t1.Sub(t0).Seconds()

		// Each side of the segment: its producers, their commits and their backends' CPU.
		var side [2]sideTotals // [without, with]
		for i := range conns {
			on := 0
			if seg.trigger[i] {
				on = 1
			}
			side[on].producers++
			side[on].commits += c1[i] - c0[i]
			if cpuOK {
				side[on].ticks += cpu1[i] - cpu0[i]
			}
		}
		for on, sd := range side {
			if sd.producers == 0 {
				continue
			}
			run := producerRun{Connections: nconns, Producers: sd.producers, Trigger: on == 1, Split: seg.split, Commits: sd.commits}
			run.CommitsPerSecond = float64(sd.commits) / secs
			if cpuOK && sd.commits > 0 {
				run.BackendCPUPerCommit = float64(sd.ticks) * 1e6 / clockTicks / float64(sd.commits)
			}
			if m0.ok && m1.ok {
				run.NotifyWakeups = m1.Wakeups["notify"] - m0.Wakeups["notify"]
				run.EmptyClaims = m1.EmptyClaims - m0.EmptyClaims
				run.Released = m1.Released - m0.Released
			}
			runs = append(runs, run)
		}
		if m0.ok && m1.ok && slices.Contains(seg.trigger, true) {
			cmp.NotifyWakeups += m1.Wakeups["notify"] - m0.Wakeups["notify"]
		}
		if seg.split {
			split.add(side)
			perWith := float64(side[1].commits) / float64(side[1].producers)
			perWithout := float64(side[0].commits) / float64(side[0].producers)
			if perWithout > 0 {
				ratio := perWith / perWithout
				splitCosts = append(splitCosts, 100*(1-ratio))
				// A split pair is two segments with the halves swapped: the geometric mean of
				// their ratios cancels whatever favours one half of the connections (the
				// null control, --producer-null, read +3.6–4.4% per segment with no trigger
				// on either side).
				if pendingRatio > 0 {
					splitPairCosts = append(splitPairCosts, 100*(1-math.Sqrt(pendingRatio*ratio)))
					pendingRatio = 0
				} else {
					pendingRatio = ratio
				}
			}
			b.logf("  %d producers, segment %d split: %.0f commits/s per producer with the trigger, %.0f without",
				nconns, k+1, perWith/secs, perWithout/secs)
			continue
		}
		whole.add(side)
		pendingRatio = 0 // split pairs are consecutive: a whole segment ends one
		rate := float64(side[0].commits+side[1].commits) / secs
		if seg.trigger[0] {
			with = append(with, rate)
		} else {
			without = append(without, rate)
		}
		if len(with) == len(without) && without[len(without)-1] > 0 {
			// A whole pair just completed: its two segments are neighbours.
			pairCosts = append(pairCosts, 100*(1-with[len(with)-1]/without[len(without)-1]))
		}
		dispatcher := "dispatcher's metrics not scraped"
		if m0.ok && m1.ok {
			dispatcher = fmt.Sprintf("%.0f NOTIFY wake-ups, %.0f empty claims", m1.Wakeups["notify"]-m0.Wakeups["notify"], m1.EmptyClaims-m0.EmptyClaims)
		} else if err := errors.Join(m0.scrapeFailed, m1.scrapeFailed); err != nil {
			dispatcher += ": " + err.Error()
		} else {
			dispatcher += ": no claim counted yet"
		}
		b.logf("  %d producers, segment %d %s the trigger: %.0f commits/s (%s)",
			nconns, k+1, map[bool]string{true: "with", false: "without"}[seg.trigger[0]], rate, dispatcher)
	}
	stop()
	if err := failure.Load(); err != nil {
		return cmp, runs, *err
	}
	if err := ctx.Err(); err != nil {
		return cmp, runs, err
	}
	var n int64
	for i := range commits {
		n += commits[i].Load()
	}
	b.db.stmts.Add(n)
	left, err := b.db.queryInt64(ctx, `SELECT count(*) FROM webhook_outbox WHERE NOT processed`)
	if err != nil {
		return cmp, runs, err
	}
	cmp.BusyThroughout = left > 0
	closeConns()
	if err := s.stop(); err != nil {
		return cmp, runs, err
	}

	cmp.WithTrigger, cmp.WithoutTrigger = median(with), median(without)
	cmp.WithRange = minMax(with)
	cmp.WithoutRange = minMax(without)
	cmp.CostPercent = median(pairCosts)
	cmp.PairCostRange = minMax(pairCosts)
	cmp.Pairs = len(pairCosts)
	if cpuOK {
		cmp.CPUPerCommitWith, cmp.CPUPerCommitWithout = whole.cpuPerCommit()
	}
	if len(splitCosts) > 0 {
		sp := &splitComparison{
			CostPercent: median(splitPairCosts),
			CostRange:   minMax(splitCosts),
			Segments:    len(splitCosts),
			Pairs:       len(splitPairCosts),
		}
		if cpuOK {
			sp.CPUPerCommitWith, sp.CPUPerCommitWithout = split.cpuPerCommit()
		}
		cmp.Split = sp
	}
	return cmp, runs, nil
}

// sideTotals is one side (with or without the trigger) of a segment.
type sideTotals struct {
	producers      int
	commits, ticks int64
}

// runTotals adds up both sides over a run's segments of one design: [without, with].
type runTotals [2]sideTotals

func (t *runTotals) add(side [2]sideTotals) {
	for i := range t {
		t[i].commits += side[i].commits
		t[i].ticks += side[i].ticks
	}
}

// cpuPerCommit is each side's backend CPU per commit in µs, or zeros when a side has none.
func (t *runTotals) cpuPerCommit() (with, without float64) {
	if t[0].commits == 0 || t[1].commits == 0 {
		return 0, 0
	}
	per := func(s sideTotals) float64 { return float64(s.ticks) * 1e6 / clockTicks / float64(s.commits) }
	return per(t[1]), per(t[0])
}

// setReplicationRole puts a producer's session in replica mode (its inserts do not fire the
// trigger) or back to origin.
func setReplicationRole(ctx context.Context, conn *pgx.Conn, replica bool) error {
	role := "origin"
	if replica {
		role = "replica"
	}
	_, err := conn.Exec(ctx, "SET session_replication_role = "+role)
	return err
}

func snapshotCommits(c []atomic.Int64) []int64 {
	out := make([]int64, len(c))
	for i := range c {
		out[i] = c[i].Load()
	}
	return out
}

// backendPIDs returns the PostgreSQL backend processes serving conns, or nil when they are not
// processes of this machine (a remote DATABASE_URL): their CPU is then not measured.
func backendPIDs(ctx context.Context, conns []*pgx.Conn) ([]int, error) {
	pids := make([]int, 0, len(conns))
	for _, c := range conns {
		var pid int
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return nil, fmt.Errorf("reading a producer's backend pid: %w", err)
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil, nil
		}
		comm, _, err := statFields(stat)
		if err != nil || !strings.HasPrefix(comm, "postgres") {
			return nil, nil
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// ticksEach reads the CPU ticks of each of pids; false when any of them cannot be read.
func ticksEach(pids []int) ([]int64, bool) {
	if pids == nil {
		return nil, false
	}
	out := make([]int64, len(pids))
	for i, pid := range pids {
		t, err := procTicks(pid, false)
		if err != nil {
			return nil, false
		}
		out[i] = t
	}
	return out, true
}

// minMax is the smallest and largest of v, or zeros when v is empty (a run cut short).
func minMax(v []float64) [2]float64 {
	if len(v) == 0 {
		return [2]float64{}
	}
	return [2]float64{slices.Min(v), slices.Max(v)}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
