package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/fluxhooktest"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestBenchBaselineChecks: with --baseline river the budget judges the lines on
// fluxhook's figures and on their ratios to River tuned's in the same run; a ratio that cannot
// be taken (River did not run that rate, PostgreSQL's CPU not measurable) is not computed, and
// the table shows both sides and the ratio.
func TestBenchBaselineChecks(t *testing.T) {
	t.Parallel()
	pg := func(v float64) *float64 { return &v }
	run := func(rate, commitP50, startP99, dispatcher, postgres float64) *latencyResult {
		return &latencyResult{
			Events: 100, RatePerSecond: rate,
			FromCommit:    percentiles{N: 100, P50: commitP50, P99: 2 * commitP50},
			FromStart:     percentiles{N: 100, P50: commitP50 + 1, P99: startP99},
			FromScheduled: percentiles{N: 100, P99: startP99},
			Cost:          &costReport{CPUMicrosPerEvent: dispatcher, PostgresCPUMicrosPerEvent: pg(postgres)},
		}
	}
	report := func() *benchReport {
		return &benchReport{
			Postgres: pgServerInfo{Throwaway: true},
			Idle:     run(50, 0.5, 3, 900, 1500),
			Steady:   []*latencyResult{run(500, 0.7, 8, 400, 800), run(1000, 0.9, 12, 100, 400)},
			Drain:    &drainResult{Events: 100, Received: 100, Seconds: 1, EventsPerSecond: 20000, Cost: &costReport{CPUMicrosPerEvent: 20, PostgresCPUMicrosPerEvent: pg(30)}},
			Baseline: &baselineReport{
				Name:        baselineRiver,
				Description: riverTuned,
				Idle:        run(50, 1, 20, 1000, 1600),
				Steady:      []*latencyResult{run(500, 0.8, 20, 500, 900), run(1000, 2, 60, 300, 800)},
				Drain:       &drainResult{Events: 100, Received: 100, Seconds: 1, EventsPerSecond: 8000, Cost: &costReport{CPUMicrosPerEvent: 95, PostgresCPUMicrosPerEvent: pg(80)}},
			},
		}
	}
	checks := func(r *benchReport) map[string]budgetCheck {
		r.check()
		out := map[string]budgetCheck{}
		for _, c := range r.Budget {
			out[c.Workload+"|"+c.What] = c
		}
		return out
	}
	r := report()
	got := checks(r)
	for key, want := range map[string]struct {
		value  float64
		status string
	}{
		"idle|commit → arrival p50":                                   {0.5, checkMet},
		"steady 500/s|commit → arrival p50":                           {0.7, checkMet},
		"steady 500/s|commit → arrival p50, fluxhook / River tuned":   {0.875, checkMet},
		"steady 500/s|insert start → arrival p99":                     {8, checkMet},
		"steady 1,000/s|commit → arrival p50":                         {0.9, checkMissed},
		"steady 1,000/s|commit → arrival p50, fluxhook / River tuned": {0.45, checkMet},
		"steady 1,000/s|insert start → arrival p99":                   {12, checkMissed},
		"steady 1,000/s|dispatcher CPU":                               {100, checkMet},
		"steady 1,000/s|dispatcher CPU, fluxhook / River tuned":       {1.0 / 3, checkMet},
		"steady 1,000/s|PostgreSQL CPU, fluxhook / River tuned":       {0.5, checkMet},
		"drain|drain throughput, fluxhook / River tuned":              {2.5, checkMet},
		"drain|dispatcher CPU":                                        {20, checkMet},
		"steady 1,000/s|River tuned: lost, duplicates, rejected":      {0, checkMet},
		"drain|River tuned: lost, duplicates, rejected":               {0, checkMet},
		"steady 1,000/s|1000/s, scheduled start → arrival p99":        {12, checkMissed},
		"steady 500/s|backlog when production ended":                  {0, checkMet},
		"steady 500/s|River tuned: lost, duplicates, rejected":        {0, checkMet},
		"idle|River tuned: lost, duplicates, rejected":                {0, checkMet},
		"steady 500/s|500/s, scheduled start → arrival p99":           {8, checkMet},
		"steady 1,000/s|backlog when production ended":                {0, checkMet},
		"steady 1,000/s|lost":                                         {0, checkMet},
		"steady 500/s|lost":                                           {0, checkMet},
		"idle|insert start → arrival p99":                             {3, checkMet},
		"drain|lost":                                                  {0, checkMet},
		"idle|lost":                                                   {0, checkMet},
		"idle|insert start → arrival p50":                             {1.5, checkMet},
	} {
		c, ok := got[key]
		if !ok {
			t.Errorf("no budget line %q", key)
			continue
		}
		if c.Status != want.status || c.Value == nil || math.Abs(*c.Value-want.value) > 1e-9 {
			v := "nil"
			if c.Value != nil {
				v = trimFloat(*c.Value)
			}
			t.Errorf("%s: %s = %s, want %s = %v", key, c.Status, v, want.status, want.value)
		}
	}
	// The CPU lines are the at 1,000/s: not judged at 500/s.
	for _, key := range []string{"steady 500/s|dispatcher CPU", "steady 500/s|dispatcher CPU, fluxhook / River tuned", "idle|commit → arrival p50, fluxhook / River tuned"} {
		if _, ok := got[key]; ok {
			t.Errorf("budget line %q, which the issue does not ask for", key)
		}
	}
	// Slower than River from commit: the ratio line is missed even within 0.8 ms.
	r = report()
	r.Baseline.Steady[0].FromCommit.P50 = 0.6
	if c := checks(r)["steady 500/s|commit → arrival p50, fluxhook / River tuned"]; c.Status != checkMissed {
		t.Errorf("fluxhook 0.7 ms against River's 0.6 ms: %s, want missed", c.Status)
	}
	// River lost an event: its line fails, whatever the ratios.
	r = report()
	r.Baseline.Drain.Lost = 1
	if c := checks(r)["drain|River tuned: lost, duplicates, rejected"]; c.Status != checkMissed {
		t.Errorf("River lost an event in the drain: %s, want missed", c.Status)
	}
	// River ran one of the two rates only: no ratio for the other.
	r = report()
	r.Baseline.Steady = r.Baseline.Steady[:1]
	got = checks(r)
	if _, ok := got["steady 1,000/s|dispatcher CPU, fluxhook / River tuned"]; ok {
		t.Error("a ratio line for a rate River did not run")
	}
	if c := got["steady 500/s|commit → arrival p50, fluxhook / River tuned"]; c.Status != checkMet {
		t.Errorf("the rate both ran: %s, want met", c.Status)
	}
	// PostgreSQL is a server of DATABASE_URL: its CPU is not ours to count, and the ratio the
	// budget asks for cannot be taken.
	r = report()
	r.Postgres.Throwaway = false
	for _, c := range []*costReport{r.Idle.Cost, r.Steady[0].Cost, r.Steady[1].Cost, r.Drain.Cost,
		r.Baseline.Idle.Cost, r.Baseline.Steady[0].Cost, r.Baseline.Steady[1].Cost, r.Baseline.Drain.Cost} {
		c.PostgresCPUMicrosPerEvent = nil
	}
	got = checks(r)
	if c := got["steady 1,000/s|PostgreSQL CPU, fluxhook / River tuned"]; c.Status != checkNotComputed || !strings.Contains(c.Reason, "DATABASE_URL") {
		t.Errorf("PostgreSQL CPU ratio on a server of DATABASE_URL: %s (%s), want not computed, naming DATABASE_URL", c.Status, c.Reason)
	}
	var sawPG bool
	for _, c := range r.Baseline.Comparisons {
		if c.Measure == measurePostgresCPU {
			sawPG = true
			if c.Ratio != nil {
				t.Errorf("%s: a PostgreSQL CPU ratio without PostgreSQL's CPU", c.Workload)
			}
		}
	}
	if !sawPG {
		t.Error("no PostgreSQL CPU comparison")
	}

	// The table: both columns, the ratio, the verdicts beside them.
	r = report()
	r.compare()
	r.check()
	var out bytes.Buffer
	r.writeTable(&out, false)
	for _, want := range []string{
		"FLUXHOOK VS RIVER TUNED  MEASURE", "RIVER TUNED", "FLUXHOOK / RIVER",
		"steady 1,000/s", "commit → arrival p50", "2.00 ms", "0.90 ms", "0.45", "≤ 0.8 ms  ✗; ratio < 1 ×  ✓",
		"drain throughput", "8,000 events/s", "20,000 events/s", "2.50", "ratio ≥ 2 ×  ✓",
		"River tuned: lost, duplicates, rejected",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, out.String())
		}
	}
	if strings.Count(out.String(), "commit → arrival p50, fluxhook / River tuned") != 0 {
		t.Errorf("the ratio lines are printed again below the workloads:\n%s", out.String())
	}
}

