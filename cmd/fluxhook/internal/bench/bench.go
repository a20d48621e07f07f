package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
	"github.com/fluxora/fluxhook/sql/endpoints"
)

// benchWorkloads are the workloads in the order they run.
var benchWorkloads = []string{"drain", "idle", "steady", "producers", "fanout", "ordered", "backlog", "soak", "api"}

// benchDefaultWorkloads run when --workload is not given: everything but backlog (1M rows
// take minutes), soak (30 minutes) and api (10M rows take minutes to fill).
const benchDefaultWorkloads = "drain,idle,steady,producers,fanout,ordered"

// benchOptions are the command line of `fluxhook bench`.
type benchOptions struct {
	workloads        []string
	drainEvents      int
	backlogEvents    int
	backlogSlice     int
	rates            []int  // steady's, one run each (--rate)
	baseline         string // --baseline: "" or baselineRiver
	duration         time.Duration
	connections      int
	idleEvents       int
	idleInterval     time.Duration
	producerConns    []int
	producerDuration time.Duration
	producerReps     int
	producerNull     bool
	producerMode     string
	fanoutEndpoints  int
	fanoutEvents     int
	fanoutIdleEvents int
	orderedStreams   int
	orderedPerStream int
	soakDuration     time.Duration
	soakShare        float64
	soakInterval     time.Duration
	soakWarmup       time.Duration
	soakRetention    time.Duration // 0: soakRetention's default
	apiLogRows       int64
	apiEndpoints     int
	apiRate          int
	apiSteadyRate    int
	apiDuration      time.Duration
	apiPairs         int
	payloadBytes     int
	json             bool
	noBudget         bool
	statements       bool
	quiet            bool
	databaseURL      string
	redisURL         string
	profileDir       string
}

func (o benchOptions) runs(w string) bool { return slices.Contains(o.workloads, w) }

