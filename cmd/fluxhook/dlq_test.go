package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
	// deliveryID and endpointID, when set, make several rows one event's dead letters (one
	// per endpoint, or one per time it failed again after a replay); else each row gets a
	// delivery id of its own and no endpoint.
	deliveryID *string
	endpointID *string
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
		     last_error, reason, enqueued_at, failed_at, replayed_at, endpoint_id)
		VALUES (42, coalesce($8::uuid, gen_random_uuid()), $1, $2, $3, $4, 9, 503, 'consumer down', $5,
		        now() - $6::bigint * interval '1 microsecond' - interval '1 day',
		        now() - $6::bigint * interval '1 microsecond',
		        CASE WHEN $7 THEN now() - interval '1 minute' END, $9::uuid)
		RETURNING id`,
		f.streamID, f.eventType, f.payload, f.endpoint, f.reason, f.failedAgo.Microseconds(), f.replayed,
		f.deliveryID, f.endpointID).Scan(&id)
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
	// The consumer's last answer (schema 15), a line break in it.
	if _, err := db.Pool.Exec(context.Background(), `UPDATE webhook_dead_letter SET last_response_excerpt = $2 WHERE id = $1`,
		f.notFound, "{\"error\":\"no such order\"}\n"); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, db.URL, "dlq", "show", itoa(f.notFound))
	if r.code != 0 {
		t.Fatalf("dlq show exited %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"event_type    order.created", "stream_id     orders", "reason        permanent: HTTP 404",
		"last_status   503", "last_error    consumer down", "endpoint_url  - (the configured WEBHOOK_URL)",
		`last_answer   {"error":"no such order"}\x0a`,
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
		d.ReplayedAt == nil || string(d.Payload) != "{}" || d.OutboxID == nil || *d.OutboxID != 42 || d.LastResponseExcerpt != nil {
		t.Errorf("dlq show --json = %+v", d)
	}
	r = runCLI(t, db.URL, "dlq", "show", "--json", itoa(f.notFound))
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || d.LastResponseExcerpt == nil ||
		*d.LastResponseExcerpt != "{\"error\":\"no such order\"}\n" {
		t.Errorf("dlq show --json = %+v, %v; want the last answer", d, err)
	}
	r = runCLI(t, db.URL, "dlq", "show", itoa(f.badEndpoint))
	if !strings.Contains(r.stdout, "last_answer   - (none kept)") {
		t.Errorf("dlq show of a dead letter without an answer:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, "hunter2") || !strings.Contains(r.stdout, "https://bot:xxxxx@consumer.example/hook") {
		t.Errorf("dlq show must redact the endpoint's password:\n%s", r.stdout)
	}

	if r := runCLI(t, db.URL, "dlq", "show", "9999"); r.code != 1 || !strings.Contains(r.stderr, "no dead letter with id 9999; list them with fluxhook dlq list") {
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
		FROM webhook_dead_letter d JOIN webhook_deliveries o ON o.delivery_id = d.delivery_id
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
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != 1 {
		t.Errorf("the outbox holds %d rows; the already replayed dead letter must have been skipped", n)
	}

	// Again: now it is skipped too, and nothing changes.
	before := replayedAt(t, db, f.notFound)
	r = runCLI(t, db.URL, "dlq", "replay", itoa(f.notFound))
	if r.code != 1 || !strings.Contains(r.stdout, "already replayed") || !strings.Contains(r.stdout, "replayed 0, skipped 1") ||
		!strings.Contains(r.stderr, "nothing replayed") {
		t.Errorf("second replay: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != 1 {
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
	if r.code != 1 || !strings.Contains(r.stderr, "no dead letter with id 9999; nothing replayed; list them with fluxhook dlq list") {
		t.Errorf("replay with a missing id: exit %d, stderr %q", r.code, r.stderr)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != 0 {
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
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != 0 {
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
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != 0 {
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
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != 2 {
		t.Errorf("outbox holds %d rows, want 2", n)
	}

	// Matching nothing replays nothing: a failure, said so; a dry run reports it.
	r = runCLI(t, db.URL, "dlq", "replay", "--all-matching", "--since", "1s")
	if r.code != 1 || !strings.Contains(r.stderr, "nothing replayed: no dead letter matches the filters") {
		t.Errorf("bulk replay matching nothing: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, db.URL, "dlq", "replay", "--all-matching", "--since", "1s", "--dry-run")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "no dead letters match" {
		t.Errorf("bulk replay --dry-run matching nothing: exit %d, %q", r.code, r.stdout)
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
	// One replays it (exit 0); the others find it replayed and did nothing (exit 1).
	zero := 0
	for i, c := range codes {
		switch c {
		case 0:
			zero++
		case 1:
		default:
			t.Errorf("replay %d exited %d", i, c)
		}
	}
	if zero != 1 {
		t.Errorf("%d replays exited 0, want exactly the one that replayed", zero)
	}
	if c := replayedCopies(t, db, id); len(c) != 1 {
		t.Errorf("concurrent replays wrote %d outbox rows, want 1", len(c))
	}
}

func TestDLQUsage(t *testing.T) {
	t.Parallel()
	if r := runCLI(t, "", "dlq"); r.code != 2 || !strings.Contains(r.stderr, "usage: fluxhook dlq list|show|replay|purge ") {
		t.Errorf("dlq without a subcommand: exit %d, %q", r.code, r.stderr)
	}
	if r := runCLI(t, "", "dlq", "bogus"); r.code != 2 || !strings.Contains(r.stderr, `unknown dlq subcommand "bogus"`) {
		t.Errorf("dlq bogus: exit %d, %q", r.code, r.stderr)
	}
	if r := runCLI(t, "", "dlq", "help"); r.code != 0 || !strings.Contains(r.stdout, "\n  show ") {
		t.Errorf("dlq help: exit %d, %q", r.code, r.stdout)
	}
}

func itoa(id int64) string { return strconv.FormatInt(id, 10) }

// fanOutFixture is one event dead-lettered for two managed endpoints, A and B, and for A twice:
// it failed there, was replayed, and failed again. Since schema 5 that is three dead letters
// with one delivery id, the id an operator arrives with from a log line or the consumer. other
// is an unrelated event's dead letter for A.
type fanOutFixture struct {
	delivery, endpointA, endpointB string
	aFirst, b, aAgain, other       int64 // in insertion order, so ids ascending
}

const (
	fanOutDelivery  = "5d1c7a9e-2b4f-4e8a-9c3d-6f0a1b2c3d4e"
	fanOutEndpointA = "aaaaaaaa-0000-4000-8000-000000000001"
	fanOutEndpointB = "bbbbbbbb-0000-4000-8000-000000000002"
)

// ensureEndpoint registers a managed endpoint with id, for the dead letters a fixture gives
// it: replay skips those of endpoints that do not exist (removed). tenant "" is none.
func ensureEndpoint(t *testing.T, db *sqltest.DB, id, tenant, ordering string) {
	t.Helper()
	mustExec(t, db, `INSERT INTO webhook_endpoints (id, url, secret, tenant, ordering)
		VALUES ($1::uuid, 'https://consumer.example/' || $1, 'fixture-secret', nullif($2, ''), $3)
		ON CONFLICT (id) DO NOTHING`, id, tenant, ordering)
}

// insertEndpointDeadLetter adds an event's dead letter (invoice.paid, attempts exhausted) of
// tenant (nil: none) for the managed endpoint endpointID and returns its id: what the replay
// tests of endpoints removed or changed since start from.
func insertEndpointDeadLetter(t *testing.T, db *sqltest.DB, tenant any, endpointID string) int64 {
	t.Helper()
	var id int64
	if err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, reason, enqueued_at, tenant, endpoint_id)
		VALUES (gen_random_uuid(), 'invoice.paid', '{"n": 1}', 3, 'attempts exhausted', now(), $1, $2::uuid)
		RETURNING id`, tenant, endpointID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func insertFanOut(t *testing.T, db *sqltest.DB) fanOutFixture {
	t.Helper()
	f := fanOutFixture{delivery: fanOutDelivery, endpointA: fanOutEndpointA, endpointB: fanOutEndpointB}
	ensureEndpoint(t, db, f.endpointA, "", "none")
	ensureEndpoint(t, db, f.endpointB, "", "none")
	f.aFirst = insertDeadLetter(t, db, deadLetterFixture{eventType: "invoice.paid", reason: "attempts exhausted",
		payload: `{"invoice": 7}`, failedAgo: 2 * time.Hour, replayed: true, deliveryID: &f.delivery, endpointID: &f.endpointA})
	f.b = insertDeadLetter(t, db, deadLetterFixture{eventType: "invoice.paid", reason: "permanent: HTTP 404",
		payload: `{"invoice": 7}`, failedAgo: 90 * time.Minute, deliveryID: &f.delivery, endpointID: &f.endpointB})
	f.aAgain = insertDeadLetter(t, db, deadLetterFixture{eventType: "invoice.paid", reason: "attempts exhausted",
		payload: `{"invoice": 7}`, failedAgo: time.Hour, deliveryID: &f.delivery, endpointID: &f.endpointA})
	f.other = insertDeadLetter(t, db, deadLetterFixture{eventType: "invoice.paid", reason: "attempts exhausted",
		failedAgo: 30 * time.Minute, endpointID: &f.endpointA})
	return f
}

