package bench

// The soak workload: a production week's shape, compressed. Events arrive without pause at a
// share (--soak-share) of the measured drain rate for --soak-duration, on one dispatcher
// session whose retention (WEBHOOK_RETENTION=--soak-retention) is short enough that the
// delivery log turns over several times during the run, and every --soak-interval the bench
// samples what sustained load does to the hot path: events delivered, insert → arrival
// latency, the claim statement's time, the queue's (webhook_outbox) size, dead tuples,
// autovacuum runs and unprocessed rows, and the delivery log's (webhook_delivery_log, all its
// partitions) size. Production starts --soak-warmup earlier: those samples are printed and
// marked, and the drift windows start after them. The first minute is the quietest of a run
// (in every run measured, its p99 was below the next minute's by a third to a half), while
// the delivery log is still empty and nothing is dropped from it: without the warm-up the
// drift checks compare that start with a steady state, not the steady state's beginning with
// its end. The budget: the last samples' p99 and claim time within 1.2× of the first ones'
// after the warm-up, the queue bounded (its size at the end of the run no larger than early
// on), the log's size bounded by retention.

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fluxora/fluxhook/stages/claim"
)

// soakJanitorInterval is how often, at most, the dispatcher's janitor drops the delivery log's
// partitions past WEBHOOK_RETENTION: on the first maintenance tick (every
// min(WEBHOOK_POLL_INTERVAL_MS, 30 s)) at least a minute after its last run, which with the
// default 10 s ticks is the seventh: about every 70 s (soakJanitorLag). It is not
// configurable: with a retention R the log holds between R and R + one partition
// (claim.LogPartitionStep) + 70 s of events.
const (
	soakJanitorInterval = time.Minute
	soakJanitorLag      = 70 * time.Second
)

// soakJanitorNote describes the janitor's schedule for the report.
const soakJanitorNote = "at most once a minute, on the dispatcher's maintenance tick (min(WEBHOOK_POLL_INTERVAL_MS, 30 s); with the default 10 s, about every 70 s); not configurable"

// soakStall is how long the bench waits, after the run, for an event while none arrives.
const soakStall = 30 * time.Second

// soakMinRetention is the shortest WEBHOOK_RETENTION the dispatcher accepts.
const soakMinRetention = time.Minute

// soakWindowSamples is how many samples at each end of the run the drift checks compare (the
// first and the last 5 minutes at the default interval); fewer on runs of under 10 samples.
const soakWindowSamples = 5

// soakDriftBudget is the budget of the drift checks (last window / first window) and of the
// queue's size (its largest in the last window / its largest in the first). soakLogSlack is
// the log's allowance over what retention keeps (see soakLogBudget), for the rate's variation.
const (
	soakDriftBudget = 1.2
	soakLogSlack    = 1.1
)

// soakLogBudget is the bound on the log's size at the end over its size one retention period
// into the run, when it held one retention of events: the log holds up to a retention, one
// partition and the janitor's lag, plus soakLogSlack.
func soakLogBudget(retention time.Duration) float64 {
	return soakLogSlack * float64(retention+claim.LogPartitionStep(retention)+soakJanitorLag) / float64(retention)
}

// benchClaimStatement and benchJanitorStatement pick the dispatcher's claim and janitor out of
// pg_stat_statements (literals in the bench's own query are normalised to $n, so it never
// matches itself).
const (
	benchClaimStatement   = `query LIKE '%SKIP LOCKED%' AND query LIKE '%lease_until = now()%'`
	benchJanitorStatement = `(query LIKE '%webhook_delivery_log_maintain%' OR (query LIKE '%DELETE FROM webhook_outbox%' AND query LIKE '%processed_at < now()%'))`
)