func parseBenchOptions(env Env, args []string) (benchOptions, error) {
	var o benchOptions
	fs := cli.NewFlagSet("bench", env.Stdout, env.Stderr, "fluxhook bench [flags]")
	dbURL := cli.DatabaseURLFlag(fs, env.Getenv)
	workloads := fs.String("workload", benchDefaultWorkloads,
		"comma-separated `workloads`: "+strings.Join(benchWorkloads, ", ")+" (backlog, soak and api are opt-in: 1M rows take minutes, a soak 30, api's 10M-row fill minutes)")
	fs.IntVar(&o.drainEvents, "drain-events", 20000, "drain, and soak's drain rate when drain does not run: events prefilled before the dispatcher starts")
	fs.IntVar(&o.backlogEvents, "backlog-events", 1000000, "backlog: events prefilled before the dispatcher starts")
	fs.IntVar(&o.backlogSlice, "backlog-slice", 100000, "backlog: throughput is reported per slice of this many events")
	rates := fs.String("rate", "1000", "steady: events per second, or a comma-separated list of rates, each a run of its own")
	fs.StringVar(&o.baseline, "baseline", "", "run a baseline beside fluxhook; the one there is, river, runs River tuned (FetchCooldown 1 ms, poll 20 ms, 200 workers; its producer with InsertTx) after each drain, idle and steady run, and reports the ratios; built with Go from the fluxhook checkout the bench runs in")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "steady: how long to produce")
	fs.IntVar(&o.connections, "connections", 8, "steady and soak: producer connections")
	fs.IntVar(&o.idleEvents, "idle-events", 200, "idle, and each of ordered's two idle runs: events, one at a time")
	fs.DurationVar(&o.idleInterval, "idle-interval", 20*time.Millisecond, "idle: time between events")
	producerConns := fs.String("producer-connections", "8,32", "producers: comma-separated `numbers` of concurrent producers")
	fs.DurationVar(&o.producerDuration, "producer-duration", time.Second, "producers: length of each measured segment (the trigger is switched between segments)")
	fs.IntVar(&o.producerReps, "producer-reps", 8, "producers: rounds per connection count, each a whole pair (all producers with the trigger, then all without, ABBA order) and a split pair (half with and half without, then swapped); the medians count")
	fs.BoolVar(&o.producerNull, "producer-null", false, "producers: null control: the producers marked \"with the trigger\" run without it too, so each design's cost shows its own bias (should read 0); it is never judged: its budget line reads \"not computed\" (add --no-budget)")
	fs.StringVar(&o.producerMode, "producer-mode", "prepared", "producers: how the producers send their insert: prepared (a driver with a statement cache: pgx, JDBC after a few uses), exec (planned on every execution: node-postgres, the original's driver, and most drivers without a cache), simple (the simple query protocol: psql, poolers in transaction mode)")
	cli.Document(fs, "producer-mode", cli.FlagDoc{Placeholder: "prepared|exec|simple", Default: "prepared"})
	fs.IntVar(&o.fanoutEndpoints, "fanout-endpoints", 10, "fanout: managed endpoints every event goes to, each its own consumer path and secret")
	fs.IntVar(&o.fanoutEvents, "fanout-events", 2000, "fanout: events prefilled before the dispatcher starts (each becomes one delivery per endpoint)")
	fs.IntVar(&o.fanoutIdleEvents, "fanout-idle-events", 300, "fanout: events, one at a time --idle-interval apart, for the latency per delivery")
	fs.IntVar(&o.orderedStreams, "ordered-streams", 1000, "ordered: streams (stream_ids) prefilled, --ordered-events-per-stream events each, interleaved; drained unordered, then with WEBHOOK_ORDERING=stream, on the same run")
	fs.IntVar(&o.orderedPerStream, "ordered-events-per-stream", 20, "ordered: events per stream")
	fs.DurationVar(&o.soakDuration, "soak-duration", 30*time.Minute, "soak: how long to produce (a whole number of --soak-interval)")
	fs.Float64Var(&o.soakShare, "soak-share", 0.5, "soak: the producer's rate as a share of the drain rate (the drain workload's, or a drain of --drain-events first)")
	fs.DurationVar(&o.soakInterval, "soak-interval", time.Minute, "soak: time between samples")
	fs.DurationVar(&o.soakWarmup, "soak-warmup", 2*time.Minute, "soak: production before --soak-duration starts (a whole number of --soak-interval, 0 for none): its samples, the run's quietest while the delivery log is still empty, are printed but in no drift window")
	fs.DurationVar(&o.soakRetention, "soak-retention", 0, "soak: the dispatcher's WEBHOOK_RETENTION, at least 1m (the janitor runs once a minute)")
	cli.Document(fs, "soak-retention", cli.FlagDoc{Placeholder: "DURATION", Default: "--soak-duration / 6, at least 1m"})
	fs.Int64Var(&o.apiLogRows, "api-log-rows", 10000000, "api: delivery-log rows filled over the default retention (7 days) before the runs; 10M take minutes")
	fs.IntVar(&o.apiEndpoints, "api-endpoints", 10000, "api: managed endpoints the log's deliveries went to, 100 per tenant")
	fs.IntVar(&o.apiRate, "api-rate", 50, "api: API requests per second in all, the three reads in turn (delivery by id, an endpoint's deliveries, dead letters)")
	fs.IntVar(&o.apiSteadyRate, "api-steady-rate", 500, "api: events per second of the steady flow delivered meanwhile")
	fs.DurationVar(&o.apiDuration, "api-duration", 20*time.Second, "api: length of each run")
	fs.IntVar(&o.apiPairs, "api-pairs", 2, "api: runs without the API and with it, in turn, this many of each")
	fs.IntVar(&o.payloadBytes, "payload-bytes", 200, "padding in each event's payload")
	fs.BoolVar(&o.json, "json", false, "print the results as JSON instead of a table")
	fs.BoolVar(&o.noBudget, "no-budget", false, "only measure: no budget verdict, and exit 0 whenever the run itself worked (without it, a budget check missed or not computed exits 1)")
	fs.BoolVar(&o.statements, "statements", false, "also list the dispatcher's statements per workload (needs pg_stat_statements)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress lines on stderr")
	fs.StringVar(&o.profileDir, "profile", "", "write each dispatcher's CPU and allocation profiles under this directory (DIR/<workload>-<n>/cpu.pprof, allocs.pprof)")
	cli.Document(fs, "profile", cli.FlagDoc{Placeholder: "DIR"})
	cli.Document(fs, "rate", cli.FlagDoc{Placeholder: "RATES", Default: "1000; 500,1000 with --baseline river"})
	cli.Document(fs, "baseline", cli.FlagDoc{Placeholder: "NAME"})
	redisURL := &cli.URLValue{URL: env.Getenv("REDIS_URL")} // printed with its password redacted
	fs.Var(redisURL, "redis-url", "Redis for the dispatcher, whose commands are counted (empty: none)")
	cli.Document(fs, "redis-url", cli.FlagDoc{Placeholder: "URL", Env: "REDIS_URL"})
	if err := cli.NoArguments(fs, args); err != nil {
		return o, err
	}
	o.databaseURL, o.redisURL = *dbURL, redisURL.URL
	for _, w := range strings.Split(*workloads, ",") {
		w = strings.TrimSpace(w)
		if w == "" {
			continue
		}
		if !slices.Contains(benchWorkloads, w) {
			return o, cli.UsageError("--workload: unknown workload %q (choose from %s)", w, strings.Join(benchWorkloads, ", "))
		}
		if !slices.Contains(o.workloads, w) {
			o.workloads = append(o.workloads, w)
		}
	}
	if len(o.workloads) == 0 {
		return o, cli.UsageError("--workload: name at least one workload")
	}
	if o.baseline != "" && !o.runs("drain") && !o.runs("idle") && !o.runs("steady") {
		return o, cli.UsageError("--baseline %s compares drain, idle and steady: add at least one of them to --workload", o.baseline)
	}
	switch o.baseline {
	case "", baselineRiver:
	default:
		return o, cli.UsageError("--baseline: %q is not a baseline (the one there is: %s)", o.baseline, baselineRiver)
	}
	rateSet := false
	fs.Visit(func(f *flag.Flag) { rateSet = rateSet || f.Name == "rate" })
	if !rateSet && o.baseline == baselineRiver {
		*rates = "500,1000"
	}
	for _, r := range strings.Split(*rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n < 1 {
			return o, cli.UsageError("--rate: %q is not a positive number of events per second", r)
		}
		if !slices.Contains(o.rates, n) {
			o.rates = append(o.rates, n)
		}
	}
	for _, c := range strings.Split(*producerConns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 || n > 150 {
			return o, cli.UsageError("--producer-connections: %q is not a number of connections between 1 and 150", c)
		}
		o.producerConns = append(o.producerConns, n)
	}
	switch {
	case o.drainEvents < 1, o.backlogEvents < 1, o.idleEvents < 1, o.connections < 1,
		o.fanoutEvents < 1, o.fanoutIdleEvents < 1:
		return o, cli.UsageError("event counts, --rate and --connections must be positive")
	case o.orderedStreams < 1 || o.orderedPerStream < 1:
		return o, cli.UsageError("--ordered-streams and --ordered-events-per-stream must be positive")
	case o.fanoutEndpoints < 1 || o.fanoutEndpoints > maxFanoutEndpoints:
		return o, cli.UsageError("--fanout-endpoints must be between 1 and %d", maxFanoutEndpoints)
	case o.connections > 150:
		return o, cli.UsageError("--connections must be at most 150")
	case o.backlogSlice < 1:
		return o, cli.UsageError("--backlog-slice must be positive")
	case o.duration <= 0, o.producerDuration <= 0, o.idleInterval <= 0:
		return o, cli.UsageError("durations must be positive")
	case !validProducerMode(o.producerMode):
		return o, cli.UsageError("--producer-mode: %q is not prepared, exec or simple", o.producerMode)
	case o.producerReps < 1:
		return o, cli.UsageError("--producer-reps must be at least 1")
	case o.soakDuration <= 0 || o.soakInterval <= 0 || o.soakDuration < 2*o.soakInterval:
		return o, cli.UsageError("--soak-duration must be at least two --soak-interval, both positive")
	case o.soakWarmup < 0 || o.soakWarmup%o.soakInterval != 0:
		return o, cli.UsageError("--soak-warmup must be a whole number of --soak-interval (0 for none)")
	case o.soakShare <= 0 || o.soakShare > 1:
		return o, cli.UsageError("--soak-share must be above 0 and at most 1")
	case o.soakRetention != 0 && o.soakRetention < soakMinRetention:
		return o, cli.UsageError("--soak-retention must be at least %s (the dispatcher's minimum WEBHOOK_RETENTION)", soakMinRetention)
	case o.apiLogRows < 1 || o.apiLogRows > 100_000_000:
		return o, cli.UsageError("--api-log-rows must be between 1 and 100000000")
	case o.apiEndpoints < 1 || o.apiEndpoints > 1_000_000:
		return o, cli.UsageError("--api-endpoints must be between 1 and 1000000")
	case o.apiRate < 1 || o.apiSteadyRate < 1:
		return o, cli.UsageError("--api-rate and --api-steady-rate must be positive")
	case o.apiDuration <= 0 || o.apiPairs < 1:
		return o, cli.UsageError("--api-duration must be positive and --api-pairs at least 1")
	case o.payloadBytes < 0 || o.payloadBytes > 1<<20:
		return o, cli.UsageError("--payload-bytes must be between 0 and 1048576")
	}
	return o, nil
}