func compactJSON(t *testing.T, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	return b.Bytes()
}

func deliveryIDOf(t *testing.T, db *sqltest.DB, id int64) string {
	t.Helper()
	var d string
	if err := db.Pool.QueryRow(context.Background(), "SELECT delivery_id::text FROM webhook_dead_letter WHERE id = $1", id).Scan(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

// outboxByEndpoint counts the outbox rows of a delivery per endpoint_id ("-" for none): what
// a replay sent where.
func outboxByEndpoint(t *testing.T, db *sqltest.DB, delivery string) map[string]int64 {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		SELECT coalesce(endpoint_id::text, '-'), count(*) FROM webhook_deliveries
		WHERE delivery_id = $1::uuid AND attempt = 1 AND NOT processed GROUP BY 1`, delivery)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var e string
		var n int64
		if err := rows.Scan(&e, &n); err != nil {
			t.Fatal(err)
		}
		out[e] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDLQListShowsDeliveryID: the table showed only the row number, which no log line, metric
// or consumer knows; it now shows the delivery id and the managed endpoint beside it.
func TestDLQListShowsDeliveryID(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	fo := insertFanOut(t, db)
	plain := insertDeadLetter(t, db, deadLetterFixture{eventType: "user.deleted", reason: "permanent: HTTP 410", failedAgo: time.Minute})
	plainDelivery := deliveryIDOf(t, db, plain)

	r := runCLI(t, db.URL, "dlq", "list")
	if r.code != 0 {
		t.Fatalf("dlq list exited %d: %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "ID  ") || !strings.Contains(lines[0], "  DELIVERY ID  ") ||
		!strings.Contains(lines[0], "  ENDPOINT  ") {
		t.Fatalf("dlq list printed:\n%s", r.stdout)
	}
	// Row id, delivery id, endpoint: the first three columns of each row, newest first.
	want := [][3]string{
		{itoa(plain), plainDelivery, "-"},
		{itoa(fo.other), deliveryIDOf(t, db, fo.other), fo.endpointA},
		{itoa(fo.aAgain), fo.delivery, fo.endpointA},
		{itoa(fo.b), fo.delivery, fo.endpointB},
		{itoa(fo.aFirst), fo.delivery, fo.endpointA},
	}
	for i, w := range want {
		fields := strings.Fields(lines[i+1])
		if len(fields) < 3 || [3]string(fields[:3]) != w {
			t.Errorf("dlq list row %d = %q, want it to start with %q", i+1, lines[i+1], w)
		}
	}

	r = runCLI(t, db.URL, "dlq", "list", "--json")
	var list []deadLetter
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 5 {
		t.Fatalf("dlq list --json printed %q: %v", r.stdout, err)
	}
	for i, w := range want {
		d := list[i]
		endpoint := "-"
		if d.EndpointID != nil {
			endpoint = *d.EndpointID
		}
		if itoa(d.ID) != w[0] || d.DeliveryID != w[1] || endpoint != w[2] {
			t.Errorf("dlq list --json [%d] = id %d, delivery_id %s, endpoint_id %s; want %q", i, d.ID, d.DeliveryID, endpoint, w)
		}
	}
	if !strings.Contains(r.stdout, `"endpoint_id": null`) {
		t.Errorf("dlq list --json must print endpoint_id null for a dead letter without an endpoint:\n%s", r.stdout)
	}
}

func TestDLQListFiltersByDeliveryAndEndpoint(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	fo := insertFanOut(t, db)
	insertDLQFixtures(t, db)

	cases := []struct {
		args []string
		want []int64
	}{
		{[]string{"--delivery-id", fo.delivery}, []int64{fo.aAgain, fo.b, fo.aFirst}}, // every endpoint, every failure
		{[]string{"--delivery-id", strings.ToUpper(fo.delivery)}, []int64{fo.aAgain, fo.b, fo.aFirst}},
		{[]string{"--endpoint-id", fo.endpointA}, []int64{fo.other, fo.aAgain, fo.aFirst}},
		{[]string{"--delivery-id", fo.delivery, "--endpoint-id", fo.endpointA}, []int64{fo.aAgain, fo.aFirst}},
		{[]string{"--delivery-id", fo.delivery, "--reason-contains", "404"}, []int64{fo.b}},
		{[]string{"--delivery-id", "00000000-0000-4000-8000-000000000000"}, []int64{}},
	}
	for _, tc := range cases {
		if got := listIDs(t, db, tc.args...); !slices.Equal(got, tc.want) {
			t.Errorf("dlq list %v = %v, want %v", tc.args, got, tc.want)
		}
	}
	// A malformed UUID is refused, naming it, rather than matching nothing.
	for _, bad := range [][]string{{"--delivery-id", "42"}, {"--endpoint-id", "not-a-uuid"}, {"--delivery-id", ""}} {
		r := runCLI(t, db.URL, append([]string{"dlq", "list"}, bad...)...)
		if r.code != 2 || !strings.Contains(r.stderr, strconv.Quote(bad[1])+" is not a UUID") {
			t.Errorf("dlq list %q: exit %d, stderr %q; want 2 naming it", bad, r.code, r.stderr)
		}
	}
}

func TestDLQShowByDeliveryID(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	fo := insertFanOut(t, db)

	// Text: what was selected, then one block per dead letter, oldest first.
	r := runCLI(t, db.URL, "dlq", "show", fo.delivery)
	if r.code != 0 {
		t.Fatalf("dlq show DELIVERY-ID exited %d: %s", r.code, r.stderr)
	}
	header := "delivery id " + fo.delivery + ": 3 dead letters (" + joinIDs([]int64{fo.aFirst, fo.b, fo.aAgain}) + "), oldest first\n"
	if !strings.HasPrefix(r.stdout, header) || strings.Count(r.stdout, "\npayload:\n") != 3 {
		t.Fatalf("dlq show DELIVERY-ID printed:\n%s", r.stdout)
	}
	blocks := strings.Split(r.stdout, "\n\nid ")
	if len(blocks) != 4 {
		t.Fatalf("dlq show DELIVERY-ID printed %d blocks, want 3:\n%s", len(blocks)-1, r.stdout)
	}
	for i, w := range []struct {
		id       int64
		endpoint string
	}{{fo.aFirst, fo.endpointA}, {fo.b, fo.endpointB}, {fo.aAgain, fo.endpointA}} {
		b := blocks[i+1]
		if !strings.HasPrefix(strings.TrimLeft(b, " "), itoa(w.id)+"\n") || !strings.Contains(b, "delivery_id   "+fo.delivery) ||
			!strings.Contains(b, "endpoint_id   "+w.endpoint) || !strings.Contains(b, "endpoint_url  - (the managed endpoint's URL)") {
			t.Errorf("block %d of dlq show DELIVERY-ID, want dead letter %d for endpoint %s:\nid %s", i, w.id, w.endpoint, b)
		}
	}
	// Case does not matter: logs and headers may print it either way.
	if r2 := runCLI(t, db.URL, "dlq", "show", strings.ToUpper(fo.delivery)); r2.code != 0 || r2.stdout != r.stdout {
		t.Errorf("dlq show of the upper-case delivery id: exit %d:\n%s%s", r2.code, r2.stdout, r2.stderr)
	}

	// JSON: an array for a delivery id, however many rows; an object for a row id, as before.
	var list []deadLetter
	r = runCLI(t, db.URL, "dlq", "show", "--json", fo.delivery)
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 3 {
		t.Fatalf("dlq show --json DELIVERY-ID printed %q: %v", r.stdout, err)
	}
	if list[0].ID != fo.aFirst || list[1].ID != fo.b || list[2].ID != fo.aAgain || list[0].ReplayedAt == nil ||
		list[1].EndpointID == nil || *list[1].EndpointID != fo.endpointB || !bytes.Equal(compactJSON(t, list[2].Payload), []byte(`{"invoice":7}`)) {
		t.Errorf("dlq show --json DELIVERY-ID = %+v", list)
	}
	other := deliveryIDOf(t, db, fo.other)
	list = nil
	r = runCLI(t, db.URL, "dlq", "show", other, "--json")
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 || list[0].ID != fo.other {
		t.Errorf("dlq show --json of a delivery id with one dead letter must still be an array: %q (%v)", r.stdout, err)
	}
	var one deadLetter
	r = runCLI(t, db.URL, "dlq", "show", "--json", itoa(fo.b))
	if err := json.Unmarshal([]byte(r.stdout), &one); err != nil || one.ID != fo.b || one.DeliveryID != fo.delivery ||
		one.EndpointID == nil || *one.EndpointID != fo.endpointB {
		t.Errorf("dlq show --json ID = %q (%v), want one object", r.stdout, err)
	}

	missing := "00000000-0000-4000-8000-000000000000"
	if r := runCLI(t, db.URL, "dlq", "show", missing); r.code != 1 || !strings.Contains(r.stderr, "no dead letter with delivery id "+missing+"; list them with fluxhook dlq list") {
		t.Errorf("dlq show of an unknown delivery id: exit %d, %q", r.code, r.stderr)
	}
}

// TestDLQReplayByDeliveryID: a delivery id replays the event wherever it is still dead: once
// per endpoint, never the dead letter a replay already dealt with, and --force does not send
// it twice to the endpoint where it failed twice.
func TestDLQReplayByDeliveryID(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	fo := insertFanOut(t, db)
	selected := "delivery id " + fo.delivery + ": 3 dead letters (" + joinIDs([]int64{fo.aFirst, fo.b, fo.aAgain}) + ")\n"

	r := runCLI(t, db.URL, "dlq", "replay", "--dry-run", fo.delivery)
	if r.code != 0 || !strings.HasPrefix(r.stdout, selected) ||
		!strings.Contains(r.stdout, "would replay 2, skipped 1 already replayed (dry run: nothing changed)") {
		t.Fatalf("dry run: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != 0 {
		t.Fatalf("a dry run wrote %d outbox rows", n)
	}
	aFirstReplayed := replayedAt(t, db, fo.aFirst)

	r = runCLI(t, db.URL, "dlq", "replay", fo.delivery)
	if r.code != 0 || !strings.HasPrefix(r.stdout, selected) || !strings.Contains(r.stdout, "replayed 2, skipped 1 already replayed") ||
		!strings.Contains(r.stdout, "replayed  "+itoa(fo.b)) || !strings.Contains(r.stdout, "replayed  "+itoa(fo.aAgain)) ||
		!strings.Contains(r.stdout, "skipped   "+itoa(fo.aFirst)) || !strings.Contains(r.stdout, "endpoint_id "+fo.endpointB) {
		t.Fatalf("dlq replay DELIVERY-ID: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := outboxByEndpoint(t, db, fo.delivery); len(got) != 2 || got[fo.endpointA] != 1 || got[fo.endpointB] != 1 {
		t.Errorf("replay by delivery id sent %v, want the event once to each endpoint", got)
	}
	for _, id := range []int64{fo.b, fo.aAgain} {
		// The delivery's copies for both endpoints join the row; one of them is its own.
		c := replayedCopies(t, db, id)
		if !slices.ContainsFunc(c, func(c outboxCopy) bool { return c.sameEvent && c.attempt == 1 }) || c[0].replayedAt == nil {
			t.Errorf("dead letter %d after replay by delivery id: %+v", id, c)
		}
	}
	if at := replayedAt(t, db, fo.aFirst); !at.Equal(*aFirstReplayed) {
		t.Errorf("the already replayed dead letter was replayed again: replayed_at %v, was %v", at, aFirstReplayed)
	}
	if at := replayedAt(t, db, fo.other); at != nil {
		t.Errorf("another event's dead letter for the same endpoint was replayed at %v", at)
	}

	// Again: everything is replayed, nothing is sent.
	r = runCLI(t, db.URL, "dlq", "replay", fo.delivery)
	if r.code != 1 || !strings.Contains(r.stdout, "replayed 0, skipped 3 already replayed") {
		t.Errorf("second replay: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}

	// --force sends it once more to each endpoint: the first dead letter for A is superseded by
	// the second, and replaying both would send the event to A twice.
	r = runCLI(t, db.URL, "dlq", "replay", "--force", fo.delivery)
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 2, skipped 1 superseded") ||
		!strings.Contains(r.stdout, "superseded by dead letter "+itoa(fo.aAgain)) {
		t.Fatalf("replay --force DELIVERY-ID: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := outboxByEndpoint(t, db, fo.delivery); got[fo.endpointA] != 2 || got[fo.endpointB] != 2 {
		t.Errorf("after replay --force by delivery id the outbox holds %v, want two copies per endpoint", got)
	}
	// Named by its row id, a superseded dead letter is replayed as asked.
	r = runCLI(t, db.URL, "dlq", "replay", "--force", "--dry-run", fo.delivery, itoa(fo.aFirst), itoa(fo.b))
	if r.code != 0 || !strings.Contains(r.stdout, "would replay 3 (dry run") {
		t.Errorf("replay --force of a delivery id and its superseded row by id: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}

	// An unknown delivery id fails the whole command, as an unknown row id does.
	missing := "00000000-0000-4000-8000-000000000000"
	before := count(t, db, "SELECT count(*) FROM webhook_deliveries")
	r = runCLI(t, db.URL, "dlq", "replay", "--force", itoa(fo.other), missing)
	if r.code != 1 || !strings.Contains(r.stderr, "no dead letter with delivery id "+missing+"; nothing replayed") {
		t.Errorf("replay with an unknown delivery id: exit %d, stderr %q", r.code, r.stderr)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != before {
		t.Errorf("a failed replay wrote %d outbox rows", n-before)
	}
}

func TestDLQBulkReplayByDeliveryAndEndpoint(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	fo := insertFanOut(t, db)

	r := runCLI(t, db.URL, "dlq", "replay", "--all-matching", "--delivery-id", fo.delivery, "--endpoint-id", fo.endpointB)
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 1\n") || !strings.Contains(r.stdout, "replayed  "+itoa(fo.b)) {
		t.Fatalf("bulk replay by delivery and endpoint: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := outboxByEndpoint(t, db, fo.delivery); len(got) != 1 || got[fo.endpointB] != 1 {
		t.Errorf("bulk replay by delivery and endpoint sent %v, want once to B", got)
	}

	r = runCLI(t, db.URL, "dlq", "replay", "--all-matching", "--delivery-id", fo.delivery)
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 1, skipped 2 already replayed") ||
		!strings.Contains(r.stdout, "replayed  "+itoa(fo.aAgain)) {
		t.Fatalf("bulk replay by delivery id: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := outboxByEndpoint(t, db, fo.delivery); len(got) != 2 || got[fo.endpointA] != 1 || got[fo.endpointB] != 1 {
		t.Errorf("bulk replay by delivery id: outbox holds %v, want once to each endpoint", got)
	}
	if at := replayedAt(t, db, fo.other); at != nil {
		t.Errorf("a dead letter of another delivery was replayed at %v", at)
	}

	// The filters select rows only with --all-matching; a delivery id alone is an argument.
	r = runCLI(t, db.URL, "dlq", "replay", "--delivery-id", fo.delivery)
	if r.code != 2 || !strings.Contains(r.stderr, "only with --all-matching") {
		t.Errorf("dlq replay --delivery-id without --all-matching: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestDLQMalformedIDs: an argument that is neither a row id nor a delivery id exits 2 naming
// it and saying what is accepted, and nothing is done even for the valid arguments beside it.
func TestDLQMalformedIDs(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	fo := insertFanOut(t, db)

	bads := []string{"abc", "0", "12x", "1e3",
		"5d1c7a9e-2b4f-4e8a-9c3d-6f0a1b2c3d4",    // a digit short
		"5d1c7a9e2b4f4e8a9c3d6f0a1b2c3d4e",       // no hyphens
		"{5d1c7a9e-2b4f-4e8a-9c3d-6f0a1b2c3d4e}", // braces
		"5d1c7a9e-2b4f-4e8a-9c3d-6f0a1b2c3d4g"}   // not hex
	for _, sub := range []string{"show", "replay", "purge"} {
		for _, bad := range bads {
			args := []string{"dlq", sub, bad}
			if sub != "show" {
				args = []string{"dlq", sub, fo.delivery, bad, itoa(fo.other)}
			}
			r := runCLI(t, db.URL, args...)
			if r.code != 2 || !strings.Contains(r.stderr, strconv.Quote(bad)+" is not a dead-letter id") ||
				!strings.Contains(r.stderr, "or a delivery id (a UUID") {
				t.Errorf("dlq %s %q: exit %d, stderr %q; want 2 naming the argument", sub, bad, r.code, r.stderr)
			}
		}
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != 0 {
		t.Errorf("refused replays wrote %d outbox rows", n)
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_dead_letter"); n != 4 {
		t.Errorf("refused purges left %d of 4 dead letters", n)
	}
}

// stoppedStream is an ordered stream stopped at a dead letter as the dispatcher leaves it in
// "stop" mode (stages/settle, schema 6): the head's outbox row parked, undelivered, at
// 'infinity' with a 'stream stopped: ...' deferred_reason and no lease; its dead letter
// pointing at it (outbox_id) with its order key; and the stream's next event waiting behind it.
type stoppedStream struct {
	stream             string
	delivery           string
	parked, behind     int64 // outbox row ids
	deadLetter, key    int64
	parkedBeforeChange outboxRow
}

const stoppedEndpoint = "cccccccc-0000-4000-8000-000000000003"

func insertStoppedStream(t *testing.T, db *sqltest.DB, stream string, key int64) stoppedStream {
	t.Helper()
	ctx := context.Background()
	s := stoppedStream{stream: stream, key: key}
	ensureEndpoint(t, db, stoppedEndpoint, "acme", "stream")
	err := db.Pool.QueryRow(ctx, `
		INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, tenant, routed_at, attempt, order_key,
		                            created_at, status_code, error, duration_ms, deferred_reason)
		VALUES ($1, 'order.updated', '{"step": 1}', $2::uuid, 'acme', now(), 3, $3, 'infinity', 410, 'HTTP 410', 12,
		        'stream stopped: permanent: HTTP 410')
		RETURNING id, delivery_id::text`, stream, stoppedEndpoint, key).Scan(&s.parked, &s.delivery)
	if err != nil {
		t.Fatalf("inserting the parked row: %v", err)
	}
	err = db.Pool.QueryRow(ctx, `
		INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload, attempts, last_status,
		                                 last_error, reason, enqueued_at, tenant, endpoint_id, order_key)
		SELECT id, delivery_id, stream_id, event_type, payload, attempt, status_code, error, 'permanent: HTTP 410',
		       enqueued_at, tenant, endpoint_id, order_key
		FROM webhook_deliveries WHERE id = $1
		RETURNING id`, s.parked).Scan(&s.deadLetter)
	if err != nil {
		t.Fatalf("inserting the dead letter: %v", err)
	}
	err = db.Pool.QueryRow(ctx, `
		INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, tenant, routed_at, order_key)
		VALUES ($1, 'order.updated', '{"step": 2}', $2::uuid, 'acme', now(), $3::bigint + 1)
		RETURNING id`, stream, stoppedEndpoint, key).Scan(&s.behind)
	if err != nil {
		t.Fatalf("inserting the row behind: %v", err)
	}
	s.parkedBeforeChange = outboxRowOf(t, db, s.parked)
	return s
}

// outboxRow is what the tests check of one outbox row, comparable with ==: "" and 0 stand
// for NULL.
type outboxRow struct {
	processed, hasProcessedAt, leased, infinite bool
	deferredReason, error                       string
	orderKey                                    int64
}

func outboxRowOf(t *testing.T, db *sqltest.DB, id int64) outboxRow {
	t.Helper()
	var r outboxRow
	err := db.Pool.QueryRow(context.Background(), `
		SELECT processed, processed_at IS NOT NULL, lease_until IS NOT NULL, created_at = 'infinity',
		       coalesce(deferred_reason, ''), coalesce(error, ''), coalesce(order_key, 0)
		FROM webhook_deliveries WHERE id = $1`, id).
		Scan(&r.processed, &r.hasProcessedAt, &r.leased, &r.infinite, &r.deferredReason, &r.error, &r.orderKey)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// streamHead is the row that leads the stream for the stopped streams' endpoint, by the
// claim's rule (the smallest key, order_key or else id, among its undelivered rows), and
// whether it is due: a parked head is not, and holds every row behind it.
func streamHead(t *testing.T, db *sqltest.DB, stream string) (id int64, due bool) {
	t.Helper()
	err := db.Pool.QueryRow(context.Background(), `
		SELECT id, created_at <= now() FROM webhook_deliveries
		WHERE NOT processed AND stream_id = $1 AND endpoint_id = $2::uuid
		ORDER BY coalesce(order_key, id), id LIMIT 1`, stream, stoppedEndpoint).Scan(&id, &due)
	if err != nil {
		t.Fatalf("the head of stream %s: %v", stream, err)
	}
	return id, due
}

// TestDLQReplayResumesStoppedStream: replaying the dead letter of a stream stopped in "stop"
// mode settles the parked row and re-enqueues the event with its order key, in one statement,
// so that the replayed event leads its stream again and the events behind it follow.
func TestDLQReplayResumesStoppedStream(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s1 := insertStoppedStream(t, db, "order-1", 1000)
	s2 := insertStoppedStream(t, db, "order-2", 2000)
	if head, due := streamHead(t, db, s1.stream); head != s1.parked || due {
		t.Fatalf("fixture: the head of %s is %d (due %v), want the parked row %d, not due", s1.stream, head, due, s1.parked)
	}

	if r := runCLI(t, db.URL, "dlq", "replay", "--dry-run", itoa(s1.deadLetter)); r.code != 0 || !strings.Contains(r.stdout, "would replay 1") {
		t.Fatalf("replay --dry-run: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := outboxRowOf(t, db, s1.parked); got != s1.parkedBeforeChange {
		t.Errorf("a dry run changed the parked row: %+v", got)
	}

	r := runCLI(t, db.URL, "dlq", "replay", itoa(s1.deadLetter))
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 1\n") {
		t.Fatalf("replay: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	parked := outboxRowOf(t, db, s1.parked)
	if !parked.processed || !parked.hasProcessedAt || parked.leased || parked.deferredReason != "" || parked.orderKey != s1.key ||
		!strings.Contains(parked.error, "dead letter "+itoa(s1.deadLetter)+" was replayed as a new row") {
		t.Errorf("the parked row after the replay: %+v, want it settled as processed, saying it was replayed", parked)
	}
	var replayed int64
	var orderKey *int64
	var attempt int
	var routed, due bool
	err := db.Pool.QueryRow(context.Background(), `
		SELECT id, order_key, attempt, routed_at IS NOT NULL, created_at <= now() FROM webhook_deliveries
		WHERE delivery_id = $1::uuid AND NOT processed`, s1.delivery).Scan(&replayed, &orderKey, &attempt, &routed, &due)
	if err != nil {
		t.Fatalf("the replayed row: %v", err)
	}
	if orderKey == nil || *orderKey != s1.key || attempt != 1 || !routed || !due {
		t.Errorf("the replayed row: order_key %v, attempt %d, routed %v, due %v; want order key %d, a first attempt, routed, due",
			orderKey, attempt, routed, due, s1.key)
	}
	if c := replayedCopies(t, db, s1.deadLetter); len(c) != 2 || !c[1].sameEvent {
		t.Errorf("the event's outbox rows after the replay: %+v, want the parked one and its copy", c)
	}
	if head, due := streamHead(t, db, s1.stream); head != replayed || !due {
		t.Errorf("the head of %s is %d (due %v), want the replayed row %d, due", s1.stream, head, due, replayed)
	}
	// The other stopped stream waits for its own dead letter.
	if got := outboxRowOf(t, db, s2.parked); got != s2.parkedBeforeChange {
		t.Errorf("another stopped stream's parked row changed: %+v", got)
	}
	if head, _ := streamHead(t, db, s2.stream); head != s2.parked {
		t.Errorf("the head of %s is %d, want its parked row %d", s2.stream, head, s2.parked)
	}

	// --force replays it again; the parked row, settled already, is left as it is.
	if r := runCLI(t, db.URL, "dlq", "replay", "--force", itoa(s1.deadLetter)); r.code != 0 || !strings.Contains(r.stdout, "replayed 1\n") {
		t.Fatalf("replay --force: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := outboxRowOf(t, db, s1.parked); got != parked {
		t.Errorf("a second replay changed the settled parked row: %+v, was %+v", got, parked)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1::uuid AND NOT processed AND order_key = $2`,
		s1.delivery, s1.key); n != 2 {
		t.Errorf("%d undelivered copies with the order key after replay --force, want 2", n)
	}
}

