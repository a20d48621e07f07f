package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

func TestDLQPurge(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	f := insertDLQFixtures(t, db)
	replayed := insertDeadLetter(t, db, deadLetterFixture{eventType: "order.created", reason: "permanent: HTTP 410",
		failedAgo: time.Minute, replayed: true})
	total := count(t, db, `SELECT count(*) FROM webhook_dead_letter`)

	// Bulk purge without a filter is refused and changes nothing.
	if r := runCLI(t, db.URL, "dlq", "purge", "--all-matching"); r.code != 2 || !strings.Contains(r.stderr, "at least one of") {
		t.Fatalf("unfiltered purge: code %d, stderr %q", r.code, r.stderr)
	}
	if r := runCLI(t, db.URL, "dlq", "purge"); r.code != 2 {
		t.Fatalf("purge with nothing selected: code %d", r.code)
	}
	// A dry run reports and keeps everything.
	if r := runCLI(t, db.URL, "dlq", "purge", "--dry-run", "--all-matching", "--event-type", "order.created"); r.code != 0 || !strings.Contains(r.stdout, "would purge 3") {
		t.Fatalf("dry run: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != total {
		t.Fatalf("dry run deleted rows: %d left of %d", n, total)
	}
	// Only the replayed ones of a filter.
	if r := runCLI(t, db.URL, "dlq", "purge", "--all-matching", "--event-type", "order.created", "--replayed-only"); r.code != 0 || !strings.Contains(r.stdout, "purged 1") {
		t.Fatalf("replayed-only purge: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE id = $1`, replayed); n != 0 {
		t.Fatal("the replayed dead letter is still there")
	}
	// By id.
	if r := runCLI(t, db.URL, "dlq", "purge", "--dry-run=false", itoa(f.notFound)); r.code != 0 || !strings.Contains(r.stdout, "purged 1") {
		t.Fatalf("purge by id: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != total-2 {
		t.Fatalf("%d dead letters left, want %d", n, total-2)
	}
}
