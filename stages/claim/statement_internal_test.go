package claim

import (
	"strings"
	"testing"
)

// TestUnorderedStatementHasNoHeadCheck: while nothing is ordered the claim runs without the
// head check's correlated subquery (its presence alone slowed the plan hundreds of times over a
// large backlog), and with ordering it runs with it.
func TestUnorderedStatementHasNoHeadCheck(t *testing.T) {
	c := &Claimer{}
	if s := c.statement(); strings.Contains(s, "NOT EXISTS") || strings.Contains(s, "ordering:begin") {
		t.Error("the claim without ordering still holds the head check")
	}
	c.SetOrdering(Ordering{Active: true})
	if s := c.statement(); !strings.Contains(s, "NOT EXISTS") {
		t.Error("the claim with ordering lacks the head check")
	}
	c.SetOrdering(Ordering{})
	if c.statement() != claimUnorderedSQL {
		t.Error("turning ordering off did not bring back the claim without the head check")
	}
}
