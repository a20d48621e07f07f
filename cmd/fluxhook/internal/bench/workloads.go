package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/bench/produce"
)

// benchInsert is the producer's statement: one row, its own transaction, as an application
// written for the original would insert it.
const benchInsert = benchMark + `INSERT INTO webhook_outbox (event_type, payload) VALUES ($1, $2::jsonb) RETURNING delivery_id`

// session is one dispatcher child and the counters around its life: a workload's cost.
type session struct {
	b           *bench
	disp        *dispatcherProc
	before      pgCounters
	after       pgCounters // read by cost, after the dispatcher stopped
	redisBefore int64
	// The measured part: from the dispatcher's start unless startClock moves it.
	cpuStart, cpuEnd     cpuSnapshot
	clockStart, clockEnd time.Time
	clockDone            bool
	stopped              bool
	// baseline says the dispatcher is a baseline's (--baseline): no /metrics to read, and
	// its statements cannot be told apart from its producer's.
	baseline bool
}

// startSession reads the counters and starts a dispatcher with the bench's configuration plus
// overrides (an empty value removes the setting). Call stop (also on error paths) and, for a
// cost report, cost before it.
func (b *bench) startSession(ctx context.Context, overrides map[string]string) (*session, error) {
	s := &session{b: b}
	var err error
	if s.before, err = b.db.counters(ctx); err != nil {
		return nil, err
	}
	if s.redisBefore, err = b.redis.commands(ctx); err != nil {
		return nil, err
	}
	env := make(map[string]string, len(b.dispatcherEnv)+len(overrides))
	for k, v := range b.dispatcherEnv {
		env[k] = v
	}
	for k, v := range overrides {
		if v == "" {
			delete(env, k)
			continue
		}
		env[k] = v
	}
	if b.opts.profileDir != "" {
		b.sessions++
		dir, err := filepath.Abs(filepath.Join(b.opts.profileDir, fmt.Sprintf("%s-%d", b.workload, b.sessions)))
		if err != nil {
			return nil, err
		}
		env["PROFILE_DIR"] = dir
	}
	s.cpuStart, s.clockStart = b.cpuSnapshot(0), time.Now()
	if s.disp, err = startDispatcher(ctx, b.exe, env); err != nil {
		return nil, err
	}
	b.logf("  dispatcher pid %d ready after %s", s.disp.pid(), time.Since(s.disp.started).Round(time.Millisecond))
	return s, nil
}

// startClock marks the start of the measured part (default: the dispatcher's start).
func (s *session) startClock() {
	s.cpuStart, s.clockStart = s.b.cpuSnapshot(s.disp.pid()), time.Now()
}

// stopClock marks the end of the measured part, before any bookkeeping.
func (s *session) stopClock() {
	s.cpuEnd, s.clockEnd, s.clockDone = s.b.cpuSnapshot(s.disp.pid()), time.Now(), true
}

// stop ends the dispatcher (SIGTERM: it drains, unregisters and exits). Safe to call twice.
func (s *session) stop() error {
	if s.stopped {
		return nil
	}
	s.stopped = true
	return s.disp.stop(30 * time.Second)
}

