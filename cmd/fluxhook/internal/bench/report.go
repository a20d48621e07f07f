package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
)

// benchReport is everything `fluxhook bench` measured; --json prints it as is.
type benchReport struct {
	Machine    machineInfo      `json:"machine"`
	Postgres   pgServerInfo     `json:"postgres"`
	Redis      string           `json:"redis"`
	Dispatcher string           `json:"dispatcher"`
	Config     []string         `json:"config_from_environment,omitempty"`
	Started    time.Time        `json:"started"`
	Workloads  []string         `json:"workloads"`
	Drain      *drainResult     `json:"drain,omitempty"`
	Idle       *latencyResult   `json:"idle,omitempty"`
	Steady     []*latencyResult `json:"steady,omitempty"` // one run per rate (--rate), in order
	Producers  *producersResult `json:"producers,omitempty"`
	Backlog    *backlogResult   `json:"backlog,omitempty"`
	Fanout     *fanoutResult    `json:"fanout,omitempty"`
	Ordered    *orderedResult   `json:"ordered,omitempty"`
	Soak       *soakResult      `json:"soak,omitempty"`
	API        *apiResult       `json:"api,omitempty"`
	// Baseline is the baseline's runs and their comparison with fluxhook's (--baseline).
	Baseline *baselineReport `json:"baseline,omitempty"`
	// Budget is every check, met or not, computed or not (empty with --no-budget).
	Budget []budgetCheck `json:"budget"`
	// BudgetMet is Verdict == "met": every check computed and met.
	BudgetMet bool `json:"budget_met"`
	// Verdict is "met", "failed" (a check missed or not computed: the command exits 1) or
	// "not_checked" (--no-budget).
	Verdict           string `json:"verdict"`
	ChecksMissed      int    `json:"checks_missed"`
	ChecksNotComputed int    `json:"checks_not_computed"`
	idleSpacing       time.Duration
}

// costReport is what a workload cost the dispatcher and the services, per delivered event.
type costReport struct {
	Events            int     `json:"events"`
	CPUMicrosPerEvent float64 `json:"dispatcher_cpu_us_per_event"`
	// PostgresCPUMicrosPerEvent is the throwaway cluster's CPU per event (null on a server
	// of DATABASE_URL, whose processes are not ours to count).
	PostgresCPUMicrosPerEvent *float64 `json:"postgres_cpu_us_per_event"`
	// ConsumerCPUMicrosPerEvent is the consumer's (the sink's) CPU per event: the budget
	// counts it, since it shares the machine.
	ConsumerCPUMicrosPerEvent float64 `json:"consumer_cpu_us_per_event"`
	// CPU is how busy the machine and each participant were during the measured part.
	CPU                   cpuShares `json:"cpu"`
	PGStatementsPerEvent  *float64  `json:"pg_statements_per_event"` // null without pg_stat_statements
	PGCommitsPerEvent     float64   `json:"pg_commits_per_event"`
	RedisCommandsPerEvent float64   `json:"redis_commands_per_event"` // 0 without REDIS_URL
	RedisServer           bool      `json:"redis_counted"`
	PeakRSSMB             float64   `json:"dispatcher_peak_rss_mb"`
	// MetricsError says why the per-batch counters below are missing: /metrics could not be
	// read, or the dispatcher claimed nothing.
	MetricsError string `json:"metrics_error,omitempty"`
	// From the dispatcher's /metrics: claim statements (empty ones included), claims that
	// returned rows (batches), settle statements.
	Claims                float64  `json:"claims"`
	ClaimedBatches        float64  `json:"claimed_batches"`
	Settles               float64  `json:"settles"`
	RowsPerBatch          float64  `json:"rows_per_batch"`
	RowsPerSettle         float64  `json:"rows_per_settle"`
	ClaimsPerBatch        float64  `json:"claim_statements_per_batch"`
	SettlesPerBatch       float64  `json:"settle_transactions_per_batch"`
	StatementsPerBatch    *float64 `json:"pg_statements_per_batch"`
	RedisCommandsPerBatch float64  `json:"redis_commands_per_batch"`
	// RedisRoundTripsPerBatch is what the budget's "≤ 1 Redis round trip per batch" means: the
	// gate's decide round trips, counted by the dispatcher's Redis client, per claimed batch.
	// Server-side commands cannot tell it: one round trip carries one EVALSHA per endpoint.
	RedisRoundTripsPerBatch float64 `json:"redis_round_trips_per_batch"`
	// RedisRoundTripsPerSettle is the gate's record round trips per settle transaction (the
	// breaker learning the outcomes; none while the breaker is off).
	RedisRoundTripsPerSettle float64 `json:"redis_record_round_trips_per_settle"`
	// Released counts claimed rows handed back without an attempt (their endpoint had no free
	// slot), to be claimed again later: claim and settle work that delivers nothing.
	Released      float64            `json:"released"`
	Wakeups       map[string]float64 `json:"wakeups,omitempty"`
	TopStatements []pgStatement      `json:"statements,omitempty"`
}

type drainResult struct {
	Events                int         `json:"events"`
	Received              int         `json:"received"`
	Lost                  int         `json:"lost"`
	Duplicates            int         `json:"duplicates"`
	Rejected              int         `json:"rejected"`
	Seconds               float64     `json:"seconds"`
	EventsPerSecond       float64     `json:"events_per_sec"`
	StartupMS             float64     `json:"startup_ms"`
	SteadyEventsPerSecond float64     `json:"events_per_sec_after_first"`
	Cost                  *costReport `json:"cost"`
}

type backlogSlice struct {
	From            int     `json:"from"`
	To              int     `json:"to"`
	EventsPerSecond float64 `json:"events_per_sec"`
	Claims          int64   `json:"claims,omitempty"`
	ClaimMeanMS     float64 `json:"claim_mean_ms,omitempty"`
}