// bench is one run of `fluxhook bench`.
type bench struct {
	opts     benchOptions
	exe      string
	progress io.Writer
	db       *benchDB
	redis    *redisCounter
	consumer *consumerProc
	secret   string
	// endpointSecrets are the fanout workload's endpoints' secrets, one per consumer path
	// /ep/<i> (nil when fanout does not run).
	endpointSecrets []string
	// dispatcherEnv is the configuration every dispatcher child gets (before overrides).
	dispatcherEnv map[string]string
	// passedOn lists the WEBHOOK_* settings taken from the environment, for the report.
	passedOn []string
	// workload is the one running, and sessions counts its dispatchers (profile names).
	workload string
	sessions int
	// river is the River baseline's program (--baseline river), nil without it.
	river *riverBaseline
}

// Env is what the bench takes from the command line's process, as every fluxhook subcommand
// does: the standard streams, the environment and the signals are handed in rather than read
// from os, so that the flags and the report can be tested in-process with buffers.
type Env struct {
	// Stdout takes the report alone, so that --json output can be piped to a script.
	Stdout io.Writer
	// Stderr takes the progress lines (unless --quiet) and the flags' usage.
	Stderr io.Writer
	// Getenv reads DATABASE_URL, REDIS_URL and the WEBHOOK_* variables to pass on.
	Getenv func(string) string
	// Signals delivers SIGINT/SIGTERM after the first (the first cancels Run's context): a
	// second one exits at once. Nil when nobody sends signals.
	Signals <-chan os.Signal
	// ServeVariables names the variables `fluxhook serve` reads whose values are not secret:
	// the WEBHOOK_* ones set in the environment are passed on to every dispatcher (the user
	// is measuring their configuration), and the report shows them. The list is serve's, so
	// that a new setting is passed on without the bench knowing of it.
	ServeVariables []string
}