type soakResult struct {
	// The run: a producer at RatePerSecond (Share × DrainEventsPerSecond) from Connections
	// connections for Seconds (--soak-warmup and --soak-duration, whole numbers of
	// --soak-interval), on one dispatcher with WEBHOOK_RETENTION=Retention.
	Seconds          float64 `json:"duration_sec"`
	IntervalSeconds  float64 `json:"interval_sec"`
	Retention        string  `json:"retention"`
	RetentionSeconds float64 `json:"retention_sec"`
	// JanitorInterval describes the dispatcher's janitor schedule, fixed: see soakJanitorInterval.
	JanitorInterval      string  `json:"janitor_interval"`
	Share                float64 `json:"share"`
	DrainEventsPerSecond float64 `json:"drain_events_per_sec"`
	// DrainSource says where the drain rate comes from: this run's drain workload, or a drain
	// the soak ran first (Drain).
	DrainSource   string       `json:"drain_source"`
	Drain         *drainResult `json:"drain,omitempty"`
	RatePerSecond float64      `json:"rate_per_sec"`
	Connections   int          `json:"connections"`
	// Events were committed by the producer; Received arrived at the consumer (first
	// arrivals); Duplicates are arrivals that matched no event still waiting (redeliveries).
	Events int `json:"events"`
	// ProductionSeconds is from the start of production to the last commit: longer than
	// Seconds when the producer fell behind its schedule (the machine could not sustain the
	// rate: lower --soak-share), and then ProducedPerSecond is below RatePerSecond.
	ProductionSeconds float64 `json:"production_sec"`
	ProducedPerSecond float64 `json:"produced_per_sec"`
	Received          int     `json:"received"`
	Lost              int     `json:"lost"`
	Duplicates        int     `json:"duplicates"`
	Rejected          int     `json:"rejected"`
	// Samples are the intervals in order, the warm-up's first.
	Samples []soakSample `json:"samples"`
	// WarmupSamples is how many of Samples are the warm-up's (--soak-warmup), in no window.
	WarmupSamples int `json:"warmup_samples"`
	// After the last sample, the bench waits for the events still in flight (WaitSeconds),
	// until WaitEnded: every event arrived, none did for 30 s (Lost), or a quarter of the
	// run went by with the dispatcher still delivering (StillQueued: the queue had grown).
	// ArrivedAfterEnd arrived meanwhile, with latencies AfterEnd (and from their commit, and
	// their inserts' lateness); ProducedAfterEnd were committed after the last sample
	// (scheduled before it: the producer was behind), in Events but in no sample's Produced.
	WaitSeconds        float64     `json:"wait_after_end_sec"`
	WaitEnded          string      `json:"wait_ended"`
	StillQueued        int         `json:"still_queued"`
	ArrivedAfterEnd    int         `json:"arrived_after_end"`
	ProducedAfterEnd   int         `json:"produced_after_end"`
	AfterEnd           percentiles `json:"latency_after_end_from_scheduled_start"`
	AfterEndFromCommit percentiles `json:"latency_after_end_from_commit"`
	AfterEndLateness   percentiles `json:"start_lateness_after_end"`
	// ClaimTimeMissing says why the samples have no claim time (no pg_stat_statements).
	ClaimTimeMissing string `json:"claim_time_missing,omitempty"`
	// The drift checks: the first and the last Window samples (5, fewer on a short run).
	Window int        `json:"window_samples"`
	First  soakWindow `json:"first_window"`
	Last   soakWindow `json:"last_window"`
	// P99Ratio and ClaimRatio are the last window's over the first's (null: not computed).
	P99Ratio   *float64 `json:"p99_ratio"`
	ClaimRatio *float64 `json:"claim_time_ratio"`
	// UnprocessedAtEnd is webhook_outbox's unprocessed rows at the last sample (production's
	// end), UnprocessedBound one second of production.
	UnprocessedAtEnd int64 `json:"unprocessed_at_end"`
	UnprocessedBound int64 `json:"unprocessed_bound"`
	// QueueRatio is the queue's (webhook_outbox's) largest table + index bytes in the last
	// window over its largest in the window that starts a retention period into the run (at
	// LogReference), once the queue has seen the log turn over (null when LogRatio is).
	QueueRatio *float64 `json:"queue_size_ratio"`
	// The log's size bound: webhook_delivery_log's bytes (every partition, with indexes) at
	// the end over those at the first sample a retention period into the run (LogReference,
	// its index in Samples), against LogBudget; null, with LogRatioMissing saying why, on a
	// run shorter than two retention periods.
	LogReference    *int        `json:"log_reference_sample"`
	LogRatio        *float64    `json:"log_size_ratio"`
	LogBudget       float64     `json:"log_size_budget"`
	LogRatioMissing string      `json:"log_size_ratio_missing,omitempty"`
	Cost            *costReport `json:"cost"`
}

// soakSample is one interval of the soak.
type soakSample struct {
	// AtSeconds is when the sample was read, from the start of production.
	AtSeconds float64 `json:"at_sec"`
	// Warmup marks the warm-up's samples (--soak-warmup), in no drift window.
	Warmup          bool    `json:"warmup"`
	IntervalSeconds float64 `json:"interval_sec"`
	// Produced events committed and Delivered events arrived (first arrivals) in the interval.
	Produced          int     `json:"produced"`
	ProducedPerSecond float64 `json:"produced_per_sec"`
	Delivered         int     `json:"delivered"`
	EventsPerSecond   float64 `json:"delivered_per_sec"`
	// Latencies of the events that arrived in the interval: from the insert's scheduled start
	// (judged, as steady's), and from its commit; StartLateness is how far behind schedule the
	// interval's inserts started (the producer's delay, not the dispatcher's).
	FromScheduled percentiles `json:"latency_from_scheduled_start"`
	FromCommit    percentiles `json:"latency_from_commit"`
	StartLateness percentiles `json:"start_lateness"`
	// The claim statement's calls and mean time in the interval, and the janitor's calls and
	// total time (pg_stat_statements deltas; null without it).
	Claims      *int64   `json:"claims"`
	ClaimMeanMS *float64 `json:"claim_mean_ms"`
	JanitorRuns *int64   `json:"janitor_statements"`
	JanitorMS   *float64 `json:"janitor_ms"`
	// The queue, webhook_outbox, at the sample: pg_table_size, pg_indexes_size and each
	// index's size.
	TableBytes   int64            `json:"table_bytes"`
	IndexesBytes int64            `json:"indexes_bytes"`
	IndexBytes   map[string]int64 `json:"index_bytes"`
	// The delivery log, webhook_delivery_log: every partition's pg_total_relation_size, the
	// partitions (the default one included) and their live tuples.
	LogBytes      int64 `json:"log_bytes"`
	LogPartitions int   `json:"log_partitions"`
	LogRows       int64 `json:"log_rows"`
	// From pg_stat_user_tables: tuples now, autovacuum and autoanalyze runs since production
	// started, rows deleted and the share of HOT updates in the interval.
	LiveTuples       int64    `json:"n_live_tup"`
	DeadTuples       int64    `json:"n_dead_tup"`
	AutovacuumCount  int64    `json:"autovacuum_count"`
	AutoanalyzeCount int64    `json:"autoanalyze_count"`
	Deleted          int64    `json:"rows_deleted"`
	HOTPercent       *float64 `json:"hot_update_percent"`
	// Unprocessed rows in webhook_outbox (the queue, in flight included).
	Unprocessed int64 `json:"unprocessed"`
	// BackendWrites are the buffers PostgreSQL's client backends wrote out themselves in the
	// interval (null: not readable).
	BackendWrites *int64 `json:"backend_buffer_writes"`

	claimMS float64         // the claims' total time in the interval
	raw     []time.Duration // FromScheduled's values, kept for the windows
}

// soakWindow is the first or the last samples of a run, pooled.
type soakWindow struct {
	Samples int `json:"samples"`
	// P99MS is the p99 of every latency from the scheduled start in the window.
	P99MS       float64  `json:"p99_ms"`
	Claims      int64    `json:"claims"`
	ClaimMeanMS *float64 `json:"claim_mean_ms"`
}

