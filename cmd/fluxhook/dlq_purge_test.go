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

// TestDLQPurgeReplayedOnly: --replayed-only is a filter of its own. Purging every dead letter
// that was already replayed is the routine clean-up, and was refused as "no filter".
func TestDLQPurgeReplayedOnly(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	f := insertDLQFixtures(t, db)
	fo := insertFanOut(t, db)
	replayed := joinIDs([]int64{f.badEndpoint, fo.aFirst})

	r := runCLI(t, db.URL, "dlq", "purge", "--all-matching", "--replayed-only", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "would purge 2 dead letter(s): "+replayed+"\n") {
		t.Fatalf("purge --all-matching --replayed-only --dry-run: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 8 {
		t.Fatalf("a dry run left %d of 8 dead letters", n)
	}
	r = runCLI(t, db.URL, "dlq", "purge", "--all-matching", "--replayed-only")
	if r.code != 0 || !strings.Contains(r.stdout, "purged 2 dead letter(s): "+replayed+"\n") {
		t.Fatalf("purge --all-matching --replayed-only: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE replayed_at IS NOT NULL`); n != 0 {
		t.Errorf("%d replayed dead letters left", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 6 {
		t.Errorf("%d dead letters left, want the 6 never replayed", n)
	}
	// Still refused without it: purging everything at once is never what was meant.
	if r := runCLI(t, db.URL, "dlq", "purge", "--all-matching", "--dry-run"); r.code != 2 || !strings.Contains(r.stderr, "--replayed-only") {
		t.Errorf("unfiltered purge: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestDLQPurgeByDeliveryID: a delivery id purges all of its event's dead letters (every
// endpoint, every failure), and says which rows those were.
func TestDLQPurgeByDeliveryID(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	fo := insertFanOut(t, db)
	all := joinIDs([]int64{fo.aFirst, fo.b, fo.aAgain})

	r := runCLI(t, db.URL, "dlq", "purge", "--dry-run", fo.delivery)
	if r.code != 0 || r.stdout != "delivery id "+fo.delivery+": 3 dead letters ("+all+")\nwould purge 3 dead letter(s): "+all+"\n" {
		t.Fatalf("purge --dry-run DELIVERY-ID: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 4 {
		t.Fatalf("a dry run left %d of 4 dead letters", n)
	}
	r = runCLI(t, db.URL, "dlq", "purge", "--replayed-only", strings.ToUpper(fo.delivery))
	if r.code != 0 || !strings.Contains(r.stdout, "purged 1 dead letter(s): "+itoa(fo.aFirst)+"\n") {
		t.Fatalf("purge --replayed-only DELIVERY-ID: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, db.URL, "dlq", "purge", fo.delivery)
	if rest := joinIDs([]int64{fo.b, fo.aAgain}); r.code != 0 || !strings.Contains(r.stdout, "purged 2 dead letter(s): "+rest+"\n") {
		t.Fatalf("purge DELIVERY-ID: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1::uuid`, fo.delivery); n != 0 {
		t.Errorf("%d dead letters of the purged delivery left", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE id = $1`, fo.other); n != 1 {
		t.Error("another delivery's dead letter was purged")
	}
	// A delivery id that stands for nothing (any more) purged nothing: a failure, said so.
	r = runCLI(t, db.URL, "dlq", "purge", fo.delivery)
	if r.code != 1 || !strings.Contains(r.stderr, "no dead letter with delivery id "+fo.delivery+"; nothing purged; list them with fluxhook dlq list") {
		t.Errorf("purge of a delivery id without dead letters: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestDLQPurgeThatPurgesNothingFails: a purge that deletes nothing did nothing it was asked
// to, and exits 1 saying why: an unknown id (and then none of the others is purged either, as
// with replay), a filter matching nothing, --replayed-only on rows not replayed. A dry run that
// would purge nothing by a filter has reported what it was asked to, and exits 0.
func TestDLQPurgeThatPurgesNothingFails(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	f := insertDLQFixtures(t, db)
	total := count(t, db, `SELECT count(*) FROM webhook_dead_letter`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"9999"}, "no dead letter with id 9999; nothing purged; list them with fluxhook dlq list"},
		{[]string{"--dry-run", "9999"}, "no dead letter with id 9999; nothing purged"},
		{[]string{itoa(f.notFound), "9998", "9999"}, "no dead letter with id 9998, 9999; nothing purged"},
		{[]string{"--all-matching", "--event-type", "no.such"}, "nothing purged: no dead letter matches the filters"},
		{[]string{"--all-matching", "--event-type", "order.created", "--replayed-only"}, "no dead letter matching the filters was replayed yet"},
		{[]string{"--replayed-only", itoa(f.notFound)}, "none of the dead letters selected was replayed yet"},
	} {
		r := runCLI(t, db.URL, append([]string{"dlq", "purge"}, tc.args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("purge %v: exit %d, stderr %q, want 1 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != total {
		t.Errorf("%d dead letters left of %d: a purge that failed deleted some", n, total)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_audit`); n != 0 {
		t.Errorf("%d audit records of purges that failed", n)
	}
	r := runCLI(t, db.URL, "dlq", "purge", "--dry-run", "--all-matching", "--event-type", "no.such")
	if r.code != 0 || !strings.Contains(r.stdout, "would purge 0") {
		t.Errorf("dry run matching nothing: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestDLQBulkPurgeByDeliveryAndEndpoint(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	fo := insertFanOut(t, db)

	r := runCLI(t, db.URL, "dlq", "purge", "--all-matching", "--delivery-id", fo.delivery, "--endpoint-id", fo.endpointA)
	if want := joinIDs([]int64{fo.aFirst, fo.aAgain}); r.code != 0 || !strings.Contains(r.stdout, "purged 2 dead letter(s): "+want+"\n") {
		t.Fatalf("purge by delivery and endpoint: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, db.URL, "dlq", "purge", "--all-matching", "--endpoint-id", fo.endpointA)
	if r.code != 0 || !strings.Contains(r.stdout, "purged 1 dead letter(s): "+itoa(fo.other)+"\n") {
		t.Fatalf("purge by endpoint: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 1 {
		t.Errorf("%d dead letters left, want endpoint B's", n)
	}
}
