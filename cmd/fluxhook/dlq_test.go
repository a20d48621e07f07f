package main

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// deadLetterFixture is the part of a dead letter a test chooses; the rest is filled in.
type deadLetterFixture struct {
	eventType string
	reason    string
	payload   string
	endpoint  *string
	streamID  *string
	failedAgo time.Duration
	replayed  bool
}

func insertDeadLetter(t *testing.T, db *sqltest.DB, f deadLetterFixture) int64 {
	t.Helper()
	if f.payload == "" {
		f.payload = `{}`
	}
	var id int64
	err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO webhook_dead_letter
		    (outbox_id, delivery_id, stream_id, event_type, payload, endpoint_url, attempts, last_status,
		     last_error, reason, enqueued_at, failed_at, replayed_at)
		VALUES (42, gen_random_uuid(), $1, $2, $3, $4, 9, 503, 'consumer down', $5,
		        now() - $6::bigint * interval '1 microsecond' - interval '1 day',
		        now() - $6::bigint * interval '1 microsecond',
		        CASE WHEN $7 THEN now() - interval '1 minute' END)
		RETURNING id`,
		f.streamID, f.eventType, f.payload, f.endpoint, f.reason, f.failedAgo.Microseconds(), f.replayed).Scan(&id)
	if err != nil {
		t.Fatalf("inserting dead letter: %v", err)
	}
	return id
}

func ptr[T any](v T) *T { return &v }

// dlqFixtures are four dead letters that the filters tell apart.
type dlqFixtures struct{ notFound, exhausted, badEndpoint, old int64 }

func insertDLQFixtures(t *testing.T, db *sqltest.DB) dlqFixtures {
	return dlqFixtures{
		notFound: insertDeadLetter(t, db, deadLetterFixture{eventType: "order.created", reason: "permanent: HTTP 404",
			payload: `{"order": 1, "note": "<b>&</b>"}`, streamID: ptr("orders"), failedAgo: time.Hour}),
		exhausted: insertDeadLetter(t, db, deadLetterFixture{eventType: "order.created", reason: "attempts exhausted",
			failedAgo: 3 * 24 * time.Hour}),
		badEndpoint: insertDeadLetter(t, db, deadLetterFixture{eventType: "user.deleted", reason: "invalid endpoint_url: credentials",
			endpoint: ptr("https://bot:hunter2@consumer.example/hook"), failedAgo: 10 * time.Minute, replayed: true}),
		old: insertDeadLetter(t, db, deadLetterFixture{eventType: "user.deleted", reason: "permanent: HTTP 410",
			failedAgo: 30 * 24 * time.Hour}),
	}
}

func listIDs(t *testing.T, db *sqltest.DB, args ...string) []int64 {
	t.Helper()
	r := runCLI(t, db.URL, append([]string{"dlq", "list", "--json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("dlq list %v exited %d: %s", args, r.code, r.stderr)
	}
	var list []deadLetter
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("dlq list --json printed %q: %v", r.stdout, err)
	}
	ids := []int64{}
	for _, d := range list {
		ids = append(ids, d.ID)
	}
	return ids
}

func TestDLQListFilters(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	f := insertDLQFixtures(t, db)

	cases := []struct {
		args []string
		want []int64
	}{
		{nil, []int64{f.badEndpoint, f.notFound, f.exhausted, f.old}}, // newest first
		{[]string{"--event-type", "order.created"}, []int64{f.notFound, f.exhausted}},
		{[]string{"--reason-contains", "http 4"}, []int64{f.notFound, f.old}}, // case-insensitive
		{[]string{"--reason-contains", "%"}, []int64{}},                       // literal, not a LIKE pattern
		{[]string{"--since", "2h"}, []int64{f.badEndpoint, f.notFound}},
		{[]string{"--since", "7d"}, []int64{f.badEndpoint, f.notFound, f.exhausted}},
		{[]string{"--since", "7d", "--event-type", "user.deleted"}, []int64{f.badEndpoint}},
		{[]string{"--limit", "2"}, []int64{f.badEndpoint, f.notFound}},
	}
	for _, tc := range cases {
		got := listIDs(t, db, tc.args...)
		if !slices.Equal(got, tc.want) {
			t.Errorf("dlq list %v = %v, want %v", tc.args, got, tc.want)
		}
	}

	for _, bad := range [][]string{{"--limit", "0"}, {"--since", "soon"}, {"--since", "-1h"}, {"extra"}} {
		if r := runCLI(t, db.URL, append([]string{"dlq", "list"}, bad...)...); r.code != 2 {
			t.Errorf("dlq list %v exited %d, want 2", bad, r.code)
		}
	}
}

func TestDLQListOutput(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	insertDLQFixtures(t, db)

	r := runCLI(t, db.URL, "dlq", "list", "--json")
	if strings.Contains(r.stdout, "hunter2") || !strings.Contains(r.stdout, `"endpoint_url": "https://bot:xxxxx@consumer.example/hook"`) {
		t.Errorf("dlq list --json must show endpoint_url with the password redacted:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, `"payload"`) {
		t.Errorf("dlq list --json includes payloads; they belong to dlq show")
	}

	r = runCLI(t, db.URL, "dlq", "list")
	if r.code != 0 {
		t.Fatalf("dlq list exited %d: %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "REASON") {
		t.Fatalf("dlq list printed:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "invalid endpoint_url: credentials") || !strings.Contains(r.stdout, "attempts exhausted") {
		t.Errorf("dlq list lacks reasons:\n%s", r.stdout)
	}

	r = runCLI(t, db.URL, "dlq", "list", "--limit", "1")
	if !strings.Contains(r.stderr, "raise --limit") {
		t.Errorf("a full page does not say there may be more: stderr %q", r.stderr)
	}
	r = runCLI(t, db.URL, "dlq", "list", "--event-type", "nothing")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "no dead letters match" {
		t.Errorf("empty dlq list: exit %d, %q", r.code, r.stdout)
	}
}

func TestDLQShow(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	f := insertDLQFixtures(t, db)

	r := runCLI(t, db.URL, "dlq", "show", itoa(f.notFound))
	if r.code != 0 {
		t.Fatalf("dlq show exited %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"event_type    order.created", "stream_id     orders", "reason        permanent: HTTP 404",
		"last_status   503", "last_error    consumer down", "endpoint_url  - (the configured WEBHOOK_URL)",
		"payload:\n{\n  \"note\": \"<b>&</b>\",\n  \"order\": 1\n}\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dlq show lacks %q:\n%s", want, r.stdout)
		}
	}

	r = runCLI(t, db.URL, "dlq", "show", "--json", itoa(f.badEndpoint))
	var d deadLetter
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
		t.Fatalf("dlq show --json printed %q: %v", r.stdout, err)
	}
	if d.ID != f.badEndpoint || d.EndpointURL == nil || *d.EndpointURL != "https://bot:xxxxx@consumer.example/hook" ||
		d.ReplayedAt == nil || string(d.Payload) != "{}" || d.OutboxID == nil || *d.OutboxID != 42 {
		t.Errorf("dlq show --json = %+v", d)
	}
	r = runCLI(t, db.URL, "dlq", "show", itoa(f.badEndpoint))
	if strings.Contains(r.stdout, "hunter2") || !strings.Contains(r.stdout, "https://bot:xxxxx@consumer.example/hook") {
		t.Errorf("dlq show must redact the endpoint's password:\n%s", r.stdout)
	}

	if r := runCLI(t, db.URL, "dlq", "show", "9999"); r.code != 1 || !strings.Contains(r.stderr, "dead letter 9999 not found") {
		t.Errorf("dlq show of a missing id: exit %d, %q", r.code, r.stderr)
	}
	for _, bad := range [][]string{{}, {"x"}, {"1", "2"}, {"-5"}} {
		if r := runCLI(t, db.URL, append([]string{"dlq", "show"}, bad...)...); r.code != 2 {
			t.Errorf("dlq show %v exited %d, want 2", bad, r.code)
		}
	}
}

// outboxCopy is a replayed event as it stands in the outbox, next to its dead letter.
type outboxCopy struct {
	sameEvent  bool // delivery_id, stream_id, event_type, payload, endpoint_url and enqueued_at match
	attempt    int
	dueNow     bool
	processed  bool
	replayedAt *time.Time
}

func replayedCopies(t *testing.T, db *sqltest.DB, deadLetterID int64) []outboxCopy {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		SELECT o.delivery_id = d.delivery_id AND o.stream_id IS NOT DISTINCT FROM d.stream_id
		       AND o.event_type = d.event_type AND o.payload = d.payload
		       AND o.endpoint_url IS NOT DISTINCT FROM d.endpoint_url AND o.enqueued_at = d.enqueued_at,
		       o.attempt, o.created_at BETWEEN now() - interval '1 minute' AND now(), o.processed, d.replayed_at
		FROM webhook_dead_letter d JOIN webhook_outbox o ON o.delivery_id = d.delivery_id
		WHERE d.id = $1 ORDER BY o.id`, deadLetterID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []outboxCopy
	for rows.Next() {
		var c outboxCopy
		if err := rows.Scan(&c.sameEvent, &c.attempt, &c.dueNow, &c.processed, &c.replayedAt); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func replayedAt(t *testing.T, db *sqltest.DB, id int64) *time.Time {
	t.Helper()
	var at *time.Time
	if err := db.Pool.QueryRow(context.Background(), "SELECT replayed_at FROM webhook_dead_letter WHERE id = $1", id).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

func TestDLQReplayByID(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	f := insertDLQFixtures(t, db)

	r := runCLI(t, db.URL, "dlq", "replay", itoa(f.notFound), itoa(f.badEndpoint))
	if r.code != 0 {
		t.Fatalf("dlq replay exited %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "replayed  "+itoa(f.notFound)) || !strings.Contains(r.stdout, "skipped   "+itoa(f.badEndpoint)) ||
		!strings.Contains(r.stdout, "replayed 1, skipped 1 already replayed") {
		t.Errorf("dlq replay printed:\n%s", r.stdout)
	}
	copies := replayedCopies(t, db, f.notFound)
	if len(copies) != 1 {
		t.Fatalf("replay wrote %d outbox rows for the event, want 1", len(copies))
	}
	if c := copies[0]; !c.sameEvent || c.attempt != 1 || !c.dueNow || c.processed || c.replayedAt == nil {
		t.Errorf("replayed row = %+v, want the same event as a first attempt due now, and replayed_at set", c)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_outbox"); n != 1 {
		t.Errorf("the outbox holds %d rows; the already replayed dead letter must have been skipped", n)
	}

	// Again: now it is skipped too, and nothing changes.
	before := replayedAt(t, db, f.notFound)
	r = runCLI(t, db.URL, "dlq", "replay", itoa(f.notFound))
	if r.code != 0 || !strings.Contains(r.stdout, "already replayed") || !strings.Contains(r.stdout, "replayed 0, skipped 1") {
		t.Errorf("second replay: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_outbox"); n != 1 {
		t.Errorf("a skipped replay wrote a row: outbox holds %d", n)
	}
	if after := replayedAt(t, db, f.notFound); !after.Equal(*before) {
		t.Errorf("a skipped replay moved replayed_at from %v to %v", before, after)
	}

	// --force replays it once more, with the same delivery id.
	r = runCLI(t, db.URL, "dlq", "replay", itoa(f.notFound), "--force")
	if r.code != 0 {
		t.Fatalf("replay --force exited %d: %s", r.code, r.stderr)
	}
	copies = replayedCopies(t, db, f.notFound)
	if len(copies) != 2 || !copies[1].sameEvent || copies[1].attempt != 1 {
		t.Errorf("after --force: %+v, want two first-attempt copies of the same event", copies)
	}
}

func TestDLQReplayOfAMissingIDChangesNothing(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	f := insertDLQFixtures(t, db)

	r := runCLI(t, db.URL, "dlq", "replay", itoa(f.notFound), "9999")
	if r.code != 1 || !strings.Contains(r.stderr, "dead letter 9999 not found; nothing replayed") {
		t.Errorf("replay with a missing id: exit %d, stderr %q", r.code, r.stderr)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_outbox"); n != 0 {
		t.Errorf("outbox holds %d rows", n)
	}
	if at := replayedAt(t, db, f.notFound); at != nil {
		t.Errorf("replayed_at set to %v by a failed replay", at)
	}
}

func TestDLQBulkReplayRequiresAFilter(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	insertDLQFixtures(t, db)

	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--all-matching"}, "--all-matching needs at least one of"},
		{[]string{"--all-matching", "--force"}, "--all-matching needs at least one of"},
		{[]string{"--all-matching", "--event-type", "", "--reason-contains", ""}, "--all-matching needs at least one of"},
		{[]string{"--event-type", "order.created"}, "only with --all-matching"},
		{[]string{"--all-matching", "--event-type", "order.created", "1"}, "not both"},
		{nil, "needs dead-letter ids"},
		{[]string{"abc"}, `"abc" is not a dead-letter id`},
	}
	for _, tc := range cases {
		r := runCLI(t, db.URL, append([]string{"dlq", "replay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("dlq replay %q: exit %d, stderr %q; want 2 mentioning %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_outbox"); n != 0 {
		t.Errorf("refused replays wrote %d outbox rows", n)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_dead_letter WHERE replayed_at IS NOT NULL"); n != 1 {
		t.Errorf("refused replays changed replayed_at: %d rows replayed, want the fixture's 1", n)
	}
}

func TestDLQBulkReplay(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	f := insertDLQFixtures(t, db)

	r := runCLI(t, db.URL, "dlq", "replay", "--all-matching", "--event-type", "user.deleted", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "would replay 1, skipped 1 already replayed (dry run: nothing changed)") {
		t.Errorf("dry run: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_outbox"); n != 0 {
		t.Fatalf("a dry run wrote %d outbox rows", n)
	}

	r = runCLI(t, db.URL, "dlq", "replay", "--all-matching", "--reason-contains", "permanent")
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 2") {
		t.Fatalf("bulk replay: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, id := range []int64{f.notFound, f.old} {
		if c := replayedCopies(t, db, id); len(c) != 1 || !c[0].sameEvent || c[0].attempt != 1 || c[0].replayedAt == nil {
			t.Errorf("dead letter %d after bulk replay: %+v", id, c)
		}
	}
	if at := replayedAt(t, db, f.exhausted); at != nil {
		t.Errorf("a dead letter outside the filter was replayed at %v", at)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_outbox"); n != 2 {
		t.Errorf("outbox holds %d rows, want 2", n)
	}

	r = runCLI(t, db.URL, "dlq", "replay", "--all-matching", "--since", "1s")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "no dead letters match" {
		t.Errorf("bulk replay matching nothing: exit %d, %q", r.code, r.stdout)
	}
}

// TestDLQConcurrentReplaysReplayOnce checks the row locks: operators racing to replay the
// same dead letter produce one outbox row, not one each.
func TestDLQConcurrentReplaysReplayOnce(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	id := insertDeadLetter(t, db, deadLetterFixture{eventType: "e", reason: "r"})

	var wg sync.WaitGroup
	codes := make([]int, 5)
	for i := range codes {
		wg.Go(func() { codes[i] = runCLI(t, db.URL, "dlq", "replay", itoa(id)).code })
	}
	wg.Wait()
	for i, c := range codes {
		if c != 0 {
			t.Errorf("replay %d exited %d", i, c)
		}
	}
	if c := replayedCopies(t, db, id); len(c) != 1 {
		t.Errorf("concurrent replays wrote %d outbox rows, want 1", len(c))
	}
}

func TestDLQUsage(t *testing.T) {
	t.Parallel()
	if r := runCLI(t, "", "dlq"); r.code != 2 || !strings.Contains(r.stderr, "fluxhook dlq replay --all-matching") {
		t.Errorf("dlq without a subcommand: exit %d, %q", r.code, r.stderr)
	}
	if r := runCLI(t, "", "dlq", "bogus"); r.code != 2 || !strings.Contains(r.stderr, `unknown dlq subcommand "bogus"`) {
		t.Errorf("dlq bogus: exit %d, %q", r.code, r.stderr)
	}
	if r := runCLI(t, "", "dlq", "help"); r.code != 0 || !strings.Contains(r.stdout, "fluxhook dlq show ID") {
		t.Errorf("dlq help: exit %d, %q", r.code, r.stdout)
	}
}

func itoa(id int64) string { return strconv.FormatInt(id, 10) }
