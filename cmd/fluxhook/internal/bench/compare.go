package bench

// The comparison with a baseline (--baseline river): the baseline's runs, fluxhook's beside
// them, the ratios, and the budget lines that judge them (issue: live traffic as cheap as the
// drain, faster than River at every rate).

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// baselineReport is the baseline's runs and the comparison with fluxhook's.
type baselineReport struct {
	Name        string           `json:"name"`
	Description string           `json:"description"`
	Drain       *drainResult     `json:"drain,omitempty"`
	Idle        *latencyResult   `json:"idle,omitempty"`
	Steady      []*latencyResult `json:"steady,omitempty"`
	// Comparisons are fluxhook's figure and the baseline's side by side, for each workload
	// both ran.
	Comparisons []comparison `json:"comparisons"`
}

// comparison is one measure of one workload on both sides.
type comparison struct {
	Workload string   `json:"workload"`
	Measure  string   `json:"measure"`
	Unit     string   `json:"unit"`
	Fluxhook *float64 `json:"fluxhook"`
	Baseline *float64 `json:"baseline"`
	// Ratio is Fluxhook / Baseline; null when either is missing or the baseline's is 0.
	Ratio *float64 `json:"ratio"`
}

// The compared measures, named as the budget lines name them.
const (
	measureCommitP50   = "commit → arrival p50"
	measureStartP99    = "insert start → arrival p99"
	measureDispatchCPU = "dispatcher CPU"
	measurePostgresCPU = "PostgreSQL CPU"
	measureThroughput  = "drain throughput"
	// ratioSuffix names a budget line on the ratio of a measure.
	ratioSuffix = ", fluxhook / River tuned"
)

// steadyLabel is a steady run's workload name in the budget and the tables: "steady" when one
// rate ran (as before rates could be listed), else "steady 500/s".
func (r *benchReport) steadyLabel(s *latencyResult) string {
	if len(r.Steady) <= 1 {
		return "steady"
	}
	return "steady " + num(s.RatePerSecond, 0) + "/s"
}

// latencyPairs are the latency workloads both sides ran: fluxhook's run and the baseline's of the
// same workload (steady runs matched by rate).
func (r *benchReport) latencyPairs() (labels []string, flux, base []*latencyResult) {
	if r.Baseline == nil {
		return nil, nil, nil
	}
	if r.Idle != nil && r.Baseline.Idle != nil {
		labels, flux, base = append(labels, "idle"), append(flux, r.Idle), append(base, r.Baseline.Idle)
	}
	for _, s := range r.Steady {
		for _, bs := range r.Baseline.Steady {
			if bs.RatePerSecond == s.RatePerSecond {
				labels, flux, base = append(labels, r.steadyLabel(s)), append(flux, s), append(base, bs)
			}
		}
	}
	return labels, flux, base
}

// compare fills the baseline's comparisons from both sides' runs.
func (r *benchReport) compare() {
	if r.Baseline == nil {
		return
	}
	out := []comparison{}
	pair := func(workload, measure, unit string, f, b *float64) {
		c := comparison{Workload: workload, Measure: measure, Unit: unit, Fluxhook: f, Baseline: b}
		if f != nil && b != nil && *b > 0 {
			v := *f / *b
			c.Ratio = &v
		}
		out = append(out, c)
	}
	val := func(v float64) *float64 { return &v }
	pct := func(p percentiles, v float64) *float64 {
		if p.N == 0 {
			return nil
		}
		return &v
	}
	cpu := func(c *costReport) (dispatcher, postgres *float64) {
		if c == nil {
			return nil, nil
		}
		return val(c.CPUMicrosPerEvent), c.PostgresCPUMicrosPerEvent
	}
	labels, flux, base := r.latencyPairs()
	for i, w := range labels {
		f, b := flux[i], base[i]
		pair(w, measureCommitP50, "ms", pct(f.FromCommit, f.FromCommit.P50), pct(b.FromCommit, b.FromCommit.P50))
		pair(w, measureStartP99, "ms", pct(f.FromStart, f.FromStart.P99), pct(b.FromStart, b.FromStart.P99))
		fd, fp := cpu(f.Cost)
		bd, bp := cpu(b.Cost)
		pair(w, measureDispatchCPU, "µs/event", fd, bd)
		pair(w, measurePostgresCPU, "µs/event", fp, bp)
	}
	if f, b := r.Drain, r.Baseline.Drain; f != nil && b != nil {
		rate := func(d *drainResult) *float64 {
			if d.Received == 0 || d.Seconds <= 0 {
				return nil
			}
			return val(d.EventsPerSecond)
		}
		pair("drain", measureThroughput, "events/s", rate(f), rate(b))
		fd, fp := cpu(f.Cost)
		bd, bp := cpu(b.Cost)
		pair("drain", measureDispatchCPU, "µs/event", fd, bd)
		pair("drain", measurePostgresCPU, "µs/event", fp, bp)
	}
	r.Baseline.Comparisons = out
}