type backlogResult struct {
	Events          int            `json:"events"`
	Received        int            `json:"received"`
	Lost            int            `json:"lost"`
	Duplicates      int            `json:"duplicates"`
	Rejected        int            `json:"rejected"`
	Seconds         float64        `json:"seconds"`
	EventsPerSecond float64        `json:"events_per_sec"`
	Slices          []backlogSlice `json:"slices"`
	// The fitted trends of the slices' throughput and claim time (see sliceTrend): what
	// "flat" is judged on; nil with too few slices.
	ThroughputTrend *float64    `json:"throughput_trend,omitempty"`
	ClaimTimeTrend  *float64    `json:"claim_time_trend,omitempty"`
	Cost            *costReport `json:"cost"`
}

// setTrends computes the trends of r's slices, once, for the budget and the table.
func (r *backlogResult) setTrends() {
	trend := func(v func(backlogSlice) float64) *float64 {
		if tr, ok := sliceTrend(r.Slices, v); ok {
			return &tr
		}
		return nil
	}
	r.ThroughputTrend = trend(func(s backlogSlice) float64 { return s.EventsPerSecond })
	r.ClaimTimeTrend = trend(func(s backlogSlice) float64 { return s.ClaimMeanMS })
}

// percentiles are latencies in milliseconds.
type percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

type latencyResult struct {
	Events        int     `json:"events"`
	Connections   int     `json:"connections"`
	RatePerSecond float64 `json:"rate_per_sec"`
	Seconds       float64 `json:"seconds"`
	// FromScheduled is from each insert's scheduled start to its arrival at the consumer (a
	// slow insert delays the ones behind it, and that counts: steady's budget is on this);
	// FromStart from the insert's actual start (idle's budget: events are single and apart);
	// FromCommit from the insert's commit (as the producer saw it) to the arrival.
	FromScheduled percentiles `json:"latency_from_scheduled_start"`
	FromStart     percentiles `json:"latency_from_insert_start"`
	FromCommit    percentiles `json:"latency_from_commit"`
	// Insert is the producer's own round trip, start to commit; Lateness how far behind its
	// schedule each insert started (the producer's, not the dispatcher's, delay).
	Insert     percentiles `json:"insert"`
	Lateness   percentiles `json:"start_lateness"`
	Lost       int         `json:"lost"`
	Duplicates int         `json:"duplicates"`
	Rejected   int         `json:"rejected"`
	// BacklogAtEnd is how many committed events had not arrived when production ended;
	// BacklogMax the most at any moment.
	BacklogAtEnd int         `json:"backlog_at_end"`
	BacklogMax   int         `json:"backlog_max"`
	Cost         *costReport `json:"cost"`
	// fromScheduled and fromCommit are FromScheduled's and FromCommit's samples, for the api
	// workload to pool its runs.
	fromScheduled, fromCommit []time.Duration
}

// producerRun is one side of one segment of a producers comparison: the producers whose
// inserts fired the trigger, or those whose inserts did not.
type producerRun struct {
	Connections int `json:"connections"`
	// Producers is how many of the Connections this side had: all of them in a whole segment,
	// half in a split one.
	Producers        int     `json:"producers"`
	Split            bool    `json:"split"`
	Trigger          bool    `json:"trigger"`
	Commits          int64   `json:"commits"`
	CommitsPerSecond float64 `json:"commits_per_sec"`
	// BackendCPUPerCommit is the producers' PostgreSQL backends' CPU per commit, in µs
	// (only when the server runs on this machine).
	BackendCPUPerCommit float64 `json:"backend_cpu_us_per_commit,omitempty"`
	// NotifyWakeups and EmptyClaims show whether the "busy" dispatcher armed itself anyway
	// (each empty claim arms it, and then every producer statement sends a NOTIFY).
	NotifyWakeups float64 `json:"dispatcher_notify_wakeups"`
	EmptyClaims   float64 `json:"dispatcher_empty_claims"`
	Released      float64 `json:"dispatcher_released"`
}

type producerComparison struct {
	Connections    int     `json:"connections"`
	WithTrigger    float64 `json:"with_trigger_commits_per_sec"`
	WithoutTrigger float64 `json:"without_trigger_commits_per_sec"`
	// CostPercent is the median over neighbouring pairs of segments of 1 − with/without.
	CostPercent   float64    `json:"cost_percent"`
	PairCostRange [2]float64 `json:"pair_cost_range_percent"`
	Pairs         int        `json:"pairs"`
	// The slowest and fastest segment on each side.
	WithRange    [2]float64 `json:"with_trigger_range"`
	WithoutRange [2]float64 `json:"without_trigger_range"`
	// The producers' backends' CPU per commit over all segments of each side, in µs (only
	// when the server runs on this machine).
	CPUPerCommitWith    float64 `json:"backend_cpu_us_per_commit_with,omitempty"`
	CPUPerCommitWithout float64 `json:"backend_cpu_us_per_commit_without,omitempty"`
	// NotifyWakeups is what the busy dispatcher received in the segments with the trigger.
	NotifyWakeups  float64 `json:"notify_wakeups_with_trigger"`
	BusyThroughout bool    `json:"dispatcher_busy_throughout"`
	// SwitchedPerSession says the trigger was switched with session_replication_role; else
	// with ALTER TABLE, and there is no split design.
	SwitchedPerSession bool             `json:"switched_per_session"`
	Split              *splitComparison `json:"split,omitempty"`
	// NullControl says neither side had the trigger (--producer-null): the costs are each
	// design's bias, not the trigger's, and no budget is checked.
	NullControl bool `json:"null_control,omitempty"`
}

// budgetCost is the cost the budget is checked against: the split design's where it ran,
// since both of its sides share every moment of the machine's load, else the whole design's.
// measured is false when that design has no segment to compare (producers that committed
// nothing): a cost of 0 would then pass the budget unmeasured.
func (c producerComparison) budgetCost() (cost float64, design string, measured bool) {
	if c.Split != nil {
		return c.Split.CostPercent, "split", c.Split.Pairs > 0
	}
	return c.CostPercent, "whole", c.Pairs > 0
}