// soakPending is a committed event waiting for its arrival.
type soakPending struct{ scheduled, commit int64 }

// soakTracker matches arrivals to the producer's events as the run goes, keeping only the
// events not yet arrived (a run of hours is millions of events) and the current interval's
// figures.
type soakTracker struct {
	mu      sync.Mutex
	pending map[[16]byte]soakPending
	// carry holds arrivals that matched no pending event: an arrival can overtake the
	// producer's registration of its event (the row is claimable at commit, before the
	// producer has read its RETURNING); at the next match it is either found or a duplicate.
	carry                           []arrivalRecord
	fromScheduled, fromCommit, late []time.Duration
	produced, delivered             int
	lastCommitNS                    int64
	received, duplicates            int
}

func newSoakTracker() *soakTracker {
	return &soakTracker{pending: map[[16]byte]soakPending{}}
}

func (t *soakTracker) register(id [16]byte, scheduled, start, commit int64) {
	t.mu.Lock()
	t.pending[id] = soakPending{scheduled, commit}
	t.late = append(t.late, time.Duration(max(start-scheduled, 0)))
	t.produced++
	t.lastCommitNS = max(t.lastCommitNS, commit)
	t.mu.Unlock()
}

func (t *soakTracker) lastCommit() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lastCommitNS
}

// match takes new arrivals. With done (every event registered) an arrival that matches no
// pending event is a duplicate at once; else it gets one more chance at the next match.
func (t *soakTracker) match(arr []arrivalRecord, done bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	found := func(a arrivalRecord) bool {
		p, ok := t.pending[a.id]
		if !ok {
			return false
		}
		delete(t.pending, a.id)
		t.fromScheduled = append(t.fromScheduled, time.Duration(a.ns-p.scheduled))
		t.fromCommit = append(t.fromCommit, time.Duration(a.ns-p.commit))
		t.delivered++
		t.received++
		return true
	}
	carried := t.carry
	t.carry = nil
	for _, a := range carried {
		if !found(a) {
			t.duplicates++
		}
	}
	for _, a := range arr {
		if found(a) {
			continue
		}
		if done {
			t.duplicates++
		} else {
			t.carry = append(t.carry, a)
		}
	}
}

// take returns the interval's figures and starts the next interval.
func (t *soakTracker) take() (fromScheduled, fromCommit, late []time.Duration, produced, delivered int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fromScheduled, fromCommit, late, produced, delivered = t.fromScheduled, t.fromCommit, t.late, t.produced, t.delivered
	t.fromScheduled, t.fromCommit, t.late, t.produced, t.delivered = nil, nil, nil, 0, 0
	return
}

func (t *soakTracker) waiting() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// soakCounters are the cumulative counters a sample is the difference of, and the sizes.
type soakCounters struct {
	at                      time.Time
	pgss                    bool
	claims, janitorRuns     int64
	claimMS, janitorMS      float64
	tableBytes, indexBytes  int64
	indexes                 map[string]int64
	live, dead              int64
	autovacuum, autoanalyze int64
	deleted, updates, hot   int64
	unprocessed             int64
	logBytes, logRows       int64
	logPartitions           int
	backendWrites           int64 // -1: not readable
}

// readSoakCounters reads webhook_outbox's sizes and statistics and, with pg_stat_statements,
// the claim's and the janitor's cumulative calls and time. Each statement is its own
// transaction, so that the statistics are current.
func (b *bench) readSoakCounters(ctx context.Context, conn *pgx.Conn) (soakCounters, error) {
	c := soakCounters{at: time.Now(), indexes: map[string]int64{}}
	b.db.stmts.Add(1)
	if err := conn.QueryRow(ctx, benchMark+`SELECT pg_table_size(s.relid), pg_indexes_size(s.relid),
		s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count, s.n_tup_del, s.n_tup_upd, s.n_tup_hot_upd,
		(SELECT count(*) FROM webhook_outbox WHERE NOT processed)
		FROM pg_stat_user_tables s WHERE s.relid = 'webhook_outbox'::regclass`).
		Scan(&c.tableBytes, &c.indexBytes, &c.live, &c.dead, &c.autovacuum, &c.autoanalyze, &c.deleted, &c.updates, &c.hot, &c.unprocessed); err != nil {
		return c, fmt.Errorf("reading webhook_outbox's size and statistics: %w", err)
	}
	b.db.stmts.Add(1)
	if err := conn.QueryRow(ctx, benchMark+`SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)::bigint, count(*),
		coalesce(sum(s.n_live_tup), 0)::bigint
		FROM pg_inherits i LEFT JOIN pg_stat_user_tables s ON s.relid = i.inhrelid
		WHERE i.inhparent = 'webhook_delivery_log'::regclass`).Scan(&c.logBytes, &c.logPartitions, &c.logRows); err != nil {
		return c, fmt.Errorf("reading webhook_delivery_log's size: %w", err)
	}
	// Buffers the client backends wrote themselves, evicting a dirty buffer to read another:
	// the log outgrowing shared_buffers makes the settles' backends write.
	// PostgreSQL 16 counts them in pg_stat_io, older ones in pg_stat_bgwriter.
	b.db.stmts.Add(1)
	writes := `SELECT buffers_backend FROM pg_stat_bgwriter`
	if b.db.versionNum >= 160000 {
		writes = `SELECT coalesce(sum(writes), 0)::bigint FROM pg_stat_io WHERE backend_type = 'client backend'`
	}
	if err := conn.QueryRow(ctx, benchMark+writes).Scan(&c.backendWrites); err != nil {
		c.backendWrites = -1
	}
	b.db.stmts.Add(1)
	rows, err := conn.Query(ctx, benchMark+`SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
		FROM pg_index i WHERE i.indrelid = 'webhook_outbox'::regclass`)
	if err != nil {
		return c, fmt.Errorf("reading webhook_outbox's index sizes: %w", err)
	}
	for rows.Next() {
		var name string
		var size int64
		if err := rows.Scan(&name, &size); err != nil {
			rows.Close()
			return c, err
		}
		c.indexes[name] = size
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return c, err
	}
	if !b.db.pgss {
		return c, nil
	}
	b.db.stmts.Add(1)
	if err := conn.QueryRow(ctx, benchMark+`SELECT
		coalesce(sum(calls) FILTER (WHERE `+benchClaimStatement+`), 0)::bigint,
		coalesce(sum(total_exec_time) FILTER (WHERE `+benchClaimStatement+`), 0)::float8,
		coalesce(sum(calls) FILTER (WHERE `+benchJanitorStatement+`), 0)::bigint,
		coalesce(sum(total_exec_time) FILTER (WHERE `+benchJanitorStatement+`), 0)::float8
		FROM pg_stat_statements WHERE dbid = $1`, b.db.oid).
		Scan(&c.claims, &c.claimMS, &c.janitorRuns, &c.janitorMS); err != nil {
		return c, fmt.Errorf("reading pg_stat_statements: %w", err)
	}
	c.pgss = true
	return c, nil
}

