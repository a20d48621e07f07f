package main

// The producers workload: what the wake-up trigger costs the application's inserts.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// toggleSettle is how long after switching the trigger a segment starts counting: ALTER TABLE
// waits for the producers' open transactions and holds the next ones back for a moment, and
// every producer re-plans its insert once; none of that is the trigger's cost.
const toggleSettle = 200 * time.Millisecond

// producers: commit throughput of C concurrent single-row producers with the trigger enabled
// and disabled while a dispatcher is busy draining a backlog. By design a busy dispatcher is
// not armed, so no insert should NOTIFY, and the comparison is the trigger's own cost under
// load. The NOTIFYs the dispatcher received anyway are reported.
//
// The two sides are not separate runs but alternating segments of one run: the producers keep
// inserting and the trigger is switched between segments (ABBA order), so each segment with
// the trigger has a neighbour without it, measured under the same dispatcher, backlog and
// machine load. Session 3 compared separate 3-second runs, each with its own prefill and
// dispatcher; on this shared 2-core VM their commit rates spread by 25% on either side, and
// the medians of 5 pairs swung between 2.5% and 15% for one binary. The cost reported is the
// median over the pairs of (1 − with/without). Where PostgreSQL runs on this machine the
// producers' backends' CPU per commit is reported too, which moves less with other load.
func (b *bench) producers(ctx context.Context) (*producersResult, error) {
	r := &producersResult{DurationSeconds: b.opts.producerDuration.Seconds()}
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
		b.logf("  %d producers: %.0f commits/s with the trigger, %.0f without: cost %.1f%% (pairs %.1f%% to %.1f%%)%s",
			c, cmp.WithTrigger, cmp.WithoutTrigger, cmp.CostPercent, cmp.PairCostRange[0], cmp.PairCostRange[1], cpu)
	}
	return r, nil
}

// producerComparison runs nconns producers through producerReps pairs of segments.
func (b *bench) producerComparison(ctx context.Context, nconns int) (producerComparison, []producerRun, error) {
	cmp := producerComparison{Connections: nconns}
	var runs []producerRun
	if err := b.resetTables(ctx); err != nil {
		return cmp, nil, err
	}
	if err := b.db.exec(ctx, `ALTER TABLE webhook_outbox ENABLE TRIGGER webhook_outbox_notify`); err != nil {
		return cmp, nil, err
	}
	segments := 2 * b.opts.producerReps
	total := time.Duration(segments) * (b.opts.producerDuration + toggleSettle)
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
	conns, closeConns, err := b.producerConns(ctx, nconns)
	if err != nil {
		return cmp, nil, err
	}
	defer closeConns()
	backends, err := backendPIDs(ctx, conns)
	if err != nil {
		return cmp, nil, err
	}

	var commits, failures atomic.Int64
	runCtx, stopProducers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, conn := range conns {
		wg.Go(func() {
			pad := b.payload(0)
			var id pgtype.UUID
			for runCtx.Err() == nil {
				if err := conn.QueryRow(runCtx, benchInsert, "bench.producers", pad).Scan(&id); err != nil {
					if runCtx.Err() == nil {
						failures.Add(1)
					}
					continue
				}
				commits.Add(1)
			}
		})
	}
	stop := func() {
		stopProducers()
		wg.Wait()
	}
	defer stop()

	var with, without, pairCosts []float64
	var cpuWith, cpuWithout, commitsWith, commitsWithout int64
	cpuOK := backends != nil
	for seg := range segments {
		// ABBA: with, without, without, with, ...
		trigger := seg%4 == 0 || seg%4 == 3
		state := "DISABLE"
		if trigger {
			state = "ENABLE"
		}
		if err := b.db.exec(ctx, `ALTER TABLE webhook_outbox `+state+` TRIGGER webhook_outbox_notify`); err != nil {
			return cmp, runs, err
		}
		if err := sleepCtx(ctx, toggleSettle); err != nil {
			return cmp, runs, err
		}
		m0 := s.disp.scrape(ctx)
		n0, t0 := commits.Load(), time.Now()
		cpu0, ok0 := ticksOf(backends)
		if err := sleepCtx(ctx, b.opts.producerDuration); err != nil {
			return cmp, runs, err
		}
		n1, t1 := commits.Load(), time.Now()
		cpu1, ok1 := ticksOf(backends)
		m1 := s.disp.scrape(ctx)
		cpuOK = cpuOK && ok0 && ok1
		run := producerRun{Connections: nconns, Trigger: trigger, Commits: n1 - n0}
		run.CommitsPerSecond = float64(run.Commits) / t1.Sub(t0).Seconds()
		if m0.ok && m1.ok {
			run.NotifyWakeups = m1.Wakeups["notify"] - m0.Wakeups["notify"]
			run.EmptyClaims = m1.EmptyClaims - m0.EmptyClaims
			run.Released = m1.Released - m0.Released
		}
		if cpuOK && run.Commits > 0 {
			run.BackendCPUPerCommit = float64(cpu1-cpu0) * 1e6 / clockTicks / float64(run.Commits)
		}
		runs = append(runs, run)
		if trigger {
			with = append(with, run.CommitsPerSecond)
			cpuWith += cpu1 - cpu0
			commitsWith += run.Commits
			cmp.NotifyWakeups += run.NotifyWakeups
		} else {
			without = append(without, run.CommitsPerSecond)
			cpuWithout += cpu1 - cpu0
			commitsWithout += run.Commits
		}
		if seg%2 == 1 && without[len(without)-1] > 0 {
			// The pair just completed: its two segments are neighbours.
			pairCosts = append(pairCosts, 100*(1-with[len(with)-1]/without[len(without)-1]))
		}
		b.logf("  %d producers, segment %d %s the trigger: %.0f commits/s (%.0f NOTIFY wake-ups, %.0f empty claims)",
			nconns, seg+1, map[bool]string{true: "with", false: "without"}[trigger], run.CommitsPerSecond, run.NotifyWakeups, run.EmptyClaims)
	}
	stop()
	if f := failures.Load(); f > 0 {
		return cmp, runs, fmt.Errorf("%d producer inserts failed", f)
	}
	b.db.stmts.Add(commits.Load())
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
	cmp.WithRange = [2]float64{slices.Min(with), slices.Max(with)}
	cmp.WithoutRange = [2]float64{slices.Min(without), slices.Max(without)}
	cmp.CostPercent = median(pairCosts)
	cmp.PairCostRange = [2]float64{slices.Min(pairCosts), slices.Max(pairCosts)}
	if cpuOK && commitsWith > 0 && commitsWithout > 0 {
		cmp.CPUPerCommitWith = float64(cpuWith) * 1e6 / clockTicks / float64(commitsWith)
		cmp.CPUPerCommitWithout = float64(cpuWithout) * 1e6 / clockTicks / float64(commitsWithout)
	}
	return cmp, runs, nil
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

// ticksOf sums the CPU ticks of pids; false when any of them cannot be read.
func ticksOf(pids []int) (int64, bool) {
	if pids == nil {
		return 0, false
	}
	var sum int64
	for _, pid := range pids {
		t, err := procTicks(pid, false)
		if err != nil {
			return 0, false
		}
		sum += t
	}
	return sum, true
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