// splitComparison is the split design: half of the producers with the trigger, half without,
// at the same moment.
type splitComparison struct {
	// CostPercent is the median over swapped pairs of segments of 1 − the geometric mean of
	// their (commits per producer with the trigger / commits per producer without): each half
	// of the connections is once with and once without, so what favours one half cancels.
	// CostRange is the same per single segment.
	CostPercent float64    `json:"cost_percent"`
	CostRange   [2]float64 `json:"cost_range_percent"`
	Segments    int        `json:"segments"`
	Pairs       int        `json:"pairs"`
	// The producers' backends' CPU per commit on each side, in µs (only when the server runs
	// on this machine).
	CPUPerCommitWith    float64 `json:"backend_cpu_us_per_commit_with,omitempty"`
	CPUPerCommitWithout float64 `json:"backend_cpu_us_per_commit_without,omitempty"`
}

type producersResult struct {
	DurationSeconds float64 `json:"duration_sec"`
	// Mode is how the producers sent their insert (--producer-mode): the trigger's share of an
	// insert's cost is largest when the insert itself is cheapest, prepared.
	Mode        string               `json:"producer_mode"`
	Comparisons []producerComparison `json:"comparisons"`
	Runs        []producerRun        `json:"runs"`
}

// budgetCheck is one line of the performance budget (docs/benchmarks.md) against what was measured.
type budgetCheck struct {
	Workload string `json:"workload"`
	What     string `json:"what"`
	// Value is what was measured; null when nothing could be.
	Value  *float64 `json:"value"`
	Unit   string   `json:"unit"`
	Budget string   `json:"budget"`
	// Status is checkMet, checkMissed or checkNotComputed; the last two fail the budget.
	Status string `json:"status"`
	// Reason says why a check could not be computed (no pg_stat_statements, too few
	// slices, nothing claimed, ...).
	Reason string `json:"reason,omitempty"`
	// OK is Status == checkMet.
	OK bool `json:"ok"`
}

// The statuses of a budget check. A check that could not be computed fails like a missed one:
// a budget that silently shrinks to the checks that happened to be measurable would read "all
// met" on exactly the runs that measured least.
const (
	checkMet         = "met"
	checkMissed      = "missed"
	checkNotComputed = "not_computed"
)

// The verdicts of a whole run (benchReport.Verdict).
const (
	verdictMet        = "met"
	verdictFailed     = "failed"
	verdictNotChecked = "not_checked" // --no-budget
)

// errBudgetFailed is the command's result when a check was missed or not computed: `fluxhook
// bench` exits 1 after printing the whole report.
var errBudgetFailed = errors.New("performance budget not met")

// failed reports whether the check fails the budget.
func (c budgetCheck) failed() bool { return c.Status != checkMet }

// valueText is the measured value with its unit, or "n/a".
func (c budgetCheck) valueText() string {
	if c.Value == nil {
		return "n/a"
	}
	return strings.TrimSpace(trimFloat(*c.Value) + " " + c.Unit)
}

func newBenchReport(b *bench) *benchReport {
	r := &benchReport{
		Machine:     currentMachine(),
		Postgres:    b.db.info,
		Redis:       "none (no REDIS_URL: the dispatcher gates in-process; 0 commands)",
		Dispatcher:  "fluxhook serve, default configuration",
		Config:      b.passedOn,
		Started:     time.Now().UTC().Truncate(time.Second),
		Workloads:   b.opts.workloads,
		idleSpacing: b.opts.idleInterval,
	}
	if b.opts.redisURL != "" {
		r.Redis = cli.RedactURL(b.opts.redisURL) + " (commands counted server-wide; round trips by the dispatcher's client)"
	}
	if len(b.passedOn) > 0 {
		r.Dispatcher = "fluxhook serve, default configuration except " + strings.Join(b.passedOn, " ")
	}
	if b.river != nil {
		r.Baseline = &baselineReport{Name: baselineRiver, Description: riverTuned}
	}
	return r
}

// judge sets the report's verdict: from the budget's checks, or "not_checked" with
// --no-budget (no check is listed: the run only measured).
func (r *benchReport) judge(noBudget bool) {
	if noBudget {
		r.Budget, r.BudgetMet, r.Verdict = []budgetCheck{}, false, verdictNotChecked
		r.ChecksMissed, r.ChecksNotComputed = 0, 0
		return
	}
	r.check()
}