// Run is `fluxhook bench` with args after the command's name: it parses the flags, runs the
// workloads and prints the report. Its error is the command's result: one wrapping
// cli.ErrUsage for a bad command line, an error naming the checks that failed when the budget
// was not met (after the whole report), nil otherwise and after -h. With the hidden first
// argument internal-consumer it is the consumer child the bench starts.
func Run(ctx context.Context, env Env, args []string) error {
	if len(args) > 0 && args[0] == benchConsumerMode {
		return runBenchConsumer(ctx, env, args[1:])
	}
	opts, err := parseBenchOptions(env, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to run the consumer and the dispatcher: %w", err)
	}
	b := &bench{opts: opts, exe: exe, progress: env.Stderr}
	if opts.quiet {
		b.progress = io.Discard
	}
	// A second Ctrl-C while cleaning up must not leave children behind: the children are in
	// their own process groups and die with us (Pdeathsig), so exiting at once is safe.
	if env.Signals != nil {
		go func() {
			if _, ok := <-env.Signals; ok {
				fmt.Fprintln(env.Stderr, "bench: second signal: exiting now (children are killed with this process)")
				os.Exit(130)
			}
		}()
	}
	rep, err := b.run(ctx, env)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted; everything the bench started was stopped and removed")
		}
		return err
	}
	return rep.finish(env.Stdout, opts)
}