// TestBenchRiverBaselineSmoke runs `fluxhook bench --baseline river` at a tiny scale, as a user
// would: the bench builds the River baseline, migrates River's schema, and runs the real River
// dispatcher and producer against the test server beside fluxhook's. Nothing may be lost or
// duplicated on either side, and the report must compare them. The times are not looked at.
func TestBenchRiverBaselineSmoke(t *testing.T) {
	t.Parallel()
	bin := fluxhooktest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "--workload", "idle,steady,drain", "--baseline", "river",
		"--idle-events", "20", "--drain-events", "500", "--rate", "200", "--duration", "1s", "--connections", "2",
		"--no-budget", "--json", "--quiet")
	// The bench builds the baseline with the go command: it needs the toolchain's environment.
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name != "DATABASE_URL" && name != "REDIS_URL" && !strings.HasPrefix(name, "WEBHOOK_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "DATABASE_URL="+sqltest.ServerURL(), "GORACE=atexit_sleep_ms=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("fluxhook bench --baseline river: %v\nstderr:\n%s", err, stderr.String())
	}
	type run struct {
		Events     int `json:"events"`
		Received   int `json:"received"`
		Lost       int `json:"lost"`
		Duplicates int `json:"duplicates"`
		Rejected   int `json:"rejected"`
		FromCommit struct {
			N int `json:"n"`
		} `json:"latency_from_commit"`
	}
	var rep struct {
		Idle     run   `json:"idle"`
		Steady   []run `json:"steady"`
		Drain    run   `json:"drain"`
		Baseline *struct {
			Name        string       `json:"name"`
			Idle        run          `json:"idle"`
			Steady      []run        `json:"steady"`
			Drain       run          `json:"drain"`
			Comparisons []comparison `json:"comparisons"`
		} `json:"baseline"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, stdout.String())
	}
	if rep.Baseline == nil || rep.Baseline.Name != baselineRiver {
		t.Fatalf("no River baseline in the report:\n%s", stdout.String())
	}
	if len(rep.Steady) != 1 || len(rep.Baseline.Steady) != 1 {
		t.Fatalf("steady runs: fluxhook %d, River %d; want one each", len(rep.Steady), len(rep.Baseline.Steady))
	}
	for name, r := range map[string]run{
		"idle": rep.Idle, "River idle": rep.Baseline.Idle, "steady": rep.Steady[0], "River steady": rep.Baseline.Steady[0],
	} {
		want := 20
		if strings.HasSuffix(name, "steady") {
			want = 200
		}
		if r.Events != want || r.FromCommit.N != want || r.Lost != 0 || r.Duplicates != 0 || r.Rejected != 0 {
			t.Errorf("%s: %+v; want %d events measured, none lost, duplicated or rejected", name, r, want)
		}
	}
	for name, r := range map[string]run{"drain": rep.Drain, "River drain": rep.Baseline.Drain} {
		if r.Events != 500 || r.Received != 500 || r.Lost != 0 || r.Duplicates != 0 || r.Rejected != 0 {
			t.Errorf("%s: %+v; want 500 received, none lost, duplicated or rejected", name, r)
		}
	}
	measured := map[string]bool{}
	for _, c := range rep.Baseline.Comparisons {
		if c.Fluxhook != nil && c.Baseline != nil && c.Ratio != nil {
			measured[c.Workload+"|"+c.Measure] = true
		}
	}
	for _, key := range []string{"idle|commit → arrival p50", "steady|insert start → arrival p99", "steady|dispatcher CPU", "drain|drain throughput", "drain|dispatcher CPU"} {
		if !measured[key] {
			t.Errorf("no comparison of %s with both sides and their ratio: %+v", key, rep.Baseline.Comparisons)
		}
	}
}

// TestBenchFluxhookBinaryHasNoRiver: River is the bench's baseline, built as a program of its
// own; the fluxhook binary must not link it.
func TestBenchFluxhookBinaryHasNoRiver(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/fluxora/fluxhook/cmd/fluxhook").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/fluxora/fluxhook/cmd/fluxhook/internal/bench/produce") {
		t.Fatalf("go list -deps did not list the bench's packages:\n%s", out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "riverqueue") || strings.HasSuffix(line, "/riverbaseline") {
			t.Errorf("the fluxhook binary depends on %s", line)
		}
	}
}