// check compares the results with the budget (docs/benchmarks.md). Every
// check the workloads that ran call for is listed: met, missed, or not computed with the
// reason (which fails it too).
func (r *benchReport) check() {
	r.Budget = nil
	add := func(workload, what string, value float64, unit, budget string, ok bool) {
		status := checkMissed
		if ok {
			status = checkMet
		}
		r.Budget = append(r.Budget, budgetCheck{Workload: workload, What: what, Value: &value, Unit: unit, Budget: budget, Status: status, OK: ok})
	}
	// notComputed lists a check that could not be computed; value, when not nil, is what was
	// measured all the same (shown, not judged).
	notComputed := func(workload, what string, value *float64, unit, budget, reason string) {
		r.Budget = append(r.Budget, budgetCheck{Workload: workload, What: what, Value: value, Unit: unit, Budget: budget, Status: checkNotComputed, Reason: reason})
	}
	perBatch := func(workload string, c *costReport) {
		const claims, settles = "claim statements per claimed batch", "settle transactions per claimed batch"
		if c == nil || c.ClaimedBatches == 0 {
			reason := "no cost report"
			if c != nil {
				reason = c.MetricsError
				if reason == "" {
					reason = "the dispatcher claimed nothing"
				}
			}
			notComputed(workload, claims, nil, "", "1", reason)
			notComputed(workload, settles, nil, "", "1", reason)
			return
		}
		add(workload, claims, c.ClaimsPerBatch, "", "1", c.ClaimsPerBatch <= 1.05)
		add(workload, settles, c.SettlesPerBatch, "", "1", c.SettlesPerBatch <= 1.05)
		if c.RedisServer {
			add(workload, "Redis round trips per claimed batch (gate decide)", c.RedisRoundTripsPerBatch, "", "≤ 1", c.RedisRoundTripsPerBatch <= 1.05)
			const record = "Redis round trips per settle transaction (gate record)"
			if c.Settles > 0 {
				add(workload, record, c.RedisRoundTripsPerSettle, "", "≤ 1", c.RedisRoundTripsPerSettle <= 1.05)
			} else {
				notComputed(workload, record, nil, "", "≤ 1", "no settle transaction")
			}
		}
	}
	// latency checks a percentile of p, or says that nothing arrived to measure.
	latency := func(workload, what string, p percentiles, v float64, budget string, limit float64) {
		if p.N == 0 {
			notComputed(workload, what, nil, "ms", budget, "no event arrived")
			return
		}
		add(workload, what, v, "ms", budget, v <= limit)
	}
	if d := r.Drain; d != nil {
		what := fmt.Sprintf("%d-event backlog drained", d.Events)
		if d.Received == 0 || d.Seconds <= 0 {
			notComputed("drain", what, nil, "events/s", "≥ 10,000", "no event arrived")
		} else {
			add("drain", what, d.EventsPerSecond, "events/s", "≥ 10,000", d.EventsPerSecond >= 10000)
		}
		add("drain", "lost", float64(d.Lost), "", "0", d.Lost == 0 && d.Rejected == 0)
		perBatch("drain", d.Cost)
	}
	if i := r.Idle; i != nil {
		latency("idle", "insert start → arrival p50", i.FromStart, i.FromStart.P50, "≤ 2", 2)
		latency("idle", "insert start → arrival p99", i.FromStart, i.FromStart.P99, "≤ 5", 5)
		add("idle", "lost", float64(i.Lost), "", "0", i.Lost == 0 && i.Rejected == 0)
	}
	for _, s := range r.Steady {
		w := r.steadyLabel(s)
		latency(w, fmt.Sprintf("%.0f/s, scheduled start → arrival p99", s.RatePerSecond), s.FromScheduled, s.FromScheduled.P99, "≤ 10", 10)
		limit := max(1, int(s.RatePerSecond/50)) // 20 ms of production
		add(w, "backlog when production ended", float64(s.BacklogAtEnd), "events", fmt.Sprintf("≤ %d (no growth)", limit), s.BacklogAtEnd <= limit)
		add(w, "lost", float64(s.Lost), "", "0", s.Lost == 0 && s.Rejected == 0)
		perBatch(w, s.Cost)
	}
	if p := r.Producers; p != nil {
		for _, c := range p.Comparisons {
			cost, _, measured := c.budgetCost()
			what := fmt.Sprintf("trigger's cost to %d producers", c.Connections)
			switch {
			case c.NullControl:
				// Not a measurement of the trigger: a null control is never judged.
				notComputed("producers", fmt.Sprintf("null control, %d producers (no trigger on either side)", c.Connections), &cost, "%", "≤ 10",
					"a null control (--producer-null) is not a measurement of the trigger")
			case !measured:
				notComputed("producers", what, nil, "%", "≤ 10", "no segment to compare (the producers committed nothing)")
			case p.Mode != "" && p.Mode != "prepared":
				// The budget is judged where the trigger's share is largest, on prepared
				// inserts: an insert planned on every execution costs more itself, so the
				// same trigger reads cheaper. Such a run is reported, never met.
				notComputed("producers", what, &cost, "%", "≤ 10", "judged on prepared inserts; this run's producers used "+p.Mode)
			default:
				add("producers", what, cost, "%", "≤ 10", cost <= 10)
			}
		}
	}
	if f := r.Fanout; f != nil {
		f.check(add, notComputed, latency)
	}
	if o := r.Ordered; o != nil {
		o.check(add, notComputed, perBatch)
	}
	if b := r.Backlog; b != nil {
		what := fmt.Sprintf("%d-event backlog drained", b.Events)
		if b.Received == 0 || b.Seconds <= 0 {
			notComputed("backlog", what, nil, "events/s", "≥ 10,000", "no event arrived")
		} else {
			add("backlog", what, b.EventsPerSecond, "events/s", "≥ 10,000", b.EventsPerSecond >= 10000)
		}
		const rss = "dispatcher peak RSS"
		switch {
		case b.Cost == nil:
			notComputed("backlog", rss, nil, "MB", "≤ 100", "no cost report")
		case b.Cost.PeakRSSMB <= 0:
			notComputed("backlog", rss, nil, "MB", "≤ 100", "the dispatcher's peak RSS could not be read (/proc/PID/status VmHWM)")
		default:
			add("backlog", rss, b.Cost.PeakRSSMB, "MB", "≤ 100", b.Cost.PeakRSSMB <= 100)
		}
		// Flat is judged on the trend, not on the spread: a slice that ran while the machine
		// was busy elsewhere is noise, a claim that grows with the backlog is a trend.
		const throughput, claimTime = "throughput trend, last slice / first", "claim time trend, last slice / first"
		if tr := b.ThroughputTrend; tr != nil {
			add("backlog", throughput, *tr, "", "0.8–1.25 (flat)", *tr >= 0.8 && *tr <= 1.25)
		} else {
			notComputed("backlog", throughput, nil, "", "0.8–1.25 (flat)", b.trendMissing(false, r.Postgres))
		}
		if tr := b.ClaimTimeTrend; tr != nil {
			add("backlog", claimTime, *tr, "", "0.8–1.25 (flat)", *tr >= 0.8 && *tr <= 1.25)
		} else {
			notComputed("backlog", claimTime, nil, "", "0.8–1.25 (flat)", b.trendMissing(true, r.Postgres))
		}
		add("backlog", "lost", float64(b.Lost), "", "0", b.Lost == 0 && b.Rejected == 0)
		perBatch("backlog", b.Cost)
	}
	if s := r.Soak; s != nil {
		s.check(add, notComputed)
	}
	if a := r.API; a != nil {
		a.check(add, notComputed)
	}
	if r.Baseline != nil {
		r.checkBaseline(add, notComputed)
	}
	r.tally()
}