// soakSampleOf is the interval between two readings (the latencies are added by the caller).
func soakSampleOf(prev, cur soakCounters, start time.Time) soakSample {
	s := soakSample{
		AtSeconds:       cur.at.Sub(start).Seconds(),
		IntervalSeconds: cur.at.Sub(prev.at).Seconds(),
		TableBytes:      cur.tableBytes, IndexesBytes: cur.indexBytes, IndexBytes: cur.indexes,
		LiveTuples: cur.live, DeadTuples: cur.dead, AutovacuumCount: cur.autovacuum, AutoanalyzeCount: cur.autoanalyze,
		Deleted:     max(cur.deleted-prev.deleted, 0),
		Unprocessed: cur.unprocessed,
		LogBytes:    cur.logBytes, LogPartitions: cur.logPartitions, LogRows: cur.logRows,
	}
	if prev.backendWrites >= 0 && cur.backendWrites >= 0 {
		v := cur.backendWrites - prev.backendWrites
		s.BackendWrites = &v
	}
	if upd := cur.updates - prev.updates; upd > 0 {
		v := 100 * float64(cur.hot-prev.hot) / float64(upd)
		s.HOTPercent = &v
	}
	if prev.pgss && cur.pgss {
		calls, runs := cur.claims-prev.claims, cur.janitorRuns-prev.janitorRuns
		s.Claims, s.JanitorRuns = &calls, &runs
		s.claimMS = cur.claimMS - prev.claimMS
		jms := cur.janitorMS - prev.janitorMS
		s.JanitorMS = &jms
		if calls > 0 {
			v := s.claimMS / float64(calls)
			s.ClaimMeanMS = &v
		}
	}
	return s
}

// soakRetention is the WEBHOOK_RETENTION of a soak of d: --soak-retention, or d/6 (the log
// turns over about six times), at least the dispatcher's minimum.
func soakRetention(o benchOptions) time.Duration {
	if o.soakRetention > 0 {
		return o.soakRetention
	}
	return max((o.soakDuration / 6).Round(time.Second), soakMinRetention)
}

