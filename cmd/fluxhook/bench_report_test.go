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