// tally sets the verdict and its counts from r.Budget.
func (r *benchReport) tally() {
	r.ChecksMissed, r.ChecksNotComputed = 0, 0
	for i := range r.Budget {
		c := &r.Budget[i]
		c.OK = c.Status == checkMet
		switch c.Status {
		case checkMet:
		case checkNotComputed:
			r.ChecksNotComputed++
		default:
			r.ChecksMissed++
		}
	}
	r.BudgetMet = r.ChecksMissed == 0 && r.ChecksNotComputed == 0
	r.Verdict = verdictFailed
	if r.BudgetMet {
		r.Verdict = verdictMet
	}
}

// verdictError is nil when the budget was met or not checked (--no-budget), else an error
// wrapping errBudgetFailed that names the failed checks: the command's exit status is 1.
func (r *benchReport) verdictError() error {
	if r.Verdict != verdictFailed {
		return nil
	}
	var failed []string
	for _, c := range r.Budget {
		switch c.Status {
		case checkMet:
		case checkNotComputed:
			failed = append(failed, fmt.Sprintf("%s: %s (not computed: %s)", c.Workload, c.What, c.Reason))
		default:
			failed = append(failed, fmt.Sprintf("%s: %s = %s (budget %s)", c.Workload, c.What, c.valueText(), c.Budget))
		}
	}
	return fmt.Errorf("%w: %s: %s", errBudgetFailed, r.failedSummary(), strings.Join(failed, "; "))
}

// failedSummary is "2 of 14 checks failed (1 missed, 1 not computed)".
func (r *benchReport) failedSummary() string {
	var parts []string
	if r.ChecksMissed > 0 {
		parts = append(parts, fmt.Sprintf("%d missed", r.ChecksMissed))
	}
	if r.ChecksNotComputed > 0 {
		parts = append(parts, fmt.Sprintf("%d not computed", r.ChecksNotComputed))
	}
	return fmt.Sprintf("%d of %d checks failed (%s)", r.ChecksMissed+r.ChecksNotComputed, len(r.Budget), strings.Join(parts, ", "))
}

// statementStatsMissing says why pg_stat_statements is not there, from the report's
// "pg_stat_database only (<why>)".
func statementStatsMissing(stats string) string {
	if why, ok := strings.CutPrefix(stats, "pg_stat_database only ("); ok {
		return strings.TrimSuffix(why, ")")
	}
	if stats == "" {
		return "pg_stat_statements is not available"
	}
	return stats
}

// trendMissing says why a backlog trend could not be computed.
func (b *backlogResult) trendMissing(claimTime bool, pg pgServerInfo) string {
	if claimTime && pg.StatementStats != "pg_stat_statements" {
		return "no claim times without pg_stat_statements: " + statementStatsMissing(pg.StatementStats)
	}
	if len(b.Slices) < 3 {
		return fmt.Sprintf("%d slice(s) of the backlog; a trend needs at least three (--backlog-events / --backlog-slice)", len(b.Slices))
	}
	if claimTime {
		return "a slice without a claim time (pg_stat_statements was not sampled at its end)"
	}
	return "a slice without a throughput"
}

func sliceSpread(s []backlogSlice) (lo, hi float64, ok bool) {
	if len(s) < 2 {
		return 0, 0, false
	}
	lo, hi = math.Inf(1), 0
	for _, sl := range s {
		lo, hi = min(lo, sl.EventsPerSecond), max(hi, sl.EventsPerSecond)
	}
	return lo, hi, hi > 0
}