// TestDLQPurgeResumesStoppedStream: purging the dead letter of a stream stopped in "stop" mode
// gives the event up: its parked row is settled, the stream goes on with the next event, and
// the dispatchers are told.
func TestDLQPurgeResumesStoppedStream(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	s1 := insertStoppedStream(t, db, "order-1", 1000)
	s2 := insertStoppedStream(t, db, "order-2", 2000)
	outboxRows := count(t, db, `SELECT count(*) FROM webhook_deliveries`)

	if r := runCLI(t, db.URL, "dlq", "purge", "--dry-run", itoa(s1.deadLetter)); r.code != 0 || !strings.Contains(r.stdout, "would purge 1") {
		t.Fatalf("purge --dry-run: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := outboxRowOf(t, db, s1.parked); got != s1.parkedBeforeChange {
		t.Errorf("a dry run changed the parked row: %+v", got)
	}

	listener, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN webhook_outbox"); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, db.URL, "dlq", "purge", itoa(s1.deadLetter))
	if r.code != 0 || r.stdout != "purged 1 dead letter(s): "+itoa(s1.deadLetter)+"\n" {
		t.Fatalf("purge: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	parked := outboxRowOf(t, db, s1.parked)
	if !parked.processed || !parked.hasProcessedAt || parked.leased || parked.deferredReason != "" ||
		!strings.Contains(parked.error, "dead letter "+itoa(s1.deadLetter)+" was purged") {
		t.Errorf("the parked row after the purge: %+v, want it settled as processed, saying it was purged", parked)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries`); n != outboxRows {
		t.Errorf("the purge wrote outbox rows: %d, was %d", n, outboxRows)
	}
	if head, due := streamHead(t, db, s1.stream); head != s1.behind || !due {
		t.Errorf("the head of %s is %d (due %v), want the next event %d, due", s1.stream, head, due, s1.behind)
	}
	if got := outboxRowOf(t, db, s2.parked); got != s2.parkedBeforeChange {
		t.Errorf("another stopped stream's parked row changed: %+v", got)
	}
	// The rows behind were due already: without a NOTIFY an idle dispatcher would find them
	// only at its backstop poll.
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	n, err := listener.WaitForNotification(waitCtx)
	cancel()
	if err != nil {
		t.Fatalf("no NOTIFY after a purge released a stream: %v", err)
	}
	if _, perr := strconv.ParseUint(n.Payload, 10, 64); n.Channel != "webhook_outbox" || perr != nil {
		t.Errorf("NOTIFY %q on %q, want a transaction id on webhook_outbox", n.Payload, n.Channel)
	}

	// By filter too, with the same effect on the other stream.
	if r := runCLI(t, db.URL, "dlq", "purge", "--all-matching", "--endpoint-id", stoppedEndpoint); r.code != 0 ||
		r.stdout != "purged 1 dead letter(s): "+itoa(s2.deadLetter)+"\n" {
		t.Fatalf("purge --all-matching: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if head, due := streamHead(t, db, s2.stream); head != s2.behind || !due {
		t.Errorf("the head of %s is %d (due %v), want the next event %d, due", s2.stream, head, due, s2.behind)
	}
}

// TestDLQReplayOrdinaryDeadLetters: what a replay did before schema 6 it still does. A dead
// letter's outbox row, settled by the dispatcher, is left as it is; an unordered dead letter
// gives an unordered row, a skipped ordered one keeps its key; and a parked row is settled
// only by its own dead letter, never by one whose outbox_id names it by mistake.
func TestDLQReplayOrdinaryDeadLetters(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	stopped := insertStoppedStream(t, db, "order-1", 1000)

	// As the dispatcher leaves a dead letter of an unordered row (at an endpoint that orders
	// streams, an event without a stream), and of an ordered one whose stream skipped it: the
	// outbox row processed, with its error.
	var unorderedRow, skippedRow int64
	for _, r := range []struct {
		id     *int64
		stream *string
		key    *int64
	}{{&unorderedRow, nil, nil}, {&skippedRow, ptr("order-9"), ptr(int64(500))}} {
		if err := db.Pool.QueryRow(ctx, `
			INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, tenant, routed_at, attempt, order_key,
			                            processed, processed_at, status_code, error)
			VALUES ($3, 'order.created', '{}', $1::uuid, 'acme', now(), 2, $2, true, now(), 404, 'HTTP 404')
			RETURNING id`, stoppedEndpoint, r.key, r.stream).Scan(r.id); err != nil {
			t.Fatal(err)
		}
	}
	deadLetterOf := func(outboxID int64) int64 {
		t.Helper()
		var id int64
		if err := db.Pool.QueryRow(ctx, `
			INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload, attempts, reason,
			                                 enqueued_at, endpoint_id, order_key, tenant)
			SELECT id, delivery_id, stream_id, event_type, payload, attempt, 'permanent: HTTP 404', enqueued_at,
			       endpoint_id, order_key, tenant
			FROM webhook_deliveries WHERE id = $1
			RETURNING id`, outboxID).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	unordered, skipped := deadLetterOf(unorderedRow), deadLetterOf(skippedRow)
	// A dead letter written by hand, whose outbox_id names the parked row of another event.
	stray := insertDeadLetter(t, db, deadLetterFixture{eventType: "order.created", reason: "imported"})
	mustExec(t, db, `UPDATE webhook_dead_letter SET outbox_id = $1 WHERE id = $2`, stopped.parked, stray)
	before := map[int64]outboxRow{unorderedRow: outboxRowOf(t, db, unorderedRow), skippedRow: outboxRowOf(t, db, skippedRow)}

	r := runCLI(t, db.URL, "dlq", "replay", itoa(unordered), itoa(skipped), itoa(stray))
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 3\n") {
		t.Fatalf("replay: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	for id, want := range before {
		if got := outboxRowOf(t, db, id); got != want {
			t.Errorf("outbox row %d changed by the replay of its dead letter: %+v, was %+v", id, got, want)
		}
	}
	if got := outboxRowOf(t, db, stopped.parked); got != stopped.parkedBeforeChange {
		t.Errorf("a dead letter of another event settled the parked row: %+v", got)
	}
	for _, tc := range []struct {
		deadLetter int64
		key        *int64
	}{{unordered, nil}, {skipped, ptr(int64(500))}, {stray, nil}} {
		c := replayedCopies(t, db, tc.deadLetter)
		last := c[len(c)-1]
		if !last.sameEvent || last.attempt != 1 || !last.dueNow || last.processed || last.replayedAt == nil {
			t.Errorf("dead letter %d: replayed row %+v, want the same event as a first attempt due now", tc.deadLetter, last)
		}
		var key *int64
		if err := db.Pool.QueryRow(ctx, `SELECT o.order_key FROM webhook_deliveries o JOIN webhook_dead_letter d USING (delivery_id)
			WHERE d.id = $1 AND NOT o.processed`, tc.deadLetter).Scan(&key); err != nil {
			t.Fatal(err)
		}
		if (key == nil) != (tc.key == nil) || key != nil && *key != *tc.key {
			t.Errorf("dead letter %d: the replayed row's order_key is %v, want %v", tc.deadLetter, key, tc.key)
		}
	}
}

// TestDLQShowsTenantAndOrderKey: an ordered endpoint's dead letter shows its tenant and its
// order key (what a replay keeps), in show, show --json and list --json; an unordered one
// without a tenant shows neither.
func TestDLQShowsTenantAndOrderKey(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := insertStoppedStream(t, db, "order-7", 7000)
	f := insertDLQFixtures(t, db)

	r := runCLI(t, db.URL, "dlq", "show", itoa(s.deadLetter))
	for _, want := range []string{"tenant        acme\n", "order_key     7000 (a replay keeps it)\n"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("dlq show (exit %d) lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
		}
	}
	r = runCLI(t, db.URL, "dlq", "show", itoa(f.notFound))
	for _, want := range []string{"tenant        -\n", "order_key     - (unordered)\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dlq show of an unordered dead letter lacks %q:\n%s", want, r.stdout)
		}
	}

	r = runCLI(t, db.URL, "dlq", "show", "--json", itoa(s.deadLetter))
	var d deadLetter
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
		t.Fatalf("dlq show --json printed %q: %v", r.stdout, err)
	}
	if d.Tenant == nil || *d.Tenant != "acme" || d.OrderKey == nil || *d.OrderKey != 7000 {
		t.Errorf("dlq show --json: tenant %v, order_key %v; want acme, 7000", d.Tenant, d.OrderKey)
	}
	r = runCLI(t, db.URL, "dlq", "list", "--json")
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("dlq list --json printed %q: %v", r.stdout, err)
	}
	seen := 0
	for _, m := range list {
		id := int64(m["id"].(float64))
		if _, ok := m["order_key"]; !ok {
			t.Errorf("dlq list --json row %d has no order_key field", id)
		}
		switch id {
		case s.deadLetter:
			seen++
			if m["order_key"] != float64(7000) || m["tenant"] != "acme" {
				t.Errorf("dlq list --json row %d: order_key %v, tenant %v; want 7000, acme", id, m["order_key"], m["tenant"])
			}
		case f.notFound:
			seen++
			if m["order_key"] != nil || m["tenant"] != nil {
				t.Errorf("dlq list --json row %d: order_key %v, tenant %v; want null, null", id, m["order_key"], m["tenant"])
			}
		}
	}
	if seen != 2 {
		t.Errorf("dlq list --json showed %d of the 2 dead letters checked:\n%s", seen, r.stdout)
	}
}

// TestDLQReplayOfARemovedEndpoint: a dead letter whose managed endpoint was removed is not
// replayed to it (it would only fail again) and says how to send it elsewhere; --to-endpoint
// sends it to another enabled endpoint of its tenant, with the same delivery id, routed so
// that it is not fanned out again, and never to an endpoint of another tenant, nor to one
// that is missing or disabled.
func TestDLQReplayOfARemovedEndpoint(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	const (
		gone     = "dddddddd-0000-4000-8000-000000000004"
		moved    = "eeeeeeee-0000-4000-8000-000000000005"
		other    = "ffffffff-0000-4000-8000-000000000006"
		disabled = "99999999-0000-4000-8000-000000000007"
	)
	ensureEndpoint(t, db, moved, "acme", "none")
	ensureEndpoint(t, db, other, "globex", "none")
	ensureEndpoint(t, db, disabled, "acme", "none")
	mustExec(t, db, `UPDATE webhook_endpoints SET enabled = false, disabled_at = now(), disabled_reason = 'by hand' WHERE id = $1`, disabled)
	acme := insertEndpointDeadLetter(t, db, "acme", gone)
	none := insertEndpointDeadLetter(t, db, nil, gone)
	queued := func() map[string]int64 { return outboxByEndpoint(t, db, deliveryIDOf(t, db, acme)) }

	r := runCLI(t, db.URL, "dlq", "replay", itoa(acme), itoa(none))
	if r.code != 1 || !strings.Contains(r.stdout, "its endpoint "+gone+" was removed; --to-endpoint ID") ||
		!strings.Contains(r.stdout, "replayed 0, skipped 2 of removed endpoints\n") {
		t.Fatalf("replay of a removed endpoint's dead letters: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox`); n != 0 {
		t.Errorf("a replay to a removed endpoint wrote %d outbox rows", n)
	}

	for _, bad := range []struct{ target, want string }{
		{"12345678-0000-4000-8000-000000000000", "endpoint 12345678-0000-4000-8000-000000000000 not found; nothing replayed"},
		{disabled, "endpoint " + disabled + " is disabled; nothing replayed: enable it first"},
	} {
		r := runCLI(t, db.URL, "dlq", "replay", "--to-endpoint", bad.target, itoa(acme))
		if r.code != 1 || !strings.Contains(r.stderr, bad.want) {
			t.Errorf("--to-endpoint %s: exit %d, stderr %q; want 1 and %q", bad.target, r.code, r.stderr, bad.want)
		}
	}
	if r := runCLI(t, db.URL, "dlq", "replay", "--to-endpoint", "nope", itoa(acme)); r.code != 2 {
		t.Errorf("--to-endpoint nope exited %d, want 2", r.code)
	}

	r = runCLI(t, db.URL, "dlq", "replay", "--to-endpoint", other, itoa(acme))
	if r.code != 1 || !strings.Contains(r.stdout, "its tenant (acme) is not endpoint "+other+"'s (globex): events never cross tenants") ||
		!strings.Contains(r.stdout, "replayed 0, skipped 1 of other tenants\n") {
		t.Errorf("replay to another tenant's endpoint: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}

	r = runCLI(t, db.URL, "dlq", "replay", "--to-endpoint", moved, itoa(acme), itoa(none))
	if r.code != 0 || !strings.Contains(r.stdout, "to endpoint_id "+moved) || !strings.Contains(r.stdout, "replayed 1, skipped 1 of other tenants\n") {
		t.Fatalf("replay to the endpoint the consumer moved to: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := queued(); len(got) != 1 || got[moved] != 1 {
		t.Errorf("the replayed event's outbox rows by endpoint: %v, want one for %s", got, moved)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE endpoint_id = $1::uuid AND routed_at IS NOT NULL
		AND tenant = 'acme' AND attempt = 1 AND endpoint_url IS NULL AND order_key IS NULL`, moved); n != 1 {
		t.Errorf("%d rows for %s routed, of tenant acme, first attempts; want 1", n, moved)
	}
	if at := replayedAt(t, db, acme); at == nil {
		t.Errorf("the replayed dead letter is not marked replayed")
	}
	if at := replayedAt(t, db, none); at != nil {
		t.Errorf("the skipped dead letter is marked replayed at %v", at)
	}
}

// TestDLQReplayToEndpointOfAStoppedStream: replaying a stopped stream's dead letter to another
// endpoint leaves that stream stopped (the event does not come back to it; purging the dead
// letter lets it go on), keeps the order key only for an ordered target, and sends an event
// with several dead letters (one per endpoint it failed for) to the target once.
func TestDLQReplayToEndpointOfAStoppedStream(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	const moved = "eeeeeeee-0000-4000-8000-000000000005"
	ensureEndpoint(t, db, moved, "acme", "none")
	s := insertStoppedStream(t, db, "order-1", 1000)
	// The same event's dead letter for a second endpoint.
	var twin int64
	if err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO webhook_dead_letter (delivery_id, stream_id, event_type, payload, attempts, reason, enqueued_at, tenant, endpoint_id)
		SELECT delivery_id, stream_id, event_type, payload, attempts, 'attempts exhausted', enqueued_at, tenant,
		       'aaaaaaaa-0000-4000-8000-000000000001'
		FROM webhook_dead_letter WHERE id = $1
		RETURNING id`, s.deadLetter).Scan(&twin); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, db.URL, "dlq", "replay", "--to-endpoint", moved, s.delivery)
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 1, skipped 1 of events already going there\n") ||
		!strings.Contains(r.stdout, "skipped   "+itoa(twin)) {
		t.Fatalf("replay by delivery id to %s: exit %d:\n%s%s", moved, r.code, r.stdout, r.stderr)
	}
	if got := outboxByEndpoint(t, db, s.delivery); got[moved] != 1 {
		t.Errorf("the event's outbox rows by endpoint: %v, want one for %s", got, moved)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE endpoint_id = $1::uuid AND order_key IS NULL`, moved); n != 1 {
		t.Errorf("%d unordered rows for the unordered target, want 1 (its order key dropped)", n)
	}
	if got := outboxRowOf(t, db, s.parked); got != s.parkedBeforeChange {
		t.Errorf("the stopped stream's parked row changed: %+v, was %+v; it must stay stopped", got, s.parkedBeforeChange)
	}
	if head, due := streamHead(t, db, s.stream); head != s.parked || due {
		t.Errorf("the head of %s is %d (due %v), want its parked row %d, not due", s.stream, head, due, s.parked)
	}
}

// TestDLQReplayWithoutAKeyToAnOrderedEndpoint: a dead letter that has no place in its stream
// (its endpoint did not order streams when it failed) and goes to an endpoint that orders them
// now, named by --to-endpoint or its own endpoint switched to ordering since, gets its new
// row's id as its key, after every id drawn before the replay: it waits behind the stream's
// pending events there instead of overtaking them, and several such events of one stream keep
// their enqueue order. One without a stream, and one going to an endpoint that does not order,
// stay unordered.
func TestDLQReplayWithoutAKeyToAnOrderedEndpoint(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	const (
		ordered  = "abababab-0000-4000-8000-00000000000a"
		switched = "cdcdcdcd-0000-4000-8000-00000000000c"
		plain    = "dededede-0000-4000-8000-00000000000d"
		gone     = "efefefef-0000-4000-8000-00000000000e"
	)
	ensureEndpoint(t, db, ordered, "acme", "stream")
	ensureEndpoint(t, db, switched, "acme", "none")
	ensureEndpoint(t, db, plain, "acme", "none")
	// The stream's event still pending at the ordered endpoint, keyed as routing keys it.
	var pending int64
	if err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, tenant, routed_at)
		VALUES ('cart-1', 'cart.updated', '{"step": 1}', $1::uuid, 'acme', now())
		RETURNING id`, ordered).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `UPDATE webhook_outbox SET order_key = id WHERE id = $1`, pending)
	deadLetter := func(stream any, endpoint string, enqueuedAgo string) int64 {
		t.Helper()
		var id int64
		if err := db.Pool.QueryRow(context.Background(), `
			INSERT INTO webhook_dead_letter (delivery_id, stream_id, event_type, payload, attempts, reason, enqueued_at, tenant, endpoint_id)
			VALUES (gen_random_uuid(), $1, 'cart.updated', '{}', 3, 'attempts exhausted', now() - $3::interval, 'acme', $2::uuid)
			RETURNING id`, stream, endpoint, enqueuedAgo).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// Dead-lettered in an order that is neither their enqueue order nor its reverse.
	third := deadLetter("cart-1", gone, "1 minute")
	first := deadLetter("cart-1", gone, "3 minutes")
	second := deadLetter("cart-1", gone, "2 minutes")
	streamless := deadLetter(nil, gone, "4 minutes")
	own := deadLetter("cart-2", switched, "1 minute")
	unordered := deadLetter("cart-3", plain, "1 minute")
	var drawnBefore int64
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT last_value FROM webhook_outbox_id_seq`).Scan(&drawnBefore); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, db.URL, "dlq", "replay", "--to-endpoint", ordered, itoa(third), itoa(first), itoa(second), itoa(streamless))
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 4") {
		t.Fatalf("replay to the ordered endpoint: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	mustExec(t, db, `UPDATE webhook_endpoints SET ordering = 'stream' WHERE id = $1::uuid`, switched)
	if r := runCLI(t, db.URL, "dlq", "replay", itoa(own), itoa(unordered)); r.code != 0 || !strings.Contains(r.stdout, "replayed 2") {
		t.Fatalf("replay to their own endpoints: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}

	type row struct {
		id  int64
		key *int64
	}
	rowOf := func(deadLetter int64) row {
		t.Helper()
		var r row
		if err := db.Pool.QueryRow(context.Background(), `
			SELECT o.id, o.order_key FROM webhook_outbox o JOIN webhook_dead_letter d USING (delivery_id)
			WHERE d.id = $1`, deadLetter).Scan(&r.id, &r.key); err != nil {
			t.Fatalf("the replayed row of dead letter %d: %v", deadLetter, err)
		}
		return r
	}
	var keys []int64
	for _, dl := range []int64{first, second, third, own} {
		r := rowOf(dl)
		switch {
		case r.key == nil:
			t.Fatalf("dead letter %d was replayed without an order key; want its row's id %d", dl, r.id)
		case *r.key != r.id || *r.key <= drawnBefore:
			t.Errorf("dead letter %d: order key %d, want its row's id %d, after %d (the last id drawn before the replay)", dl, *r.key, r.id, drawnBefore)
		}
		keys = append(keys, *r.key)
	}
	if !(keys[0] < keys[1] && keys[1] < keys[2]) {
		t.Errorf("order keys of the events enqueued first, second, third: %v; want their enqueue order", keys[:3])
	}
	for _, dl := range []int64{streamless, unordered} {
		if k := rowOf(dl).key; k != nil {
			t.Errorf("dead letter %d (no stream, or an endpoint that does not order) got order key %d, want none", dl, *k)
		}
	}
	// The claim's head check orders by key: the stream's pending event stays its head.
	var head int64
	if err := db.Pool.QueryRow(context.Background(), `
		SELECT id FROM webhook_outbox WHERE stream_id = 'cart-1' AND endpoint_id = $1::uuid
		ORDER BY order_key LIMIT 1`, ordered).Scan(&head); err != nil {
		t.Fatal(err)
	}
	if head != pending {
		t.Errorf("the head of cart-1 at the ordered endpoint is row %d, want the pending event's row %d", head, pending)
	}
}

// TestDLQReplayToItsEndpointOfAnotherTenantNow: a dead letter of an acme event whose endpoint
// has since been given to globex is not replayed to it (by id or in bulk): the replay names
// both tenants and points at --to-endpoint, and writes nothing. One of an endpoint still of its
// tenant goes as before.
func TestDLQReplayToItsEndpointOfAnotherTenantNow(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	const (
		moved = "abababab-0000-4000-8000-000000000001"
		kept  = "cdcdcdcd-0000-4000-8000-000000000002"
	)
	ensureEndpoint(t, db, moved, "acme", "none")
	ensureEndpoint(t, db, kept, "acme", "none")
	toMoved := insertEndpointDeadLetter(t, db, "acme", moved)
	toKept := insertEndpointDeadLetter(t, db, "acme", kept)
	mustExec(t, db, `UPDATE webhook_endpoints SET tenant = 'globex' WHERE id = $1::uuid`, moved)

	for _, args := range [][]string{{itoa(toMoved)}, {"--all-matching", "--endpoint-id", moved}} {
		r := runCLI(t, db.URL, append([]string{"dlq", "replay"}, args...)...)
		if r.code != 1 || !strings.Contains(r.stdout, "its endpoint "+moved+" now belongs to globex, not to the event's tenant (acme)") ||
			!strings.Contains(r.stdout, "replayed 0, skipped 1 of other tenants\n") {
			t.Errorf("dlq replay %v: exit %d:\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox`); n != 0 {
		t.Errorf("a replay to an endpoint now of another tenant wrote %d outbox rows", n)
	}
	if r := runCLI(t, db.URL, "dlq", "replay", itoa(toKept)); r.code != 0 || !strings.Contains(r.stdout, "replayed 1\n") {
		t.Errorf("replay to an endpoint of its tenant: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
}