// find is the comparison of measure in workload, if there is one.
func (b *baselineReport) find(workload, measure string) (comparison, bool) {
	for _, c := range b.Comparisons {
		if c.Workload == workload && c.Measure == measure {
			return c, true
		}
	}
	return comparison{}, false
}

// checkBaseline adds the budget lines of the comparison: on a quiet machine, what the issue
// asks of live traffic and of the drain, each ratio taken within one run.
//
//   - steady, every rate: commit → arrival p50 ≤ 0.8 ms and below River tuned's (ratio < 1);
//     insert start → arrival p99 ≤ 10 ms;
//   - steady at 1,000/s and more: dispatcher CPU ≤ 120 µs/event and ≤ 0.4 × River tuned's;
//     PostgreSQL CPU ≤ 0.6 × River tuned's (the whole cluster, both producers' inserts
//     included);
//   - idle: commit → arrival p50 ≤ 0.6 ms;
//   - drain: ≥ 2 × River tuned's throughput, dispatcher CPU ≤ 25 µs/event;
//   - and River tuned itself lost nothing, or its figures would compare nothing.
func (r *benchReport) checkBaseline(add func(workload, what string, value float64, unit, budget string, ok bool),
	notComputed func(workload, what string, value *float64, unit, budget, reason string)) {
	b := r.Baseline
	r.compare()
	absolute := func(workload, measure, unit, budget string, limit float64) {
		c, ok := b.find(workload, measure)
		if !ok || c.Fluxhook == nil {
			notComputed(workload, measure, nil, unit, budget, "fluxhook measured nothing")
			return
		}
		add(workload, measure, *c.Fluxhook, unit, budget, *c.Fluxhook <= limit)
	}
	ratio := func(workload, measure, budget string, ok func(float64) bool) {
		what := measure + ratioSuffix
		c, found := b.find(workload, measure)
		switch {
		case !found:
			notComputed(workload, what, nil, "×", budget, "River tuned did not run it")
		case c.Ratio == nil && measure == measurePostgresCPU && !r.Postgres.Throwaway:
			notComputed(workload, what, nil, "×", budget, "PostgreSQL's CPU is measured on the throwaway cluster only (DATABASE_URL is set)")
		case c.Ratio == nil:
			notComputed(workload, what, nil, "×", budget, "a side measured nothing")
		default:
			add(workload, what, *c.Ratio, "×", budget, ok(*c.Ratio))
		}
	}
	lost := func(workload string, lost, dups, rejected int) {
		add(workload, "River tuned: lost, duplicates, rejected", float64(lost+dups+rejected), "", "0", lost == 0 && dups == 0 && rejected == 0)
	}
	if b.Idle != nil && r.Idle != nil {
		absolute("idle", measureCommitP50, "ms", "≤ 0.6", 0.6)
		lost("idle", b.Idle.Lost, b.Idle.Duplicates, b.Idle.Rejected)
	}
	labels, flux, base := r.latencyPairs()
	for i, w := range labels {
		if w == "idle" {
			continue
		}
		absolute(w, measureCommitP50, "ms", "≤ 0.8", 0.8)
		ratio(w, measureCommitP50, "< 1", func(v float64) bool { return v < 1 })
		absolute(w, measureStartP99, "ms", "≤ 10", 10)
		if flux[i].RatePerSecond >= 1000 {
			absolute(w, measureDispatchCPU, "µs/event", "≤ 120", 120)
			ratio(w, measureDispatchCPU, "≤ 0.4", func(v float64) bool { return v <= 0.4 })
			ratio(w, measurePostgresCPU, "≤ 0.6", func(v float64) bool { return v <= 0.6 })
		}
		lost(w, base[i].Lost, base[i].Duplicates, base[i].Rejected)
	}
	if b.Drain != nil && r.Drain != nil {
		ratio("drain", measureThroughput, "≥ 2", func(v float64) bool { return v >= 2 })
		absolute("drain", measureDispatchCPU, "µs/event", "≤ 25", 25)
		lost("drain", b.Drain.Lost, b.Drain.Duplicates, b.Drain.Rejected)
	}
}