// sliceTrend fits a straight line through v of each slice, in order (least squares), and
// returns the line's value at the last slice over its value at the first: 1 for a flat run,
// whatever the noise around the line. Session 2's backlog, whose claims fell from 14 to 4 ms
// as the backlog shrank, is the trend it is for; one slow slice while the machine ran
// something else moves it little. False with fewer than three slices or a value missing.
func sliceTrend(s []backlogSlice, v func(backlogSlice) float64) (float64, bool) {
	n := float64(len(s))
	if len(s) < 3 {
		return 0, false
	}
	var sx, sy, sxx, sxy float64
	for i, sl := range s {
		x, y := float64(i), v(sl)
		if y <= 0 {
			return 0, false
		}
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	slope := (n*sxy - sx*sy) / (n*sxx - sx*sx)
	first := (sy - slope*sx) / n
	last := first + slope*(n-1)
	if first <= 0 || last <= 0 {
		return 0, false
	}
	return last / first, true
}

// batchMark marks a per-batch figure against the budget's 1, or with a dash where that
// budget does not apply.
func batchMark(v float64, unmarked bool) string {
	if unmarked {
		return "-"
	}
	return mark(v <= 1.05)
}

func mark(ok bool) string {
	if ok {
		return "✓"
	}
	return "✗"
}

// num formats a number with thousands separators and the given decimals.
func num(v float64, decimals int) string {
	s := fmt.Sprintf("%.*f", decimals, math.Abs(v))
	intPart, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	if v < 0 && s != strings.Repeat("0", len(s)) {
		b.WriteByte('-')
	}
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if frac != "" {
		b.WriteByte('.')
		b.WriteString(frac)
	}
	return b.String()
}

func ms(v float64) string {
	switch {
	case v >= 100:
		return num(v, 0)
	case v >= 10:
		return num(v, 1)
	default:
		return num(v, 2)
	}
}

// writeTable prints the report for people: the setup, results against the budget, the cost
// per event, and the budget verdict.
func (r *benchReport) writeTable(w io.Writer, statements bool) {
	fmt.Fprintf(w, "fluxhook bench  %s  %d CPUs (%s), %s, %s, load average %s\n", r.Started.Format(time.RFC3339),
		r.Machine.CPUs, r.Machine.CPUName, r.Machine.OS, r.Machine.Go, r.Machine.Load)
	where := "server from DATABASE_URL (fresh database, dropped after)"
	if r.Postgres.Throwaway {
		where = "throwaway cluster"
	}
	fmt.Fprintf(w, "PostgreSQL %s, %s: fsync=%s synchronous_commit=%s shared_buffers=%s autovacuum_naptime=%s; statements: %s\n",
		r.Postgres.Version, where, r.Postgres.Fsync, r.Postgres.SynchronousCommit, r.Postgres.SharedBuffers,
		r.Postgres.AutovacuumNaptime, r.Postgres.StatementStats)
	if text := r.Machine.referenceText(); text != "" {
		fmt.Fprintln(w, text)
	}
	fmt.Fprintf(w, "Redis: %s\ndispatcher: %s; consumer: verifying receiver in its own process\n\n", r.Redis, r.Dispatcher)

	budget := map[string]budgetCheck{}
	shown := map[string]bool{}
	for _, c := range r.Budget {
		budget[c.Workload+"|"+c.What] = c
	}
	verdict := func(workload, what string) string {
		c, ok := budget[workload+"|"+what]
		if !ok {
			return ""
		}
		shown[workload+"|"+what] = true
		return c.cell()
	}
	// rest prints a row for each of the workload's checks that no row above showed (the
	// per-batch ones, and any that could not be computed where the row needs the value).
	rest := func(tw io.Writer, workload string) {
		for _, c := range r.Budget {
			if c.Workload != workload || shown[workload+"|"+c.What] {
				continue
			}
			shown[workload+"|"+c.What] = true
			fmt.Fprintf(tw, "\t  %s\t%s\t%s\n", c.What, c.valueText(), c.cell())
		}
	}

	// The comparison with the baseline is printed after the workloads, but its checks are
	// taken first, so that the workloads' rows leave them to it.
	var comparison bytes.Buffer
	r.writeComparison(&comparison, verdict)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKLOAD\tMEASURE\tRESULT\tBUDGET")
	if d := r.Drain; d != nil {
		fmt.Fprintf(tw, "drain\t%s events prefilled with COPY, then the dispatcher started\t%s events/s (%.2f s)\t%s\n",
			num(float64(d.Events), 0), num(d.EventsPerSecond, 0), d.Seconds, verdict("drain", fmt.Sprintf("%d-event backlog drained", d.Events)))
		fmt.Fprintf(tw, "\t  start → first arrival; rate after it\t%.0f ms; %s events/s\t\n", d.StartupMS, num(d.SteadyEventsPerSecond, 0))
		fmt.Fprintf(tw, "\t  lost, duplicates, rejected\t%d, %d, %d\t%s\n", d.Lost, d.Duplicates, d.Rejected, verdict("drain", "lost"))
		rest(tw, "drain")
	}
	if i := r.Idle; i != nil {
		fmt.Fprintf(tw, "idle\t%d events %s apart, insert start → arrival p50\t%s ms\t%s\n", i.Events, r.idleSpacing, ms(i.FromStart.P50), verdict("idle", "insert start → arrival p50"))
		fmt.Fprintf(tw, "\t  p90, p99, max\t%s, %s, %s ms\t%s\n", ms(i.FromStart.P90), ms(i.FromStart.P99), ms(i.FromStart.Max), verdict("idle", "insert start → arrival p99"))
		fmt.Fprintf(tw, "\t  commit → arrival p50, p99; insert start → commit p50, p99\t%s, %s; %s, %s ms\t\n", ms(i.FromCommit.P50), ms(i.FromCommit.P99), ms(i.Insert.P50), ms(i.Insert.P99))
		fmt.Fprintf(tw, "\t  lost, duplicates, rejected\t%d, %d, %d\t%s\n", i.Lost, i.Duplicates, i.Rejected, verdict("idle", "lost"))
		rest(tw, "idle")
	}
	for _, s := range r.Steady {
		w := r.steadyLabel(s)
		fmt.Fprintf(tw, "%s\t%s/s for %.0f s from %d connections, scheduled start → arrival p50, p90\t%s, %s ms\t\n",
			w, num(s.RatePerSecond, 0), s.Seconds, s.Connections, ms(s.FromScheduled.P50), ms(s.FromScheduled.P90))
		fmt.Fprintf(tw, "\t  p99, max\t%s, %s ms\t%s\n", ms(s.FromScheduled.P99), ms(s.FromScheduled.Max),
			verdict(w, fmt.Sprintf("%.0f/s, scheduled start → arrival p99", s.RatePerSecond)))
		fmt.Fprintf(tw, "\t  commit → arrival p50, p90, p99, max\t%s, %s, %s, %s ms\t\n", ms(s.FromCommit.P50), ms(s.FromCommit.P90), ms(s.FromCommit.P99), ms(s.FromCommit.Max))
		fmt.Fprintf(tw, "\t  insert start → commit p50, p99; start behind schedule p99\t%s, %s; %s ms\t\n", ms(s.Insert.P50), ms(s.Insert.P99), ms(s.Lateness.P99))
		fmt.Fprintf(tw, "\t  backlog when production ended (most during the run)\t%d (%d)\t%s\n", s.BacklogAtEnd, s.BacklogMax, verdict(w, "backlog when production ended"))
		fmt.Fprintf(tw, "\t  lost, duplicates, rejected\t%d, %d, %d\t%s\n", s.Lost, s.Duplicates, s.Rejected, verdict(w, "lost"))
		rest(tw, w)
	}
	if p := r.Producers; p != nil {
		busy, notifies := true, 0.0
		for k, c := range p.Comparisons {
			name := ""
			if k == 0 {
				name = "producers"
			}
			cost, design, _ := c.budgetCost()
			fmt.Fprintf(tw, "%s\t%d producers (dispatcher busy, %s inserts): the trigger's cost to commit throughput, %s design\t%s%%\t%s\n", name, c.Connections, p.Mode, design,
				num(cost, 1), verdict("producers", fmt.Sprintf("trigger's cost to %d producers", c.Connections)))
			if sp := c.Split; sp != nil {
				fmt.Fprintf(tw, "\t  split: half the producers with the trigger, half without, %d segments of %s s; cost per segment\t%s%% (%s to %s%%)\t\n",
					sp.Segments, num(p.DurationSeconds, 2), num(sp.CostPercent, 1), num(sp.CostRange[0], 1), num(sp.CostRange[1], 1))
				if sp.CPUPerCommitWith > 0 {
					fmt.Fprintf(tw, "\t  split: producers' PostgreSQL backends, CPU per commit with, without\t%s, %s µs\t\n", num(sp.CPUPerCommitWith, 1), num(sp.CPUPerCommitWithout, 1))
				}
			}
			fmt.Fprintf(tw, "\t  whole: all producers with, then without (%d ABBA pairs of %s s), commits/s\t%s vs %s: %s%% (pairs %s to %s%%)\t\n", c.Pairs, num(p.DurationSeconds, 2),
				num(c.WithTrigger, 0), num(c.WithoutTrigger, 0), num(c.CostPercent, 1), num(c.PairCostRange[0], 1), num(c.PairCostRange[1], 1))
			fmt.Fprintf(tw, "\t  whole: segments with, without\t%s–%s, %s–%s\t\n",
				num(c.WithRange[0], 0), num(c.WithRange[1], 0), num(c.WithoutRange[0], 0), num(c.WithoutRange[1], 0))
			if c.CPUPerCommitWith > 0 {
				fmt.Fprintf(tw, "\t  whole: producers' PostgreSQL backends, CPU per commit with, without\t%s, %s µs\t\n", num(c.CPUPerCommitWith, 1), num(c.CPUPerCommitWithout, 1))
			}
			busy = busy && c.BusyThroughout
			notifies += c.NotifyWakeups
		}
		if !busy {
			fmt.Fprintf(tw, "\t  (the dispatcher ran out of backlog in some runs: they compare less than the busy case)\t\t\n")
		}
		fmt.Fprintf(tw, "\t  NOTIFYs the busy dispatcher received in the segments with the trigger\t%s\t\n", num(notifies, 0))
		rest(tw, "producers")
	}
	if f := r.Fanout; f != nil {
		f.writeRows(tw, r.idleSpacing, verdict)
		rest(tw, "fanout")
	}
	if o := r.Ordered; o != nil {
		o.writeRows(tw, r.idleSpacing, verdict)
		rest(tw, "ordered")
	}
	if b := r.Backlog; b != nil {
		fmt.Fprintf(tw, "backlog\t%s events prefilled with COPY, then the dispatcher started\t%s events/s (%.1f s)\t%s\n",
			num(float64(b.Events), 0), num(b.EventsPerSecond, 0), b.Seconds, verdict("backlog", fmt.Sprintf("%d-event backlog drained", b.Events)))
		for _, sl := range b.Slices {
			claim := ""
			if sl.Claims > 0 {
				claim = fmt.Sprintf(", claim %.2f ms", sl.ClaimMeanMS)
			}
			fmt.Fprintf(tw, "\t  events %s–%s\t%s events/s%s\t\n", num(float64(sl.From), 0), num(float64(sl.To), 0), num(sl.EventsPerSecond, 0), claim)
		}
		if lo, hi, ok := sliceSpread(b.Slices); ok {
			fmt.Fprintf(tw, "\t  slowest slice / fastest (the machine's noise and any trend)\t%.2f\t\n", lo/hi)
		}
		trend := func(tr *float64) string {
			if tr == nil {
				return "n/a"
			}
			return fmt.Sprintf("%.2f", *tr)
		}
		fmt.Fprintf(tw, "\t  throughput trend: fitted last slice / fitted first\t%s\t%s\n", trend(b.ThroughputTrend), verdict("backlog", "throughput trend, last slice / first"))
		fmt.Fprintf(tw, "\t  claim time trend: fitted last slice / fitted first\t%s\t%s\n", trend(b.ClaimTimeTrend), verdict("backlog", "claim time trend, last slice / first"))
		if b.Cost != nil {
			fmt.Fprintf(tw, "\t  dispatcher peak RSS\t%.0f MB\t%s\n", b.Cost.PeakRSSMB, verdict("backlog", "dispatcher peak RSS"))
		}
		fmt.Fprintf(tw, "\t  lost, duplicates, rejected\t%d, %d, %d\t%s\n", b.Lost, b.Duplicates, b.Rejected, verdict("backlog", "lost"))
		rest(tw, "backlog")
	}
	if s := r.Soak; s != nil {
		s.writeRows(tw, verdict)
		rest(tw, "soak")
	}
	if a := r.API; a != nil {
		a.writeRows(tw, verdict)
		rest(tw, "api")
	}
	tw.Flush()
	_, _ = comparison.WriteTo(w)
	if s := r.Soak; s != nil {
		s.writeSamples(w)
	}

	type costRow struct {
		name string
		c    *costReport
		// unmarked: the row's per-batch figures are not marked against the budget's "1 per
		// batch", which is not fanout's: a batch of events becomes endpoints × as many
		// deliveries, settled in several transactions.
		unmarked bool
	}
	var rows []costRow
	if r.Drain != nil {
		rows = append(rows, costRow{name: "drain", c: r.Drain.Cost})
	}
	if r.Idle != nil {
		rows = append(rows, costRow{name: "idle", c: r.Idle.Cost})
	}
	for _, st := range r.Steady {
		rows = append(rows, costRow{name: r.steadyLabel(st), c: st.Cost})
	}
	if r.Fanout != nil {
		rows = append(rows, costRow{"fanout*", r.Fanout.Cost, true})
		if r.Fanout.Idle != nil {
			rows = append(rows, costRow{"fanout idle*", r.Fanout.Idle.Cost, true})
		}
	}
	if r.Ordered != nil {
		for _, c := range r.Ordered.costs() {
			rows = append(rows, costRow{name: c.name, c: c.cost})
		}
	}
	if r.Backlog != nil {
		rows = append(rows, costRow{name: "backlog", c: r.Backlog.Cost})
	}
	if r.Soak != nil {
		if r.Soak.Drain != nil {
			rows = append(rows, costRow{name: "soak: drain", c: r.Soak.Drain.Cost})
		}
		rows = append(rows, costRow{name: "soak", c: r.Soak.Cost})
	}
	if r.API != nil {
		for k, run := range r.API.Runs {
			name := fmt.Sprintf("api %d without", k+1)
			if run.API {
				name = fmt.Sprintf("api %d with API", k+1)
			}
			rows = append(rows, costRow{name: name, c: run.Steady.Cost, unmarked: true})
		}
	}
	if len(rows) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "COST\tdispatcher\tPostgreSQL\tconsumer\tPG stmts\tPG commits\tRedis cmds\tdispatcher\trows per\tclaims per\tsettles per\treleased\tother\t")
		fmt.Fprintln(tw, "\tCPU µs/event\tCPU µs/event\tCPU µs/event\t/event\t/event\t/event\tpeak RSS MB\tbatch\tbatch (1)\tbatch (1)\t/event\tload CPUs\t")
		for _, row := range rows {
			c := row.c
			if c == nil {
				continue
			}
			stmts, pgCPU := "n/a", "n/a"
			if c.PGStatementsPerEvent != nil {
				stmts = fmt.Sprintf("%.3f", *c.PGStatementsPerEvent)
			}
			if c.PostgresCPUMicrosPerEvent != nil {
				pgCPU = fmt.Sprintf("%.1f", *c.PostgresCPUMicrosPerEvent)
			}
			fmt.Fprintf(tw, "%s\t%.1f\t%s\t%.1f\t%s\t%.3f\t%.3f\t%.0f\t%.1f\t%.2f %s\t%.2f %s\t%.2f\t%.2f\t\n", row.name,
				c.CPUMicrosPerEvent, pgCPU, c.ConsumerCPUMicrosPerEvent, stmts, c.PGCommitsPerEvent, c.RedisCommandsPerEvent, c.PeakRSSMB,
				c.RowsPerBatch, c.ClaimsPerBatch, batchMark(c.ClaimsPerBatch, row.unmarked), c.SettlesPerBatch, batchMark(c.SettlesPerBatch, row.unmarked),
				c.Released/float64(max(c.Events, 1)), c.CPU.Other)
		}
		tw.Flush()
		fmt.Fprintln(w, "CPU from /proc in 10 ms ticks over the measured part; PostgreSQL counts over the dispatcher's life (start and stop included);")
		fmt.Fprintln(w, "commits include the listener's one transaction per NOTIFY it receives; a batch is a claim that returned rows; other load is")
		fmt.Fprintln(w, "CPU used meanwhile by programs that are not part of the bench (the budget assumes a quiet machine).")
		if r.Fanout != nil {
			fmt.Fprintln(w, "* fanout: per delivery, one (event, endpoint) pair; a batch is a claim (of events, or of deliveries released")
			fmt.Fprintln(w, "  back), and a batch of events is settled in several transactions: the budget's 1 per batch is not checked there.")
		}
		if r.API != nil {
			fmt.Fprintln(w, "api: per event of the steady flow, each routed to an endpoint (its event row and its delivery both settled); with the")
			fmt.Fprintln(w, "  API, the dispatcher's CPU includes the API's (one process); the budget's 1 per batch is not checked there.")
		}
	}
	if statements {
		for _, row := range rows {
			if row.c == nil || len(row.c.TopStatements) == 0 {
				continue
			}
			fmt.Fprintf(w, "\n%s: the dispatcher's statements (calls per event, mean ms)\n", row.name)
			for k, s := range row.c.TopStatements {
				if k == 12 {
					break
				}
				fmt.Fprintf(w, "  %8.3f  %7.3f  %s\n", float64(s.Calls)/float64(max(row.c.Events, 1)), s.TimeMS/float64(max(s.Calls, 1)), shortQuery(s.Query, 110))
			}
		}
	}
	fmt.Fprintln(w)
	r.writeVerdict(w)
}

