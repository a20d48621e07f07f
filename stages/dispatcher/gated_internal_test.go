package dispatcher

import (
	"slices"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
)

// TestGatedLearnsTheProbesEnd: endpoints held behind a half-open probe name its breaker
// (behindProbe), and a read of the breakers (learn) releases those whose circuit closed or
// whose probe was given back, holds those open again until their reset, and keeps those whose
// probe is still in flight, and any hold noted after the read was taken.
func TestGatedLearnsTheProbesEnd(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	ep := func(key, hash string) *delivery.Endpoint { return &delivery.Endpoint{Key: key, Hash: hash} }
	behind := func(e *delivery.Endpoint) *delivery.Delivery {
		return &delivery.Delivery{ID: 1, Endpoint: e, Outcome: delivery.Outcome{Kind: delivery.Defer,
			Delay: 35 * time.Second, Reason: gate.DeferProbe.String()}}
	}
	open := &delivery.Delivery{ID: 2, Endpoint: ep("open", "h-open"), Outcome: delivery.Outcome{Kind: delivery.Defer,
		Delay: time.Minute, Reason: gate.DeferOpen.String()}}
	var g gatedEndpoints
	g.note(now, []*delivery.Delivery{behind(ep("", "h1")), behind(ep("url", "h1")), behind(ep("k2", "h2")),
		behind(ep("k3", "h3")), behind(ep("k4", "h4")), open})
	hashes, seq := g.behindProbe(now, nil)
	slices.Sort(hashes)
	if want := []string{"h1", "h2", "h3", "h4"}; !slices.Equal(hashes, want) {
		t.Fatalf("behind probes: %v, want %v (an open circuit is not behind a probe)", hashes, want)
	}
	g.note(now, []*delivery.Delivery{behind(ep("k5", "h4"))}) // after the read
	g.learn(now, seq, []gate.Snapshot{
		{Hash: "h1", State: gate.Closed},
		{Hash: "h2", State: gate.Open, OpenFor: 5 * time.Second},
		{Hash: "h3", State: gate.HalfOpen, ProbeHeld: true},
		{Hash: "h4", State: gate.HalfOpen},
	})
	skipped := func(at time.Time) []string {
		s, _ := g.skip(at, nil, claim.Skip{})
		slices.Sort(s.Endpoints)
		return s.Endpoints
	}
	if got, want := skipped(now), []string{"k2", "k3", "k5", "open"}; !slices.Equal(got, want) {
		t.Fatalf("skipped after the read: %v, want %v (both keys of the closed breaker and the given-back probe's released)", got, want)
	}
	if got, want := skipped(now.Add(6*time.Second)), []string{"k3", "k5", "open"}; !slices.Equal(got, want) {
		t.Fatalf("skipped after the reset: %v, want %v (the re-opened breaker's hold ends with its reset)", got, want)
	}
	if hashes, _ := g.behindProbe(now.Add(6*time.Second), hashes); !slices.Equal(sorted(hashes), []string{"h3", "h4"}) {
		t.Fatalf("behind probes after the read: %v, want h3 (in flight) and h4 (noted after the read)", hashes)
	}
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}