// writeComparison prints fluxhook and the baseline side by side with the ratio and, where the
// budget judges a measure or its ratio, the verdicts (verdict marks them shown).
func (r *benchReport) writeComparison(w io.Writer, verdict func(workload, what string) string) {
	b := r.Baseline
	if b == nil || len(b.Comparisons) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s\n", b.Description)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FLUXHOOK VS RIVER TUNED\tMEASURE\tRIVER TUNED\tFLUXHOOK\tFLUXHOOK / RIVER\tBUDGET")
	last := ""
	for _, c := range b.Comparisons {
		name := c.Workload
		if name == last {
			name = ""
		}
		last = c.Workload
		value := func(v *float64) string {
			if v == nil {
				return "n/a"
			}
			switch c.Unit {
			case "ms":
				return ms(*v) + " ms"
			case "events/s":
				return num(*v, 0) + " events/s"
			}
			if *v >= 100 {
				return num(*v, 0) + " " + c.Unit
			}
			return num(*v, 1) + " " + c.Unit
		}
		ratio := "n/a"
		if c.Ratio != nil {
			ratio = fmt.Sprintf("%.2f", *c.Ratio)
		}
		budget := verdict(c.Workload, c.Measure)
		if rv := verdict(c.Workload, c.Measure+ratioSuffix); rv != "" {
			if budget != "" {
				budget += "; "
			}
			budget += "ratio " + rv
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, c.Measure, value(c.Baseline), value(c.Fluxhook), ratio, budget)
	}
	labels, _, base := r.latencyPairs()
	runs := map[string]struct{ lost, dups, rejected int }{}
	for i, l := range labels {
		runs[l] = struct{ lost, dups, rejected int }{base[i].Lost, base[i].Duplicates, base[i].Rejected}
	}
	if d := b.Drain; d != nil && r.Drain != nil {
		labels = append(labels, "drain")
		runs["drain"] = struct{ lost, dups, rejected int }{d.Lost, d.Duplicates, d.Rejected}
	}
	for _, l := range labels {
		const what = "River tuned: lost, duplicates, rejected"
		fmt.Fprintf(tw, "%s\t%s\t%d, %d, %d\t\t\t%s\n", l, what, runs[l].lost, runs[l].dups, runs[l].rejected, verdict(l, what))
	}
	tw.Flush()
	fmt.Fprintln(w, "Both sides: the same producer (one event per transaction, same rate, connections and payload), the same verifying consumer;")
	fmt.Fprintln(w, "dispatcher CPU is fluxhook serve's or River's process's; PostgreSQL CPU is the whole cluster's over the window, both producers' inserts included.")
}