// writeVerdict prints the budget's verdict: all met, or which checks were missed and which
// could not be computed (and why); both fail the run.
func (r *benchReport) writeVerdict(w io.Writer) {
	switch r.Verdict {
	case verdictNotChecked:
		fmt.Fprintln(w, "budget: not checked (--no-budget)")
		return
	case verdictMet:
		fmt.Fprintf(w, "budget: all %d checks met ✓\n", len(r.Budget))
		return
	}
	fmt.Fprintf(w, "budget: %s ✗\n", r.failedSummary())
	for _, c := range r.Budget {
		switch c.Status {
		case checkMet:
		case checkNotComputed:
			fmt.Fprintf(w, "  ✗ %s: %s: not computed: %s (budget %s)\n", c.Workload, c.What, c.Reason, c.Budget)
		default:
			fmt.Fprintf(w, "  ✗ %s: %s = %s (budget %s)\n", c.Workload, c.What, c.valueText(), c.Budget)
		}
	}
}

// cell is the check's BUDGET cell: the budget and ✓ or ✗, or "✗ not computed: why".
func (c budgetCheck) cell() string {
	unit := c.Unit
	if unit == "events/s" || unit == "events" || unit == "deliveries/s" {
		unit = ""
	}
	target := strings.TrimSpace(c.Budget + " " + unit)
	switch c.Status {
	case checkMet:
		return target + "  ✓"
	case checkNotComputed:
		return target + "  ✗ not computed: " + c.Reason
	default:
		return target + "  ✗"
	}
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return num(v, 0)
	}
	if math.Abs(v) >= 100 {
		return num(v, 0)
	}
	return num(v, 2)
}