// cost stops the dispatcher and reports what the workload cost per delivered event.
func (s *session) cost(ctx context.Context, events int) (*costReport, error) {
	if !s.clockDone {
		s.stopClock()
	}
	c := &costReport{Events: events}
	if rss, err := procPeakRSS(s.disp.pid()); err == nil {
		c.PeakRSSMB = float64(rss) / (1 << 20)
	}
	m := dispatcherMetrics{}
	if !s.baseline {
		m = s.disp.scrape(ctx)
	}
	if err := s.stop(); err != nil {
		return nil, err
	}
	after, err := s.b.db.counters(ctx)
	if err != nil {
		return nil, err
	}
	s.after = after
	redisAfter, err := s.b.redis.commands(ctx)
	if err != nil {
		return nil, err
	}
	d := s.b.db.delta(s.before, after)
	perEvent := func(n float64) float64 {
		if events == 0 {
			return 0
		}
		return n / float64(events)
	}
	const tickMicros = 1e6 / clockTicks
	c.CPUMicrosPerEvent = perEvent(float64(s.cpuEnd.dispatcher-s.cpuStart.dispatcher) * tickMicros)
	c.ConsumerCPUMicrosPerEvent = perEvent(float64(s.cpuEnd.consumer-s.cpuStart.consumer) * tickMicros)
	c.CPU = shares(s.cpuStart, s.cpuEnd, s.clockEnd.Sub(s.clockStart).Seconds())
	if s.cpuStart.postgresOK && s.cpuEnd.postgresOK {
		v := perEvent(float64(s.cpuEnd.postgres-s.cpuStart.postgres) * tickMicros)
		c.PostgresCPUMicrosPerEvent = &v
	}
	c.PGCommitsPerEvent = perEvent(float64(d.Commits))
	if d.Statements >= 0 && !s.baseline {
		v := perEvent(float64(d.Statements))
		c.PGStatementsPerEvent = &v
		c.TopStatements = d.Top
	}
	var redisCmds float64
	if s.redisBefore >= 0 {
		redisCmds = float64(max(redisAfter-s.redisBefore-1, 0)) // -1: our own first INFO
		c.RedisServer = true
	}
	c.RedisCommandsPerEvent = perEvent(redisCmds)
	switch {
	case s.baseline:
	case m.scrapeFailed != nil:
		c.MetricsError = "the dispatcher's /metrics could not be read: " + m.scrapeFailed.Error()
	case !m.ok:
		c.MetricsError = "the dispatcher claimed nothing"
	}
	if m.ok {
		batches := m.Claims - m.EmptyClaims
		c.Claims, c.ClaimedBatches, c.Settles = m.Claims, batches, m.Settles
		c.Wakeups, c.Released = m.Wakeups, m.Released
		if batches > 0 {
			c.RowsPerBatch = m.ClaimedRows / batches
			c.ClaimsPerBatch = m.Claims / batches
			c.SettlesPerBatch = m.Settles / batches
			c.RedisCommandsPerBatch = redisCmds / batches
			c.RedisRoundTripsPerBatch = m.GateDecides / batches
			if d.Statements >= 0 {
				v := float64(d.Statements) / batches
				c.StatementsPerBatch = &v
			}
		}
		if m.Settles > 0 {
			c.RowsPerSettle = m.SettledRows / m.Settles
			c.RedisRoundTripsPerSettle = m.GateRecords / m.Settles
		}
	}
	return c, nil
}

// resetTables empties the outbox, the delivery log and the dead letters between workloads
// (the dispatcher is stopped), so that each starts from the same state.
func (b *bench) resetTables(ctx context.Context) error {
	if err := b.db.exec(ctx, `TRUNCATE webhook_delivery_log, webhook_dead_letter`); err != nil {
		return err
	}
	// The log's partitions go too: each workload's dispatcher makes them for its own retention
	// (a soak's minutes, not the default's days).
	if err := b.db.exec(ctx, `DO $$
		DECLARE p regclass;
		BEGIN
			FOR p IN SELECT inhrelid::regclass FROM pg_inherits
			         WHERE inhparent = 'webhook_delivery_log'::regclass AND inhrelid <> 'webhook_delivery_log_default'::regclass
			LOOP
				EXECUTE format('DROP TABLE %s', p);
			END LOOP;
		END $$`); err != nil {
		return err
	}
	return b.resetQueue(ctx)
}

