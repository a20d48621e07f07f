package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
)

// The backlog's flatness is judged on the fitted trend: noise around a flat line reads 1, a
// steady rise reads its end over its start, and one slow slice barely moves it.
func TestBenchSliceTrend(t *testing.T) {
	rate := func(v ...float64) []backlogSlice {
		s := make([]backlogSlice, len(v))
		for i, x := range v {
			s[i] = backlogSlice{EventsPerSecond: x}
		}
		return s
	}
	eps := func(s backlogSlice) float64 { return s.EventsPerSecond }
	for _, tc := range []struct {
		name   string
		slices []backlogSlice
		want   float64
		ok     bool
	}{
		{"flat with noise", rate(10000, 12000, 10000, 12000, 10000, 12000, 10000, 12000, 10000, 12000), 1.05, true},
		{"steady rise", rate(5000, 6000, 7000, 8000, 9000, 10000), 2, true},
		{"one slow slice in the middle", rate(15000, 15000, 15000, 15000, 15000, 7000, 15000, 15000, 15000, 15000, 15000), 1, true},
		{"too few slices", rate(10000, 20000), 0, false},
		{"a slice without a value", rate(10000, 0, 10000), 0, false},
	} {
		got, ok := sliceTrend(tc.slices, eps)
		if ok != tc.ok || math.Abs(got-tc.want) > 0.01 {
			t.Errorf("%s: sliceTrend = %.3f, %v; want %.2f, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// A null control (--producer-null) is reported as such and never meets the budget, whatever
// cost it reads; a real comparison is checked against 10% of the split design.
func TestBenchProducersBudgetAndNullControl(t *testing.T) {
	t.Parallel()
	split := &splitComparison{CostPercent: 1.5, Segments: 4, Pairs: 2}
	r := &benchReport{Producers: &producersResult{Comparisons: []producerComparison{
		{Connections: 8, CostPercent: 20, Pairs: 4, Split: split},
		{Connections: 32, CostPercent: 0.5, Pairs: 4, Split: split, NullControl: true},
	}}}
	r.check()
	got := map[string]bool{}
	for _, c := range r.Budget {
		got[c.What] = c.OK
	}
	if ok, found := got["trigger's cost to 8 producers"]; !found || !ok {
		t.Errorf("8 producers with a split cost of 1.5%%: checked %v, ok %v; want checked against the split design and met", found, ok)
	}
	if ok, found := got["null control, 32 producers (no trigger on either side)"]; !found || ok {
		t.Errorf("null control: reported %v, met %v; want reported and never met", found, ok)
	}
	if _, found := got["trigger's cost to 32 producers"]; found {
		t.Error("a null control was checked as the trigger's cost")
	}

	// A run whose producers did not prepare their insert is reported, never met: the same
	// trigger reads cheaper beside a costlier insert.
	r = &benchReport{Producers: &producersResult{Mode: "exec", Comparisons: []producerComparison{
		{Connections: 8, CostPercent: 2, Pairs: 4, Split: split},
	}}}
	r.check()
	if len(r.Budget) != 1 || r.Budget[0].What != "trigger's cost to 8 producers" || r.Budget[0].OK || r.BudgetMet {
		t.Errorf("exec-mode producers: budget %+v (met %v); want the line reported and not met", r.Budget, r.BudgetMet)
	}
}

// The budget's verdict decides the exit status: every check met exits 0; a check missed, or
// one that could not be computed, fails the run (an error wrapping errBudgetFailed, which
// main turns into exit status 1, not the usage status 2) and is named in the verdict and in
// its row; --no-budget only measures and exits 0 whatever was measured.
func TestBenchVerdict(t *testing.T) {
	t.Parallel()
	idle := func(p99 float64) *latencyResult {
		return &latencyResult{Events: 10, FromStart: percentiles{N: 10, P50: 1, P90: 2, P99: p99, Max: p99}}
	}
	drain := func(c *costReport) *drainResult {
		return &drainResult{Events: 100, Received: 100, Seconds: 0.005, EventsPerSecond: 20000, Cost: c}
	}
	goodCost := &costReport{Claims: 2, ClaimedBatches: 2, Settles: 2, ClaimsPerBatch: 1, SettlesPerBatch: 1}
	for _, tc := range []struct {
		name        string
		report      benchReport
		noBudget    bool
		verdict     string
		missed      int
		notComputed int
		// lines the table must print, and the failed checks the error must name
		table, named []string
	}{
		{
			name:    "met",
			report:  benchReport{Idle: idle(3), Drain: drain(goodCost)},
			verdict: verdictMet,
			table:   []string{"budget: all 7 checks met ✓"},
		},
		{
			name:    "missed",
			report:  benchReport{Idle: idle(7), Drain: drain(goodCost)},
			verdict: verdictFailed, missed: 1,
			table: []string{"budget: 1 of 7 checks failed (1 missed) ✗", "  ✗ idle: insert start → arrival p99 = 7 ms (budget ≤ 5)"},
			named: []string{"idle: insert start → arrival p99 = 7 ms (budget ≤ 5)"},
		},
		{
			name: "not computed",
			// The dispatcher's counters could not be read: the per-batch checks cannot be
			// computed, and used to vanish, leaving "all 5 checks met".
			report:  benchReport{Idle: idle(3), Drain: drain(&costReport{MetricsError: "the dispatcher's /metrics could not be read: refused"})},
			verdict: verdictFailed, notComputed: 2,
			table: []string{
				"claim statements per claimed batch  n/a  1  ✗ not computed: the dispatcher's /metrics could not be read: refused",
				"budget: 2 of 7 checks failed (2 not computed) ✗",
				"  ✗ drain: settle transactions per claimed batch: not computed: the dispatcher's /metrics could not be read: refused (budget 1)",
			},
			named: []string{"drain: claim statements per claimed batch (not computed: the dispatcher's /metrics could not be read: refused)"},
		},
		{
			name: "missed and not computed",
			report: benchReport{
				Postgres: pgServerInfo{StatementStats: "pg_stat_database only (pg_stat_statements is not in shared_preload_libraries)"},
				Backlog: &backlogResult{Events: 200, Received: 198, Lost: 2, Seconds: 1, EventsPerSecond: 198,
					Slices: []backlogSlice{{From: 0, To: 100, EventsPerSecond: 200}, {From: 100, To: 200, EventsPerSecond: 190}}, Cost: goodCost},
			},
			verdict: verdictFailed, missed: 2, notComputed: 3,
			table: []string{
				"throughput trend: fitted last slice / fitted first  n/a  0.8–1.25 (flat)  ✗ not computed: 2 slice(s) of the backlog; a trend needs at least three",
				"claim time trend: fitted last slice / fitted first  n/a  0.8–1.25 (flat)  ✗ not computed: no claim times without pg_stat_statements",
				"budget: 5 of 7 checks failed (2 missed, 3 not computed) ✗",
			},
			named: []string{"backlog: lost = 2 (budget 0)", "backlog: dispatcher peak RSS (not computed:"},
		},
		{
			name:     "no budget",
			report:   benchReport{Idle: idle(70), Drain: drain(nil)},
			noBudget: true,
			verdict:  verdictNotChecked,
			table:    []string{"budget: not checked (--no-budget)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.report
			r.judge(tc.noBudget)
			if r.Verdict != tc.verdict || r.ChecksMissed != tc.missed || r.ChecksNotComputed != tc.notComputed {
				t.Fatalf("verdict %q, %d missed, %d not computed; want %q, %d, %d\n%+v", r.Verdict, r.ChecksMissed, r.ChecksNotComputed,
					tc.verdict, tc.missed, tc.notComputed, r.Budget)
			}
			if r.BudgetMet != (tc.verdict == verdictMet) {
				t.Errorf("budget_met %v with verdict %q", r.BudgetMet, r.Verdict)
			}
			for _, c := range r.Budget {
				if c.OK != (c.Status == checkMet) || (c.Status == checkNotComputed) != (c.Reason != "") {
					t.Errorf("check %+v: ok, status and reason disagree", c)
				}
			}

			var out bytes.Buffer
			err := r.finish(&out, benchOptions{})
			switch {
			case tc.verdict == verdictFailed && !errors.Is(err, errBudgetFailed):
				t.Errorf("a failed budget returned %v, want errBudgetFailed (exit status 1)", err)
			case tc.verdict == verdictFailed && errors.Is(err, cli.ErrUsage):
				t.Errorf("a failed budget is a usage error (exit status 2): %v", err)
			case tc.verdict != verdictFailed && err != nil:
				t.Errorf("verdict %s returned %v, want nil (exit status 0)", tc.verdict, err)
			}
			for _, n := range tc.named {
				if err == nil || !strings.Contains(err.Error(), n) {
					t.Errorf("the error %v does not name %q", err, n)
				}
			}
			// tabwriter pads with spaces: compare with runs of spaces collapsed to two.
			table := regexp.MustCompile(`  +`).ReplaceAllString(out.String(), "  ")
			for _, line := range tc.table {
				if !strings.Contains(table, line) {
					t.Errorf("the table lacks %q:\n%s", line, out.String())
				}
			}

			out.Reset()
			if err := r.finish(&out, benchOptions{json: true}); (err != nil) != (tc.verdict == verdictFailed) {
				t.Errorf("--json: finish returned %v with verdict %s", err, tc.verdict)
			}
			var doc struct {
				Verdict     string `json:"verdict"`
				BudgetMet   bool   `json:"budget_met"`
				Missed      int    `json:"checks_missed"`
				NotComputed int    `json:"checks_not_computed"`
				Budget      []struct {
					What   string   `json:"what"`
					Value  *float64 `json:"value"`
					Status string   `json:"status"`
					Reason string   `json:"reason"`
				} `json:"budget"`
			}
			if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
				t.Fatalf("--json: %v\n%s", err, out.String())
			}
			if doc.Verdict != tc.verdict || doc.Missed != tc.missed || doc.NotComputed != tc.notComputed || len(doc.Budget) != len(r.Budget) {
				t.Errorf("--json: verdict %q, %d missed, %d not computed, %d checks; want %q, %d, %d, %d", doc.Verdict, doc.Missed, doc.NotComputed,
					len(doc.Budget), tc.verdict, tc.missed, tc.notComputed, len(r.Budget))
			}
			for _, c := range doc.Budget {
				if c.Status == checkNotComputed && (c.Reason == "" || c.Value != nil && strings.Contains(c.What, "per claimed batch")) {
					t.Errorf("--json: check %+v not computed without a reason, or with a value", c)
				}
			}
		})
	}
}

// The reference work's line says when the machine's speed changed during a run, either way, and
// stays quiet about a change within referenceChangeWarn or a reading that is missing.
func TestBenchReferenceWork(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		start, end float64
		warn       bool
	}{
		{40, 44, false},
		{40, 34, false},
		{40, 52, true},
		{40, 30, true},
	} {
		text := machineInfo{ReferenceStart: tc.start, ReferenceEnd: tc.end}.referenceText()
		if !strings.HasPrefix(text, "reference work (SHA-256 of 64 MiB, one core): ") {
			t.Errorf("%v → %v: %q, want the reference line", tc.start, tc.end, text)
		}
		if got := strings.Contains(text, "speed changed"); got != tc.warn {
			t.Errorf("%v → %v: %q; warning %v, want %v", tc.start, tc.end, text, got, tc.warn)
		}
	}
	if text := (machineInfo{ReferenceStart: 40}).referenceText(); text != "" {
		t.Errorf("without an end reading: %q, want no line", text)
	}
	if ms := referenceWork(); ms <= 0 {
		t.Errorf("referenceWork() = %v ms, want a positive time", ms)
	}
}
