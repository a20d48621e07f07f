package main

// The producers workload: what the wake-up trigger costs the application's inserts.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// producers: commit throughput of C concurrent single-row producers with the trigger installed
// and with it disabled, each time while a dispatcher is busy draining a backlog: by design a
// busy dispatcher is not armed, so no insert should NOTIFY, and the comparison is the trigger's
// own cost under load. The NOTIFYs the dispatcher received anyway are reported.
func (b *bench) producers(ctx context.Context) (*producersResult, error) {
	r := &producersResult{DurationSeconds: b.opts.producerDuration.Seconds()}
	defer func() {
		// Whatever happened, leave the trigger enabled.
		_ = b.db.exec(context.WithoutCancel(ctx), `ALTER TABLE webhook_outbox ENABLE TRIGGER webhook_outbox_notify`)
	}()
	for _, c := range b.opts.producerConns {
		// ABBA order: drift in the machine's load over the runs hits both sides alike.
		var order []bool
		for rep := range b.opts.producerReps {
			if rep%2 == 0 {
				order = append(order, true, false)
			} else {
				order = append(order, false, true)
			}
		}
		cmp := producerComparison{Connections: c}
		var with, without []float64
		for _, trigger := range order {
			run, err := b.producerRun(ctx, c, trigger)
			if err != nil {
				return nil, err
			}
			r.Runs = append(r.Runs, run)
			if trigger {
				with = append(with, run.CommitsPerSecond)
			} else {
				without = append(without, run.CommitsPerSecond)
			}
		}
		// The median of the runs: on a machine shared with other work one disturbed run should
		// not decide the comparison. The spread is reported next to it.
		cmp.WithTrigger, cmp.WithoutTrigger = median(with), median(without)
		cmp.WithRange = [2]float64{slices.Min(with), slices.Max(with)}
		cmp.WithoutRange = [2]float64{slices.Min(without), slices.Max(without)}
		if cmp.WithoutTrigger > 0 {
			cmp.CostPercent = 100 * (cmp.WithoutTrigger - cmp.WithTrigger) / cmp.WithoutTrigger
		}
		r.Comparisons = append(r.Comparisons, cmp)
		b.logf("  %d producers: %.0f commits/s with the trigger, %.0f without: cost %.1f%%", c, cmp.WithTrigger, cmp.WithoutTrigger, cmp.CostPercent)
	}
	return r, nil
}

func (b *bench) producerRun(ctx context.Context, nconns int, trigger bool) (producerRun, error) {
	run := producerRun{Connections: nconns, Trigger: trigger}
	if err := b.resetTables(ctx); err != nil {
		return run, err
	}
	state := "ENABLE"
	if !trigger {
		state = "DISABLE"
	}
	if err := b.db.exec(ctx, `ALTER TABLE webhook_outbox `+state+` TRIGGER webhook_outbox_notify`); err != nil {
		return run, err
	}
	// Enough backlog that the dispatcher stays busy through the run at a generous drain rate.
	backlog := max(20000, int(8000*(b.opts.producerDuration.Seconds()+2)))
	if err := b.prefill(ctx, backlog); err != nil {
		return run, err
	}
	s, err := b.startSession(ctx, nil)
	if err != nil {
		return run, err
	}
	defer s.stop()
	if _, err := b.consumer.waitReceived(ctx, 1, 30*time.Second, s.disp); err != nil {
		return run, err
	}
	conns, closeConns, err := b.producerConns(ctx, nconns)
	if err != nil {
		return run, err
	}
	defer closeConns()
	var commits, failures atomic.Int64
	deadline := time.Now().Add(b.opts.producerDuration)
	started := time.Now()
	var wg sync.WaitGroup
	for _, conn := range conns {
		wg.Go(func() {
			pad := b.payload(0)
			var id pgtype.UUID
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if err := conn.QueryRow(ctx, benchInsert, "bench.producers", pad).Scan(&id); err != nil {
					failures.Add(1)
					continue
				}
				commits.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(started)
	if err := ctx.Err(); err != nil {
		return run, err
	}
	b.db.stmts.Add(commits.Load() + failures.Load())
	if f := failures.Load(); f > 0 {
		return run, fmt.Errorf("%d producer inserts failed", f)
	}
	closeConns()
	run.Commits = commits.Load()
	run.CommitsPerSecond = float64(run.Commits) / elapsed.Seconds()
	left, err := b.db.queryInt64(ctx, `SELECT count(*) FROM webhook_outbox WHERE NOT processed`)
	if err != nil {
		return run, err
	}
	run.BusyThroughout = left > 0
	st, err := b.consumer.stats(ctx)
	if err != nil {
		return run, err
	}
	run.Delivered = st.Received
	if m := s.disp.scrape(ctx); m.ok {
		run.NotifyWakeups, run.EmptyClaims, run.Released = m.Wakeups["notify"], m.EmptyClaims, m.Released
	}
	if err := s.stop(); err != nil {
		return run, err
	}
	trig := "with"
	if !trigger {
		trig = "without"
	}
	b.logf("  %d producers %s the trigger: %.0f commits/s (dispatcher delivered %d meanwhile, backlog left %d, %.0f NOTIFY wake-ups, %.0f empty claims)",
		nconns, trig, run.CommitsPerSecond, run.Delivered, left, run.NotifyWakeups, run.EmptyClaims)
	return run, nil
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
