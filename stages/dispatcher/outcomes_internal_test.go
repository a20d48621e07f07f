package dispatcher

import (
	"slices"
	"testing"
)

// TestOutcomeRecorderMerges: outcomes waiting for the recorder merge by endpoint, a newer
// batch's result replacing an older one (an endpoint that failed, then succeeded, is healthy),
// except a 410, which stays; take returns them in the order of their ids and empties them.
func TestOutcomeRecorderMerges(t *testing.T) {
	t.Parallel()
	r := newOutcomeRecorder()
	r.add(outcomesOf("a", 2, "b", 3))
	r.add(outcomesOf("b", 1, "a", 1, "c", 2))
	if got, want := r.take(), outcomesOf("a", 1, "b", 3, "c", 2); !slices.Equal(got, want) {
		t.Errorf("take = %v; want %v", got, want)
	}
	if outs := r.take(); len(outs) != 0 {
		t.Errorf("a second take = %v; want nothing", outs)
	}
}

// outcomesOf builds endpoint outcomes from pairs of endpoint id and result, each to URL
// "https://hooks.example.com/<id>" without a tenant.
func outcomesOf(pairs ...any) []endpointOutcome {
	var out []endpointOutcome
	for i := 0; i < len(pairs); i += 2 {
		id := pairs[i].(string)
		out = append(out, endpointOutcome{id: id, result: int16(pairs[i+1].(int)), url: "https://hooks.example.com/" + id})
	}
	return out
}
