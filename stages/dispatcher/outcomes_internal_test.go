package dispatcher

import (
	"slices"
	"testing"
)

// TestOutcomeRecorderMerges: outcomes waiting for the recorder merge by endpoint, a newer
// batch's result replacing an older one (an endpoint that failed, then succeeded, is healthy),
// except a 410, which stays; take returns them in the order they first came and empties them.
func TestOutcomeRecorderMerges(t *testing.T) {
	t.Parallel()
	r := newOutcomeRecorder()
	r.add([]string{"a", "b"}, []int16{2, 3})
	r.add([]string{"b", "a", "c"}, []int16{1, 1, 2})
	ids, results := r.take()
	if !slices.Equal(ids, []string{"a", "b", "c"}) || !slices.Equal(results, []int16{1, 3, 2}) {
		t.Errorf("take = %v %v; want [a b c] [1 3 2]", ids, results)
	}
	if ids, _ := r.take(); len(ids) != 0 {
		t.Errorf("a second take = %v; want nothing", ids)
	}
}