// soak: the drain rate first (this run's drain workload, or a drain of --drain-events), then
// one dispatcher session with the retention override and a steady producer at --soak-share of
// that rate, sampled every --soak-interval.
func (b *bench) soak(ctx context.Context, drain *drainResult) (*soakResult, error) {
	o := b.opts
	warm := int(o.soakWarmup / o.soakInterval)
	n := warm + int(o.soakDuration/o.soakInterval)
	retention := soakRetention(o)
	r := &soakResult{
		Seconds: (time.Duration(n) * o.soakInterval).Seconds(), IntervalSeconds: o.soakInterval.Seconds(),
		WarmupSamples: warm,
		Retention:     retention.String(), RetentionSeconds: retention.Seconds(),
		JanitorInterval: soakJanitorNote,
		Share:           o.soakShare, Connections: o.connections,
	}
	if drain != nil && drain.Received > 0 && drain.EventsPerSecond > 0 {
		r.DrainEventsPerSecond, r.DrainSource = drain.EventsPerSecond, "the drain workload of this run"
	} else {
		b.logf("  measuring the drain rate: %d events (--drain-events)", o.drainEvents)
		d, err := b.drain(ctx)
		if err != nil {
			return nil, fmt.Errorf("measuring the drain rate: %w", err)
		}
		r.Drain, r.DrainEventsPerSecond = d, d.EventsPerSecond
		r.DrainSource = fmt.Sprintf("a drain of %d events before the soak (--drain-events)", o.drainEvents)
	}
	if r.DrainEventsPerSecond <= 0 {
		return nil, fmt.Errorf("the drain delivered nothing: no rate to produce at")
	}
	r.RatePerSecond = o.soakShare * r.DrainEventsPerSecond
	r.UnprocessedBound = max(1, int64(r.RatePerSecond))
	period := time.Duration(float64(time.Second) / r.RatePerSecond)
	b.logf("  %.0f events/s (%.0f%% of %.0f) for %s after a warm-up of %s, sampled every %s; WEBHOOK_RETENTION=%s, janitor at most every %s",
		r.RatePerSecond, 100*o.soakShare, r.DrainEventsPerSecond, o.soakDuration, o.soakWarmup, o.soakInterval, retention, soakJanitorInterval)

	if err := b.resetTables(ctx); err != nil {
		return nil, err
	}
	s, err := b.startSession(ctx, map[string]string{"WEBHOOK_RETENTION": retention.String()})
	if err != nil {
		return nil, err
	}
	defer s.stop()
	if err := b.waitArmed(ctx); err != nil {
		return nil, err
	}
	conns, closeConns, err := b.producerConns(ctx, o.connections, "prepared")
	if err != nil {
		return nil, err
	}
	defer closeConns()
	if _, err := b.warmUp(ctx, conns, s, 0); err != nil {
		return nil, err
	}
	st, err := b.consumer.stats(ctx)
	if err != nil {
		return nil, err
	}
	offset := st.Received // the warm-up's arrivals are not the soak's
	monitor, err := b.db.connect(ctx)
	if err != nil {
		return nil, err
	}
	closeMonitor := func() {
		if monitor != nil {
			_ = monitor.Close(context.Background())
			monitor = nil
		}
	}
	defer closeMonitor()
	if !b.db.pgss {
		r.ClaimTimeMissing = "no claim times without pg_stat_statements: " + statementStatsMissing(b.db.info.StatementStats)
	}

	tr := newSoakTracker()
	fetch := func(done bool) error {
		arr, err := b.consumer.arrivalsFrom(ctx, offset)
		if err != nil {
			return err
		}
		offset += len(arr)
		tr.match(arr, done)
		return nil
	}
	prev, err := b.readSoakCounters(ctx, monitor)
	if err != nil {
		return nil, err
	}
	base := prev
	s.startClock()
	start := time.Now().Add(10 * time.Millisecond)
	end := start.Add(time.Duration(n) * o.soakInterval)
	prodCtx, stopProducers := context.WithCancel(ctx)
	defer stopProducers()
	var inserts, attempted, failures atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for _, conn := range conns {
		wg.Go(func() {
			for prodCtx.Err() == nil {
				i := inserts.Add(1) - 1
				sched := start.Add(time.Duration(i) * period)
				if !sched.Before(end) {
					return
				}
				if d := time.Until(sched); d > 0 && sleepCtx(prodCtx, d) != nil {
					return
				}
				attempted.Add(1)
				begin := time.Now().UnixNano()
				var id pgtype.UUID
				insert, args := b.producerInsert("bench.soak", int(i), 0)
				err := conn.QueryRow(prodCtx, insert, args...).Scan(&id)
				if err != nil {
					if prodCtx.Err() == nil {
						failures.Add(1)
						errOnce.Do(func() { firstErr = err; stopProducers() })
					}
					return
				}
				tr.register(id.Bytes, sched.UnixNano(), begin, time.Now().UnixNano())
			}
		})
	}
	producersDone := make(chan struct{})
	go func() { wg.Wait(); close(producersDone) }()
	failed := func() error {
		stopProducers()
		<-producersDone
		if f := failures.Load(); f > 0 {
			return fmt.Errorf("%d producer inserts failed, the first with: %w", f, firstErr)
		}
		return ctx.Err()
	}

	for k := 1; k <= n; k++ {
		t := time.NewTimer(time.Until(start.Add(time.Duration(k) * o.soakInterval)))
		select {
		case <-prodCtx.Done():
			t.Stop()
			return nil, failed()
		case <-t.C:
		}
		if s.disp.exited() {
			stopProducers()
			return nil, s.disp.failure()
		}
		if err := fetch(false); err != nil {
			stopProducers()
			return nil, err
		}
		cur, err := b.readSoakCounters(ctx, monitor)
		if err != nil {
			stopProducers()
			return nil, err
		}
		sm := soakSampleOf(prev, cur, start)
		sm.AutovacuumCount, sm.AutoanalyzeCount = cur.autovacuum-base.autovacuum, cur.autoanalyze-base.autoanalyze
		prev = cur
		fromSched, fromCommit, late, produced, delivered := tr.take()
		sm.Produced, sm.Delivered = produced, delivered
		sm.EventsPerSecond = float64(delivered) / sm.IntervalSeconds
		sm.ProducedPerSecond = float64(produced) / sm.IntervalSeconds
		sm.FromScheduled, sm.FromCommit, sm.StartLateness = summarize(fromSched), summarize(fromCommit), summarize(late)
		sm.Warmup = k <= warm
		if soakKeepsRaw(k-1, warm, n) {
			sm.raw = fromSched
		}
		r.Samples = append(r.Samples, sm)
		if k < n {
			b.logSoakSample(sm)
		}
	}
	<-producersDone
	if f := failures.Load(); f > 0 {
		return nil, fmt.Errorf("%d producer inserts failed, the first with: %w", f, firstErr)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.db.stmts.Add(attempted.Load())
	closeConns()
	closeMonitor()

	// The events still in flight at the last sample: they count for delivery, with latencies
	// of their own (AfterEnd), not in any interval's. The bench waits while they keep
	// arriving: until every event has, or none has for soakStall (those are lost), or for at
	// most a quarter of the run (a queue that grew during the run: still queued, not lost).
	waitStart := time.Now()
	waitCap := waitStart.Add(max(soakStall, o.soakDuration/4))
	lastProgress, lastLog := time.Now(), time.Now()
	for {
		before := tr.waiting()
		if err := fetch(true); err != nil {
			return nil, err
		}
		now := time.Now()
		if w := tr.waiting(); w < before {
			lastProgress = now
		}
		w := tr.waiting()
		if w == 0 {
			r.WaitEnded = "every event arrived"
			break
		}
		if s.disp.exited() {
			return nil, s.disp.failure()
		}
		if now.Sub(lastProgress) > soakStall {
			r.WaitEnded = fmt.Sprintf("no event arrived for %s: %d lost", soakStall, w)
			r.Lost = w
			break
		}
		if now.After(waitCap) {
			r.WaitEnded = fmt.Sprintf("%d events still queued after waiting %s (the dispatcher was still delivering)", w, now.Sub(waitStart).Round(time.Second))
			r.StillQueued = w
			break
		}
		if now.Sub(lastLog) > 30*time.Second {
			b.logf("  after the end: %d events still to arrive", w)
			lastLog = now
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
	s.stopClock()
	r.WaitSeconds = time.Since(waitStart).Seconds()
	tail, tailCommit, tailLate, tailProduced, _ := tr.take()
	r.ArrivedAfterEnd, r.ProducedAfterEnd = len(tail), tailProduced
	r.AfterEnd, r.AfterEndFromCommit, r.AfterEndLateness = summarize(tail), summarize(tailCommit), summarize(tailLate)
	b.logSoakSample(r.Samples[len(r.Samples)-1])
	b.logf("  after the last sample: %d events arrived in %.1f s, p99 %s ms; %s", r.ArrivedAfterEnd, r.WaitSeconds, ms(r.AfterEnd.P99), r.WaitEnded)

	st, err = b.consumer.stats(ctx)
	if err != nil {
		return nil, err
	}
	r.Rejected = st.Rejected
	r.Events = r.totalProduced() + r.ProducedAfterEnd
	if last := tr.lastCommit(); last > start.UnixNano() {
		r.ProductionSeconds = float64(last-start.UnixNano()) / 1e9
		r.ProducedPerSecond = float64(r.Events) / r.ProductionSeconds
	}
	r.Received, r.Duplicates = tr.received, tr.duplicates
	r.setBudgetFigures()
	if r.Cost, err = s.cost(ctx, r.Received); err != nil {
		return nil, err
	}
	b.logf("  %d events, %d lost; p99 last/first %s, claim time last/first %s, log size end/reference %s",
		r.Events, r.Lost, ratioText(r.P99Ratio), ratioText(r.ClaimRatio), ratioText(r.LogRatio))
	return r, nil
}

// soakWindowSize is how many samples each drift window pools: 5, or half the samples of a
// shorter run (n samples after the warm-up).
func soakWindowSize(n int) int { return min(soakWindowSamples, n/2) }

// soakKeepsRaw reports whether sample i of n, the first warm of them the warm-up's, is in the
// first or the last window, whose raw latencies the window's p99 pools.
func soakKeepsRaw(i, warm, n int) bool {
	k := soakWindowSize(n - warm)
	return i >= warm && (i < warm+k || i >= n-k)
}

func (r *soakResult) totalProduced() int {
	total := 0
	for _, s := range r.Samples {
		total += s.Produced
	}
	return total
}

// window pools samples [from, to).
func (r *soakResult) window(from, to int) soakWindow {
	w := soakWindow{Samples: to - from}
	var raw []time.Duration
	var claimMS float64
	pgss := true
	for _, s := range r.Samples[from:to] {
		raw = append(raw, s.raw...)
		if s.Claims == nil {
			pgss = false
			continue
		}
		w.Claims += *s.Claims
		claimMS += s.claimMS
	}
	w.P99MS = summarize(raw).P99
	if pgss && w.Claims > 0 {
		v := claimMS / float64(w.Claims)
		w.ClaimMeanMS = &v
	}
	return w
}

// setBudgetFigures computes the windows, the ratios and the log's reference once, for the
// budget and the table.
func (r *soakResult) setBudgetFigures() {
	n, warm := len(r.Samples), min(r.WarmupSamples, len(r.Samples))
	r.Window = soakWindowSize(n - warm)
	if r.Window < 1 {
		return
	}
	r.First, r.Last = r.window(warm, warm+r.Window), r.window(n-r.Window, n)
	if r.First.P99MS > 0 && r.Last.P99MS > 0 {
		v := r.Last.P99MS / r.First.P99MS
		r.P99Ratio = &v
	}
	if r.First.ClaimMeanMS != nil && r.Last.ClaimMeanMS != nil && *r.First.ClaimMeanMS > 0 {
		v := *r.Last.ClaimMeanMS / *r.First.ClaimMeanMS
		r.ClaimRatio = &v
	}
	r.UnprocessedAtEnd = r.Samples[n-1].Unprocessed
	r.LogBudget = soakLogBudget(time.Duration(r.RetentionSeconds * float64(time.Second)))
	if r.Seconds < 2*r.RetentionSeconds {
		r.LogRatioMissing = fmt.Sprintf("the run (%s) is shorter than two retention periods (2 × %s): the log has not turned over",
			time.Duration(r.Seconds*float64(time.Second)), r.Retention)
		return
	}
	for i, s := range r.Samples {
		if s.AtSeconds >= r.RetentionSeconds {
			ref := r.Samples[i].LogBytes
			if ref > 0 && i < n-1 {
				end := r.Samples[n-1].LogBytes
				v := float64(end) / float64(ref)
				r.LogReference, r.LogRatio = &i, &v
				queueMax := func(from, to int) int64 {
					var m int64
					for _, s := range r.Samples[from:min(to, n)] {
						m = max(m, s.TableBytes+s.IndexesBytes)
					}
					return m
				}
				if early := queueMax(i, i+r.Window); early > 0 {
					q := float64(queueMax(n-r.Window, n)) / float64(early)
					r.QueueRatio = &q
				}
			}
			break
		}
	}
	if r.LogRatio == nil {
		r.LogRatioMissing = "no sample a retention period into the run before the last"
	}
}

func (b *bench) logSoakSample(s soakSample) {
	b.logf("  %s: %.0f produced/s, %.0f delivered/s, p99 %s ms (start behind schedule p99 %s ms), %s, queue %.1f MB, %d dead tuples, %d unprocessed, log %.1f MB in %d partitions",
		soakClock(s.AtSeconds), s.ProducedPerSecond, s.EventsPerSecond, ms(s.FromScheduled.P99), ms(s.StartLateness.P99),
		claimText(s), mb(s.TableBytes+s.IndexesBytes), s.DeadTuples, s.Unprocessed, mb(s.LogBytes), s.LogPartitions)
}

func claimText(s soakSample) string {
	if s.ClaimMeanMS == nil {
		return "claim n/a"
	}
	return fmt.Sprintf("claim %.3f ms", *s.ClaimMeanMS)
}

func ratioText(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", *v)
}

func mb(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// The names of the soak's checks.
const (
	soakUnprocessedCheck = "unprocessed rows at the end (queue bounded)"
	soakQueueCheck       = "queue table+index size, largest in the last window / a retention period in"
	soakLogCheck         = "log size, end / a retention period in"
	soakLostCheck        = "lost"
)

func (r *soakResult) p99Check() string {
	return fmt.Sprintf("scheduled start → arrival p99, last %d samples / first %d", r.Window, r.Window)
}

func (r *soakResult) claimCheck() string {
	return fmt.Sprintf("claim mean time, last %d samples / first %d", r.Window, r.Window)
}

func (r *soakResult) check(add addCheckFunc, notComputed notComputedCheckFunc) {
	budget := fmt.Sprintf("≤ %.1f", soakDriftBudget)
	switch {
	case r.Window < 1:
		notComputed("soak", r.p99Check(), nil, "", budget, "fewer than two samples")
	case r.P99Ratio == nil:
		notComputed("soak", r.p99Check(), nil, "", budget, "no event arrived in the first or the last window")
	default:
		add("soak", r.p99Check(), *r.P99Ratio, "", budget, *r.P99Ratio <= soakDriftBudget)
	}
	switch {
	case r.ClaimTimeMissing != "":
		notComputed("soak", r.claimCheck(), nil, "", budget, r.ClaimTimeMissing)
	case r.Window < 1:
		notComputed("soak", r.claimCheck(), nil, "", budget, "fewer than two samples")
	case r.ClaimRatio == nil:
		notComputed("soak", r.claimCheck(), nil, "", budget, "no claim in the first or the last window")
	default:
		add("soak", r.claimCheck(), *r.ClaimRatio, "", budget, *r.ClaimRatio <= soakDriftBudget)
	}
	add("soak", soakUnprocessedCheck, float64(r.UnprocessedAtEnd), "rows", fmt.Sprintf("≤ %d (1 s of production)", r.UnprocessedBound),
		r.UnprocessedAtEnd <= r.UnprocessedBound)
	if r.QueueRatio == nil {
		notComputed("soak", soakQueueCheck, nil, "", budget, r.LogRatioMissing)
	} else {
		add("soak", soakQueueCheck, *r.QueueRatio, "", budget, *r.QueueRatio <= soakDriftBudget)
	}
	logBudget := fmt.Sprintf("≤ %.2f ((retention + partition + janitor lag) / retention × %.1f)", r.LogBudget, soakLogSlack)
	if r.LogRatio == nil {
		notComputed("soak", soakLogCheck, nil, "", logBudget, r.LogRatioMissing)
	} else {
		add("soak", soakLogCheck, *r.LogRatio, "", logBudget, *r.LogRatio <= r.LogBudget)
	}
	if r.StillQueued > 0 && r.Lost == 0 {
		v := float64(r.StillQueued)
		notComputed("soak", soakLostCheck, &v, "", "0", fmt.Sprintf("%d events were still queued, and arriving, when the bench stopped waiting after %.0f s", r.StillQueued, r.WaitSeconds))
		return
	}
	add("soak", soakLostCheck, float64(r.Lost), "", "0", r.Lost == 0 && r.Rejected == 0)
}

// writeRows prints the workload's rows of the results table.
func (r *soakResult) writeRows(tw io.Writer, verdict func(workload, what string) string) {
	warmup := ""
	if r.WarmupSamples > 0 {
		warmup = fmt.Sprintf(" (the first %s a warm-up)", time.Duration(float64(r.WarmupSamples)*r.IntervalSeconds*float64(time.Second)))
	}
	fmt.Fprintf(tw, "soak\t%s events/s (%.0f%% of %s events/s drained: %s) from %d connections for %s%s, WEBHOOK_RETENTION=%s (janitor at most every %s)\t%s events, %d samples of %s\t\n",
		num(r.RatePerSecond, 0), 100*r.Share, num(r.DrainEventsPerSecond, 0), r.DrainSource, r.Connections,
		time.Duration(r.Seconds*float64(time.Second)), warmup, r.Retention, soakJanitorInterval, num(float64(r.Events), 0), len(r.Samples),
		time.Duration(r.IntervalSeconds*float64(time.Second)))
	behind := ""
	if r.ProducedPerSecond < 0.95*r.RatePerSecond {
		behind = " (the producer fell behind its schedule: the machine did not sustain the rate, and the latencies from the scheduled start include the producer's own backlog; lower --soak-share)"
	}
	fmt.Fprintf(tw, "\t  producer: committed events/s, last commit at%s\t%s events/s, %s\t\n", behind,
		num(r.ProducedPerSecond, 0), time.Duration(r.ProductionSeconds*float64(time.Second)).Round(time.Millisecond))
	short := ""
	if r.Window < soakWindowSamples {
		short = fmt.Sprintf(" (a short run: %d, not %d)", r.Window, soakWindowSamples)
	}
	if r.WarmupSamples > 0 {
		short += fmt.Sprintf(", after %d warm-up samples", r.WarmupSamples)
	}
	fmt.Fprintf(tw, "\t  scheduled start → arrival p99, first %d samples; last %d%s\t%s; %s ms = %s\t%s\n", r.Window, r.Window, short,
		ms(r.First.P99MS), ms(r.Last.P99MS), ratioText(r.P99Ratio), verdict("soak", r.p99Check()))
	if r.ClaimTimeMissing != "" {
		fmt.Fprintf(tw, "\t  claim mean time, last / first window\tn/a\t%s\n", verdict("soak", r.claimCheck()))
	} else {
		claim := func(w soakWindow) string {
			if w.ClaimMeanMS == nil {
				return "n/a"
			}
			return fmt.Sprintf("%.3f", *w.ClaimMeanMS)
		}
		fmt.Fprintf(tw, "\t  claim mean time, first %d samples; last %d\t%s; %s ms = %s\t%s\n", r.Window, r.Window,
			claim(r.First), claim(r.Last), ratioText(r.ClaimRatio), verdict("soak", r.claimCheck()))
	}
	fmt.Fprintf(tw, "\t  unprocessed rows when production ended\t%s\t%s\n", num(float64(r.UnprocessedAtEnd), 0), verdict("soak", soakUnprocessedCheck))
	fmt.Fprintf(tw, "\t  queue (webhook_outbox) table+indexes, largest in the last window / a retention period in\t%s\t%s\n",
		ratioText(r.QueueRatio), verdict("soak", soakQueueCheck))
	if n := len(r.Samples); r.LogReference != nil && n > 0 {
		ref, end := r.Samples[*r.LogReference], r.Samples[n-1]
		fmt.Fprintf(tw, "\t  log (webhook_delivery_log) at the end; at %s (a retention period in)\t%.1f; %.1f MB = %s\t%s\n",
			soakClock(ref.AtSeconds), mb(end.LogBytes), mb(ref.LogBytes),
			ratioText(r.LogRatio), verdict("soak", soakLogCheck))
	}
	fmt.Fprintf(tw, "\t  after the last sample: events arrived, in s; scheduled start → arrival p99\t%s in %.1f s; %s ms\t\n",
		num(float64(r.ArrivedAfterEnd), 0), r.WaitSeconds, ms(r.AfterEnd.P99))
	if r.StillQueued > 0 {
		fmt.Fprintf(tw, "\t  still queued when the bench stopped waiting (the dispatcher was still delivering)\t%s\t\n", num(float64(r.StillQueued), 0))
	}
	fmt.Fprintf(tw, "\t  lost, duplicates, rejected\t%d, %d, %d\t%s\n", r.Lost, r.Duplicates, r.Rejected, verdict("soak", soakLostCheck))
}

// writeSamples prints the per-interval table.
func (r *soakResult) writeSamples(w io.Writer) {
	fmt.Fprintf(w, "\nsoak: per interval (t from the start of production, the warm-up's marked; latencies of the events that arrived in it; table, indexes, tuples,\n")
	fmt.Fprintf(w, "autovacuum of the queue, webhook_outbox; due idx = webhook_outbox_due_idx, the claim's index; autovac/analyze: runs since the start;\n")
	fmt.Fprintf(w, "log = webhook_delivery_log, every partition with its indexes; backend writes: buffers PostgreSQL's client backends evicted dirty)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t\tproduced/s\tdelivered/s\tp50 ms\tp99 ms\tcommit→arr p99\tlate p99\tclaim ms\tclaims\tjanitor ms (stmts)\ttable MB\tindexes MB\tdue idx MB\tlive\tdead\tautovac\tanalyze\tdeleted\tHOT %\tunprocessed\tlog MB\tparts\tlog rows\tbackend writes\t")
	for _, s := range r.Samples {
		claim, claims, janitor, hot := "n/a", "n/a", "n/a", "-"
		if s.ClaimMeanMS != nil {
			claim = fmt.Sprintf("%.3f", *s.ClaimMeanMS)
		}
		if s.Claims != nil {
			claims = num(float64(*s.Claims), 0)
		}
		if s.JanitorMS != nil && s.JanitorRuns != nil {
			janitor = fmt.Sprintf("%s (%d)", num(*s.JanitorMS, 0), *s.JanitorRuns)
		}
		if s.HOTPercent != nil {
			hot = fmt.Sprintf("%.0f", *s.HOTPercent)
		}
		writes := "n/a"
		if s.BackendWrites != nil {
			writes = num(float64(*s.BackendWrites), 0)
		}
		due := "n/a"
		for name, size := range s.IndexBytes {
			if name == "webhook_outbox_due_idx" {
				due = fmt.Sprintf("%.2f", mb(size))
			}
		}
		clock := soakClock(s.AtSeconds)
		if s.Warmup {
			clock += " (warm-up)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%.1f\t%d\t%s\t%s\t\n",
			clock, num(s.ProducedPerSecond, 0), num(s.EventsPerSecond, 0), ms(s.FromScheduled.P50), ms(s.FromScheduled.P99), ms(s.FromCommit.P99),
			ms(s.StartLateness.P99), claim, claims, janitor, mb(s.TableBytes), mb(s.IndexesBytes), due,
			num(float64(s.LiveTuples), 0), num(float64(s.DeadTuples), 0), s.AutovacuumCount, s.AutoanalyzeCount,
			num(float64(s.Deleted), 0), hot, num(float64(s.Unprocessed), 0), mb(s.LogBytes), s.LogPartitions, num(float64(s.LogRows), 0), writes)
	}
	tw.Flush()
	if r.ClaimTimeMissing != "" {
		fmt.Fprintf(w, "claim and janitor times: %s\n", r.ClaimTimeMissing)
	}
	if len(r.Samples) > 0 {
		names := make([]string, 0, len(r.Samples[0].IndexBytes))
		for name := range r.Samples[len(r.Samples)-1].IndexBytes {
			names = append(names, name)
		}
		sort.Strings(names)
		end := r.Samples[len(r.Samples)-1]
		fmt.Fprintf(w, "indexes at the end:")
		for _, name := range names {
			fmt.Fprintf(w, " %s %.1f MB;", name, mb(end.IndexBytes[name]))
		}
		fmt.Fprintf(w, " %d events arrived after the last sample, %d were committed after it\n", r.ArrivedAfterEnd, r.ProducedAfterEnd)
	}
}

// soakClock is t seconds as m:ss.
func soakClock(t float64) string {
	d := time.Duration(t+0.5) * time.Second
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}
