package main

import (
	"math"
	"testing"
)

// The backlog's flatness is judged on the fitted trend: noise around a flat line reads 1, a
// steady rise reads its end over its start, and one slow slice barely moves it.
func TestSliceTrend(t *testing.T) {
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
func TestProducersBudgetAndNullControl(t *testing.T) {
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