// resetQueue empties the outbox, forgets the dispatchers and resets the consumer, leaving the
// delivery log and the dead letters as they are: what resetTables does between workloads, and
// what the api workload does between its runs on a filled log.
func (b *bench) resetQueue(ctx context.Context) error {
	if err := b.db.exec(ctx, `TRUNCATE webhook_outbox`); err != nil {
		return err
	}
	if b.river != nil {
		// Each run, fluxhook's or River's, starts with both queues empty: neither pays for
		// the other's dead rows (autovacuum) in its window.
		if err := b.db.exec(ctx, `TRUNCATE river_job`); err != nil {
			return err
		}
		if err := b.db.exec(ctx, `DELETE FROM river_leader`); err != nil {
			return err
		}
	}
	if err := b.db.exec(ctx, `DELETE FROM webhook_dispatcher`); err != nil {
		return err
	}
	// Each run starts as if no dispatcher had ever been idle: the previous workload's
	// dispatcher may have left producers' NOTIFY switch set for a few more seconds.
	if err := b.db.exec(ctx, `SELECT setval('webhook_outbox_notify_until', 0, false)`); err != nil {
		return err
	}
	return b.consumer.reset(ctx)
}

// payload is an event body with about payloadBytes of padding (see produce.Payload).
func (b *bench) payload(seq int) []byte { return produce.Payload(seq, b.opts.payloadBytes) }

// prefill inserts n events of the drain's type with the dispatcher stopped (see copyPrefill).
func (b *bench) prefill(ctx context.Context, n int) error {
	return b.prefillType(ctx, n, "bench.drain")
}

// prefillType is prefill with events of type eventType.
func (b *bench) prefillType(ctx context.Context, n int, eventType string) error {
	pad := b.payload(0)
	return b.copyPrefill(ctx, n, "", []string{"event_type", "payload"}, func(int) []any { return []any{eventType, pad} })
}

// copyPrefill is every workload's prefill: n rows of webhook_outbox's columns, row(i) the i-th
// (from 0), with COPY while no dispatcher runs, then ANALYZE, so that the claim is planned on
// current statistics whatever autovacuum has managed so far. what describes the rows in the
// progress line after "prefilled n events".
func (b *bench) copyPrefill(ctx context.Context, n int, what string, columns []string, row func(i int) []any) error {
	started := time.Now()
	conn, err := b.db.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	i := 0
	b.db.stmts.Add(2) // the COPY and pgx's describe of its columns
	copied, err := conn.CopyFrom(ctx, pgx.Identifier{"webhook_outbox"}, columns,
		pgx.CopyFromFunc(func() ([]any, error) {
			if i >= n {
				return nil, nil
			}
			r := row(i)
			i++
			if i%200000 == 0 {
				b.logf("  prefilled %d of %d", i, n)
			}
			return r, nil
		}))
	if err != nil {
		return fmt.Errorf("prefill (COPY): %w", err)
	}
	if copied != int64(n) {
		return fmt.Errorf("prefill (COPY): %d rows copied, want %d", copied, n)
	}
	if err := b.db.exec(ctx, `ANALYZE webhook_outbox`); err != nil {
		return err
	}
	b.logf("  prefilled %d events%s with COPY in %s", n, what, time.Since(started).Round(time.Millisecond))
	return nil
}

// collect waits until the consumer has every one of want distinct deliveries, (event, path)
// pairs, (or timeout) and returns the arrivals.
func (b *bench) collect(ctx context.Context, want int, timeout time.Duration, disp *dispatcherProc, s *session) ([]arrivalRecord, consumerStats, error) {
	deadline := time.Now().Add(timeout)
	st, err := b.consumer.waitReceived(ctx, want, timeout, disp)
	if s != nil {
		s.stopClock()
	}
	if err != nil && (ctx.Err() != nil || (disp != nil && disp.exited())) {
		return nil, st, err // interrupted, or the dispatcher died: nothing more will arrive
	}
	for {
		arr, err := b.consumer.arrivals(ctx)
		if err != nil {
			return nil, st, err
		}
		if uniqueCount(arr) >= want || time.Now().After(deadline) {
			st, err := b.consumer.stats(ctx)
			return arr, st, err
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return nil, st, err
		}
	}
}

// uniqueCount counts the distinct deliveries: (event, path) pairs.
func uniqueCount(arr []arrivalRecord) int {
	seen := make(map[arrivalKey]struct{}, len(arr))
	for _, a := range arr {
		seen[a.key()] = struct{}{}
	}
	return len(seen)
}