// finish prints the report and returns the budget's verdict as the command's result: nil when
// every check was met or --no-budget asked for no verdict, else an error (exit status 1) that
// names the checks missed and those that could not be computed.
func (r *benchReport) finish(w io.Writer, opts benchOptions) error {
	if opts.json {
		if err := cli.WriteJSON(w, r); err != nil {
			return err
		}
	} else {
		r.writeTable(w, opts.statements)
	}
	return r.verdictError()
}

// run starts what the workloads need, runs them, and removes everything it started.
func (b *bench) run(ctx context.Context, env Env) (_ *benchReport, err error) {
	b.secret = "bench-" + randomHexString(16)
	b.dispatcherEnv = map[string]string{}
	for _, name := range env.ServeVariables {
		if !strings.HasPrefix(name, "WEBHOOK_") || name == "WEBHOOK_URL" {
			continue
		}
		if v := env.Getenv(name); v != "" {
			b.dispatcherEnv[name] = v
			b.passedOn = append(b.passedOn, name+"="+v)
		}
	}
	if b.opts.baseline == baselineRiver {
		b.logf("building the River baseline (go build %s)", riverBaselinePackage)
		if b.river, err = buildRiverBaseline(ctx); err != nil {
			return nil, err
		}
		defer b.river.close()
	}
	if b.redis, err = newRedisCounter(ctx, b.opts.redisURL); err != nil {
		return nil, err
	}
	defer b.redis.close()
	if b.opts.redisURL != "" {
		b.dispatcherEnv["REDIS_URL"] = b.opts.redisURL
	}

	if b.db, err = openBenchDB(ctx, b.opts.databaseURL, b.progress); err != nil {
		return nil, err
	}
	defer b.db.close(b.progress)
	b.logf("bench database %s ready (%s; %s)", b.db.name, b.db.info.Version, b.db.info.StatementStats)
	b.dispatcherEnv["DATABASE_URL"] = b.db.url
	b.dispatcherEnv["WEBHOOK_SECRET"] = b.secret
	if b.river != nil {
		if err := b.runRiver(ctx, "migrate"); err != nil {
			return nil, err
		}
		b.logf("River's schema migrated (rivermigrate)")
	}

	if b.opts.runs("fanout") || b.opts.runs("api") {
		// The api workload's steady flow goes to the first endpoint path.
		n := 1
		if b.opts.runs("fanout") {
			n = b.opts.fanoutEndpoints
		}
		b.endpointSecrets = make([]string, n)
		for i := range b.endpointSecrets {
			if b.endpointSecrets[i], err = endpoints.GenerateSecret(endpoints.SchemeFluxora); err != nil {
				return nil, err
			}
		}
	}
	if b.consumer, err = startConsumer(ctx, b.exe, b.secret, b.endpointSecrets); err != nil {
		return nil, err
	}
	defer b.consumer.close()
	b.dispatcherEnv["WEBHOOK_URL"] = b.consumer.hookURL()

	rep := newBenchReport(b)
	for _, w := range benchWorkloads {
		if !b.opts.runs(w) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b.logf("%s: starting", w)
		b.workload, b.sessions = w, 0
		var err error
		switch w {
		case "drain":
			if rep.Drain, err = b.drain(ctx); err == nil && b.river != nil {
				b.logf("drain: River tuned")
				rep.Baseline.Drain, err = b.riverDrain(ctx)
			}
		case "idle":
			if rep.Idle, err = b.idle(ctx); err == nil && b.river != nil {
				b.logf("idle: River tuned")
				rep.Baseline.Idle, err = b.riverIdle(ctx)
			}
		case "steady":
			// fluxhook, then River, at each rate in turn: each pair shares the machine's
			// state of the moment.
			for _, rate := range b.opts.rates {
				b.logf("steady: fluxhook at %d/s", rate)
				var r *latencyResult
				if r, err = b.steady(ctx, rate); err != nil {
					break
				}
				rep.Steady = append(rep.Steady, r)
				if b.river != nil {
					b.logf("steady: River tuned at %d/s", rate)
					if r, err = b.riverSteady(ctx, rate); err != nil {
						break
					}
					rep.Baseline.Steady = append(rep.Baseline.Steady, r)
				}
			}
		case "producers":
			rep.Producers, err = b.producers(ctx)
		case "fanout":
			rep.Fanout, err = b.fanout(ctx)
		case "ordered":
			rep.Ordered, err = b.ordered(ctx)
		case "backlog":
			rep.Backlog, err = b.backlog(ctx)
		case "soak":
			rep.Soak, err = b.soak(ctx, rep.Drain)
		case "api":
			rep.API, err = b.api(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w, err)
		}
	}
	rep.Machine.ReferenceEnd = referenceWork()
	rep.compare()
	rep.judge(b.opts.noBudget)
	return rep, nil
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "bench: "+format+"\n", args...)
}

