package endpoints_test

import (
	"testing"

	"github.com/fluxora/fluxhook/sql/endpoints"
)

// TestMatches pins the filter rule. A "prefix.*" pattern matches types that start with the
// prefix and its dot: "stream.*" matches "stream.created" and "stream.a.b", but not "stream"
// itself (a pattern names a family below a prefix, not the prefix), nor "streams.x" or
// "streamx.y" (the dot keeps one family from swallowing another that shares its first letters).
func TestMatches(t *testing.T) {
	t.Parallel()
	cases := []struct {
		filter    []string
		eventType string
		want      bool
	}{
		{nil, "anything", true},
		{[]string{}, "order.created", true},
		{[]string{"order.created"}, "order.created", true},
		{[]string{"order.created"}, "order.created.v2", false},
		{[]string{"order.created"}, "Order.Created", false}, // exact means exact, case included
		{[]string{"order.created"}, "order", false},
		{[]string{"stream.*"}, "stream.created", true},
		{[]string{"stream.*"}, "stream.a.b", true},
		{[]string{"stream.*"}, "stream", false},
		{[]string{"stream.*"}, "streams.x", false},
		{[]string{"stream.*"}, "streamx.y", false},
		{[]string{"stream.*"}, "other.stream.created", false},
		{[]string{"a.b.*"}, "a.b.c", true},
		{[]string{"a.b.*"}, "a.bc", false},
		{[]string{"user.deleted", "stream.*"}, "user.deleted", true},
		{[]string{"user.deleted", "stream.*"}, "stream.ended", true},
		{[]string{"user.deleted", "stream.*"}, "user.created", false},
		// An empty entry is a NULL SQL wrote into the filter: it matches nothing, as in route.sql.
		{[]string{""}, "", false},
		{[]string{"", "a.b"}, "a.b", true},
	}
	for _, tc := range cases {
		if got := endpoints.Matches(tc.filter, tc.eventType); got != tc.want {
			t.Errorf("Matches(%q, %q) = %v, want %v", tc.filter, tc.eventType, got, tc.want)
		}
	}
}

func TestValidateFilter(t *testing.T) {
	t.Parallel()
	for _, ok := range [][]string{nil, {"order.created"}, {"stream.*", "a.b.*", "x"}} {
		if err := endpoints.ValidateFilter(ok); err != nil {
			t.Errorf("ValidateFilter(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range [][]string{{""}, {" a"}, {"*"}, {".*"}, {"a*"}, {"a.*.b"}, {"a.**"}, {"*.created"}} {
		if err := endpoints.ValidateFilter(bad); err == nil {
			t.Errorf("ValidateFilter(%q) = nil, want an error", bad)
		}
	}
}