// firstArrivals maps each delivery id to its first arrival (ns), and counts the extra ones.
func firstArrivals(arr []arrivalRecord) (map[[16]byte]int64, int) {
	first := make(map[[16]byte]int64, len(arr))
	dups := 0
	for _, a := range arr {
		if t, ok := first[a.id]; ok {
			dups++
			if a.ns < t {
				first[a.id] = a.ns
			}
			continue
		}
		first[a.id] = a.ns
	}
	return first, dups
}

// sortedFirstTimes are the first-arrival times in order.
func sortedFirstTimes(arr []arrivalRecord) []int64 {
	first, _ := firstArrivals(arr)
	times := make([]int64, 0, len(first))
	for _, t := range first {
		times = append(times, t)
	}
	slices.Sort(times)
	return times
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// drainTimeout bounds a drain of n events: generous, at 500 events/s.
func drainTimeout(n int) time.Duration { return 60*time.Second + time.Duration(n)*2*time.Millisecond }

// prefilledSession empties the tables, prefills n events with the dispatcher stopped, then
// starts a dispatcher session: the common start of the drain and backlog workloads.
func (b *bench) prefilledSession(ctx context.Context, n int) (*session, error) {
	if err := b.resetTables(ctx); err != nil {
		return nil, err
	}
	if err := b.prefill(ctx, n); err != nil {
		return nil, err
	}
	return b.startSession(ctx, nil)
}

// drain: prefill N events with the dispatcher stopped, start it, time until the consumer has
// all N.
func (b *bench) drain(ctx context.Context) (*drainResult, error) {
	return b.drainRun(ctx, b.prefilledSession)
}

// drainRun is the drain of the session that start returns with n events prefilled: fluxhook's
// (prefilledSession) or a baseline's (riverPrefilledSession).
func (b *bench) drainRun(ctx context.Context, start func(context.Context, int) (*session, error)) (*drainResult, error) {
	n := b.opts.drainEvents
	s, err := start(ctx, n)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	arr, st, err := b.collect(ctx, n, drainTimeout(n), s.disp, s)
	if err != nil {
		return nil, err
	}
	times := sortedFirstTimes(arr)
	r := &drainResult{Events: n, Received: len(times), Duplicates: len(arr) - len(times), Rejected: st.Rejected}
	r.Lost = n - len(times)
	r.Seconds, r.EventsPerSecond, r.StartupMS, r.SteadyEventsPerSecond = drainRates(s.disp.started.UnixNano(), times)
	if r.Cost, err = s.cost(ctx, len(times)); err != nil {
		return nil, err
	}
	b.logf("  %d events in %.2f s: %.0f events/s", r.Received, r.Seconds, r.EventsPerSecond)
	return r, nil
}

// backlog: like drain with a large backlog, reporting throughput per slice of events and the
// claim statement's mean time per slice (with pg_stat_statements).
func (b *bench) backlog(ctx context.Context) (*backlogResult, error) {
	n := b.opts.backlogEvents
	s, err := b.prefilledSession(ctx, n)
	if err != nil {
		return nil, err
	}
	defer s.stop()

	// Sample the claim statement's cumulative calls and time whenever a slice completes.
	var monitor *pgx.Conn
	if b.db.pgss {
		if monitor, err = b.db.connect(ctx); err != nil {
			return nil, err
		}
	}
	type claimSample struct {
		calls  int64
		timeMS float64
	}
	sampleClaims := func() (claimSample, bool) {
		if monitor == nil {
			return claimSample{}, false
		}
		var cs claimSample
		b.db.stmts.Add(1)
		err := monitor.QueryRow(ctx, benchMark+`SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)
			FROM pg_stat_statements WHERE dbid = $1 AND query LIKE '%SKIP LOCKED%' AND query LIKE '%lease_until = now()%'`,
			b.db.oid).Scan(&cs.calls, &cs.timeMS)
		return cs, err == nil && cs.calls > 0
	}
	var samples []claimSample
	first, _ := sampleClaims()
	samples = append(samples, first)
	slice := b.opts.backlogSlice
	nextBoundary := slice
	deadline := time.Now().Add(drainTimeout(n))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastLog := time.Now()
	for {
		st, err := b.consumer.stats(ctx)
		if err != nil {
			return nil, err
		}
		for st.Received >= nextBoundary && nextBoundary <= n {
			cs, _ := sampleClaims()
			samples = append(samples, cs)
			nextBoundary += slice
		}
		if time.Since(lastLog) > 10*time.Second {
			b.logf("  %d of %d delivered", st.Received, n)
			lastLog = time.Now()
		}
		if st.Received >= n {
			break
		}
		if s.disp.exited() {
			return nil, s.disp.failure()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the consumer received %d of %d events in time", st.Received, n)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
	if monitor != nil {
		_ = monitor.Close(context.Background())
	}
	arr, st, err := b.collect(ctx, n, time.Minute, s.disp, s)
	if err != nil {
		return nil, err
	}
	times := sortedFirstTimes(arr)
	r := &backlogResult{Events: n, Received: len(times), Duplicates: len(arr) - len(times), Rejected: st.Rejected, Lost: n - len(times)}
	start := s.disp.started.UnixNano()
	if len(times) > 0 {
		r.Seconds = float64(times[len(times)-1]-start) / 1e9
		r.EventsPerSecond = float64(len(times)) / r.Seconds
	}
	prev := start
	for k := 0; (k+1)*slice <= len(times); k++ {
		end := times[(k+1)*slice-1]
		sl := backlogSlice{From: k * slice, To: (k + 1) * slice, EventsPerSecond: float64(slice) / (float64(end-prev) / 1e9)}
		if k+1 < len(samples) && samples[k+1].calls > samples[k].calls {
			calls := samples[k+1].calls - samples[k].calls
			sl.ClaimMeanMS = (samples[k+1].timeMS - samples[k].timeMS) / float64(calls)
			sl.Claims = calls
		}
		r.Slices = append(r.Slices, sl)
		prev = end
	}
	r.setTrends()
	if r.Cost, err = s.cost(ctx, len(times)); err != nil {
		return nil, err
	}
	b.logf("  %d events in %.1f s: %.0f events/s, peak RSS %.0f MB", r.Received, r.Seconds, r.EventsPerSecond, r.Cost.PeakRSSMB)
	return r, nil
}

// summarize returns the percentiles of d in milliseconds (nearest rank).
func summarize(d []time.Duration) percentiles {
	if len(d) == 0 {
		return percentiles{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s))+0.999999) - 1
		i = min(max(i, 0), len(s)-1)
		return float64(s[i]) / 1e6
	}
	return percentiles{N: len(s), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: float64(s[len(s)-1]) / 1e6}
}

// shortQuery is a statement's text on one line, cut to n characters.
func shortQuery(q string, n int) string {
	var lines []string
	for _, line := range strings.Split(q, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "--") {
			continue
		}
		lines = append(lines, line)
	}
	s := strings.Join(lines, " ")
	if len([]rune(s)) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return s
}

// drainRates turns the sorted first-arrival times (Unix nanoseconds) of a drain that started at
// start into its duration in seconds, its rate, the milliseconds to the first arrival, and
// the rate after that first arrival (which leaves out the dispatcher's start-up); all zero
// when nothing arrived.
func drainRates(start int64, times []int64) (seconds, perSecond, startupMS, steadyPerSecond float64) {
	if len(times) == 0 {
		return 0, 0, 0, 0
	}
	end := times[len(times)-1]
	seconds = float64(end-start) / 1e9
	perSecond = float64(len(times)) / seconds
	startupMS = float64(times[0]-start) / 1e6
	if len(times) > 1 {
		steadyPerSecond = float64(len(times)-1) / (float64(end-times[0]) / 1e9)
	}
	return seconds, perSecond, startupMS, steadyPerSecond
}