func randomHexString(n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}

// machineInfo describes where the bench ran.
type machineInfo struct {
	CPUs    int    `json:"cpus"`
	OS      string `json:"os"`
	Go      string `json:"go"`
	Load    string `json:"load_average"`
	CPUName string `json:"cpu,omitempty"`
	// ReferenceStart and ReferenceEnd are how long one fixed piece of work (referenceWork)
	// took on one core when the run started and when it ended, in milliseconds: a virtual
	// machine whose host gets busy slows down with nothing inside it to show for it (no load,
	// no steal time reported), and its absolute figures then compare with no other run's.
	ReferenceStart float64 `json:"reference_ms_start"`
	ReferenceEnd   float64 `json:"reference_ms_end"`
}

// referenceMiB is how much data referenceWork hashes: about 20-50 ms of one core.
const referenceMiB = 64

// referenceWork times SHA-256 over referenceMiB MiB on the calling goroutine, in milliseconds.
func referenceWork() float64 {
	buf := make([]byte, 1<<20)
	h := sha256.New()
	start := time.Now()
	for range referenceMiB {
		h.Write(buf)
	}
	_ = h.Sum(nil)
	return float64(time.Since(start).Microseconds()) / 1000
}

// referenceChangeWarn is the change of referenceWork's time between a run's start and end
// beyond which the report says the machine's speed changed under the run.
const referenceChangeWarn = 0.2

// referenceText is the report's line on referenceWork: both times and, past
// referenceChangeWarn, what the change means for the figures.
func (m machineInfo) referenceText() string {
	if m.ReferenceStart <= 0 || m.ReferenceEnd <= 0 {
		return ""
	}
	change := m.ReferenceEnd/m.ReferenceStart - 1
	text := fmt.Sprintf("reference work (SHA-256 of %d MiB, one core): %s ms at the start, %s at the end (%+.0f%%)",
		referenceMiB, ms(m.ReferenceStart), ms(m.ReferenceEnd), 100*change)
	if math.Abs(change) > referenceChangeWarn {
		text += ": the machine's speed changed during the run; compare its ratios (both sides measured at the same moments), not its absolute figures, with another run's"
	}
	return text
}

func currentMachine() machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(),
		ReferenceStart: referenceWork()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.Load = strings.Join(f[:3], " ")
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPUName = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return m
}
