package endpoints

import (
	"strings"
	"testing"
)

// TestDeadLetterStatements checks the expansion of dead_letter.sql into the two statements
// that share it: nothing of the template is left, and each writes its own reason, in the
// delivery log and in the dead letter, as the Go side names it. What the statements do with
// the rows is TestUpdateTenantDeadLettersPending's, TestRemove's and TestRemoveStoppedStream's.
func TestDeadLetterStatements(t *testing.T) {
	for _, c := range []struct{ name, sql, reason string }{
		{"update.sql", updateSQL, TenantChangedReason},
		{"remove.sql", removeSQL, "endpoint removed"},
	} {
		if strings.Contains(c.sql, "{{") || strings.Contains(c.sql, "}}") {
			t.Errorf("%s keeps template text:\n%s", c.name, c.sql)
		}
		if n := strings.Count(code(c.sql), sqlLiteral(c.reason)); n != 2 {
			t.Errorf("%s writes %s %d times, want 2 (log and dead letter)", c.name, sqlLiteral(c.reason), n)
		}
		if n := strings.Count(code(c.sql), "created_at = 'infinity' AS parked"); n != 1 {
			t.Errorf("%s returns parked %d times, want 1", c.name, n)
		}
	}
	if got := sqlLiteral("it's"); got != "'it''s'" {
		t.Errorf("sqlLiteral(%q) = %s", "it's", got)
	}
}

// code is the statement without its comment lines.
func code(sql string) string {
	var b strings.Builder
	for line := range strings.Lines(sql) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
		}
	}
	return b.String()
}
