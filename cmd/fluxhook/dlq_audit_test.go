package main

import (
	"testing"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestDLQReplayAndPurgeAreAudited: issue 34 promises that every change made through the API
// *or the CLI* is in webhook_audit. `fluxhook dlq replay` and `fluxhook dlq purge` each record
// one entry per dead letter, by the CLI's user, under the dead letter's canonical id, as the
// API's replay does.
func TestDLQReplayAndPurgeAreAudited(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	f := insertDLQFixtures(t, db)
	if r := runCLI(t, db.URL, "dlq", "replay", itoa(f.notFound)); r.code != 0 {
		t.Fatalf("dlq replay exited %d: %s", r.code, r.stderr)
	}
	if r := runCLI(t, db.URL, "dlq", "purge", itoa(f.badEndpoint)); r.code != 0 {
		t.Fatalf("dlq purge exited %d: %s", r.code, r.stderr)
	}
	got := queryStrings(t, db, `SELECT action || ' ' || object_type || ' ' || object_id || ' ' || (actor LIKE 'cli%')::text
		FROM webhook_audit ORDER BY id`)
	want := []string{"dead_letter.replay dead_letter " + itoa(f.notFound) + " true", "dead_letter.purge dead_letter " + itoa(f.badEndpoint) + " true"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("audit trail = %q; want %q", got, want)
	}
}
