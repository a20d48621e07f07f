package main

import (
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// insertStatusFixtures fills the outbox, the dead-letter table and the dispatcher table with
// one row of every kind status distinguishes.
func insertStatusFixtures(t *testing.T, db *sqltest.DB) {
	t.Helper()
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, created_at, attempt, lease_until, leased_by, processed, processed_at) VALUES
		('due.old',      '{}', now() - interval '10 minutes', 1, NULL, NULL, false, NULL),            -- backlog, oldest
		('due.new',      '{}', now() - interval '1 second',   1, NULL, NULL, false, NULL),            -- backlog
		('expired',      '{}', now() - interval '2 minutes',  1, now() - interval '1 minute', 'gone', false, NULL), -- backlog: lease expired
		('retry.due',    '{}', now() - interval '5 seconds',  3, NULL, NULL, false, NULL),            -- backlog and retry
		('leased',       '{}', now() - interval '1 hour',     1, now() + interval '1 minute', 'd1', false, NULL), -- in flight
		('retry.later',  '{}', now() + interval '1 hour',     2, NULL, NULL, false, NULL),            -- scheduled and retry
		('done.recent',  '{}', now() - interval '5 minutes',  1, NULL, NULL, true, now() - interval '4 minutes'),
		('done.recent2', '{}', now() - interval '5 minutes',  2, NULL, NULL, true, now() - interval '59 minutes'),
		('done.old',     '{}', now() - interval '3 hours',    1, NULL, NULL, true, now() - interval '2 hours')`)
	// Two rows held back by the gate, moved in place with their reason (scheduled, not retries).
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, created_at, enqueued_at, deferred_reason) VALUES
		('held.a', '{}', now() + interval '30 seconds', now() - interval '20 minutes', 'circuit breaker open'),
		('held.b', '{}', now() + interval '40 seconds', now() - interval '1 minute', 'circuit breaker open')`)
	mustExec(t, db, `INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, reason, enqueued_at, replayed_at) VALUES
		(gen_random_uuid(), 'a', '{}', 9, 'attempts exhausted', now(), NULL),
		(gen_random_uuid(), 'a', '{}', 9, 'attempts exhausted', now(), NULL),
		(gen_random_uuid(), 'a', '{}', 9, 'attempts exhausted', now(), now()),
		(gen_random_uuid(), 'b', '{}', 1, 'permanent: HTTP 404', now(), NULL)`)
	// A managed endpoint, disabled, with one delivery pending; and an event that matched none.
	mustExec(t, db, `INSERT INTO webhook_endpoints (id, url, secret, enabled, disabled_reason, tenant)
		VALUES ('6f2a3c1e-0000-4000-8000-000000000001', 'https://hooks.example/in?token=t0p', 'sekrit-9f', false, 'the endpoint answered 410 Gone', 'acme')`)
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, created_at, endpoint_id, routed_at) VALUES
		('routed', '{}', now() + interval '1 hour', '6f2a3c1e-0000-4000-8000-000000000001', now())`)
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, processed, processed_at, error) VALUES
		('lonely', '{}', true, now(), 'no endpoint matched')`)
	mustExec(t, db, `INSERT INTO webhook_dispatcher (instance_id, armed, started_at, seen_at) VALUES
		('host-b', false, now() - interval '1 hour', now() - interval '2 seconds'),
		('host-a', true,  now() - interval '2 hours', now())`)
	// host-a is idle: producers notify for the next minute.
	mustExec(t, db, `SELECT setval('webhook_outbox_notify_until', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 60000)`)
}

// TestStatusCappedCount: a count that stopped at its cap reads as a bound ("more than N",
// "at least N"), one under it as the plain number. (Where the counts stop is tested with
// status.Read, in internal/status.)
func TestStatusCappedCount(t *testing.T) {
	t.Parallel()
	if got, want := cappedCount("more than", 1000000, true), "more than 1000000 (status counts no further)"; got != want {
		t.Errorf("cappedCount = %q, want %q", got, want)
	}
	if got := cappedCount("at least", 7, false); got != "7" {
		t.Errorf("cappedCount(7, false) = %q", got)
	}
}

func TestStatusJSON(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	insertStatusFixtures(t, db)

	r := runCLI(t, db.URL, "status", "--json")
	if r.code != 0 {
		t.Fatalf("status --json exited %d: %s", r.code, r.stderr)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status --json printed %q: %v", r.stdout, err)
	}
	if rep.SchemaVersion != fluxsql.LatestVersion() || rep.DatabaseTime.IsZero() {
		t.Errorf("schema_version=%d database_time=%v", rep.SchemaVersion, rep.DatabaseTime)
	}
	got := map[string]int64{
		"backlog": rep.Backlog, "in_flight": rep.InFlight, "retries_pending": rep.RetriesPending,
		"scheduled": rep.Scheduled, "processed_last_hour": rep.ProcessedLastHour,
		"dead_letters": rep.DeadLetters, "dead_letters_not_replayed": rep.DeadLettersNotReplayed,
	}
	want := map[string]int64{
		"backlog": 4, "in_flight": 1, "retries_pending": 2, "scheduled": 4, "processed_last_hour": 3,
		"dead_letters": 4, "dead_letters_not_replayed": 3,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("counts = %v\nwant     %v", got, want)
	}
	// The leased row is older but in flight: the age is the oldest row waiting to be claimed.
	if rep.OldestDueAgeSeconds < 600 || rep.OldestDueAgeSeconds > 660 {
		t.Errorf("oldest_due_age_seconds = %.1f, want about 600", rep.OldestDueAgeSeconds)
	}
	if len(rep.Deferred) != 1 || rep.Deferred[0].Reason != "circuit breaker open" || rep.Deferred[0].Count != 2 ||
		rep.Deferred[0].NextDueSeconds < 20 || rep.Deferred[0].NextDueSeconds > 31 {
		t.Errorf("deferred_by_reason = %+v, want 2 rows for the open circuit, next due in about 30 s", rep.Deferred)
	}
	// The deferred row's event was first enqueued 20 minutes ago: older than anything due.
	if rep.OldestUndeliveredAgeSeconds < 1200 || rep.OldestUndeliveredAgeSeconds > 1260 {
		t.Errorf("oldest_undelivered_age_seconds = %.1f, want about 1200", rep.OldestUndeliveredAgeSeconds)
	}
	if len(rep.Endpoints) != 1 || rep.Endpoints[0].URL != "https://hooks.example/in?…" || rep.Endpoints[0].Pending != 1 ||
		rep.Endpoints[0].Enabled || rep.Endpoints[0].DisabledReason != "the endpoint answered 410 Gone" || rep.Endpoints[0].Tenant != "acme" {
		t.Errorf("endpoints = %+v", rep.Endpoints)
	}
	if rep.UnroutedLastHour != 1 {
		t.Errorf("unrouted_last_hour = %d, want 1", rep.UnroutedLastHour)
	}
	if strings.Contains(r.stdout, "sekrit-9f") || strings.Contains(r.stdout, "t0p") {
		t.Error("status prints an endpoint's secret or its URL's query string")
	}
	wantReasons := []deadLetterReason{{Reason: "attempts exhausted", Count: 3, NotReplayed: 2}, {Reason: "permanent: HTTP 404", Count: 1, NotReplayed: 1}}
	if !reflect.DeepEqual(rep.DeadLettersByReason, wantReasons) {
		t.Errorf("dead_letters_by_reason = %+v, want %+v", rep.DeadLettersByReason, wantReasons)
	}
	if len(rep.Dispatchers) != 2 || rep.Dispatchers[0].InstanceID != "host-a" || !rep.Dispatchers[0].Armed ||
		rep.Dispatchers[1].Armed || rep.Dispatchers[1].SeenAgeSeconds < 2 {
		t.Errorf("dispatchers = %+v", rep.Dispatchers)
	}

	if rep.NotifySecondsLeft < 50 || rep.NotifySecondsLeft > 60 {
		t.Errorf("notify_seconds_left = %.1f, want about 60", rep.NotifySecondsLeft)
	}

	// The field names are what monitoring scripts depend on.
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range raw {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	wantKeys := []string{"backlog", "breakers", "breakers_note", "database_time", "dead_letters", "dead_letters_by_reason", "dead_letters_not_replayed",
		"deferred_by_reason", "dispatchers", "endpoints", "in_flight", "notify_seconds_left", "oldest_due_age_seconds", "oldest_undelivered_age_seconds",
		"outbox_id_sequence_cache", "processed_last_hour", "processed_last_hour_capped", "retries_pending", "scheduled", "schema_version",
		"stream_rows_beyond_sequence", "unrouted_last_hour",
		"unrouted_last_hour_capped"}
	if !slices.Equal(keys, wantKeys) {
		t.Errorf("JSON fields = %v\nwant          %v", keys, wantKeys)
	}
	d := raw["dispatchers"].([]any)[0].(map[string]any)
	for _, k := range []string{"instance_id", "armed", "started_at", "seen_at", "seen_age_seconds", "stale"} {
		if _, ok := d[k]; !ok {
			t.Errorf("dispatcher object lacks %q: %v", k, d)
		}
	}
}

// TestStatusMarksStaleDispatchers: an instance whose last heartbeat is older than
// dispatcherStaleAfter (90 s) is stale and not armed, whatever its row's flag says (it was
// kill -9'd armed); one that beat within the bound is reported as its row says.
func TestStatusMarksStaleDispatchers(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	mustExec(t, db, `INSERT INTO webhook_dispatcher (instance_id, armed, started_at, seen_at) VALUES
		('a-live',  true,  now() - interval '1 hour', now() - interval '5 seconds'),
		('b-slow',  true,  now() - interval '1 hour', now() - interval '80 seconds'),  -- within the bound
		('c-dead',  true,  now() - interval '1 hour', now() - interval '2 minutes'),   -- killed while armed
		('d-gone',  false, now() - interval '1 hour', now() - interval '4 minutes')`)
	type want struct{ armed, stale bool }
	wants := map[string]want{"a-live": {true, false}, "b-slow": {true, false}, "c-dead": {false, true}, "d-gone": {false, true}}

	r := runCLI(t, db.URL, "status", "--json")
	if r.code != 0 {
		t.Fatalf("status --json exited %d: %s", r.code, r.stderr)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status --json printed %q: %v", r.stdout, err)
	}
	if len(rep.Dispatchers) != len(wants) {
		t.Fatalf("dispatchers = %+v, want %d", rep.Dispatchers, len(wants))
	}
	for _, d := range rep.Dispatchers {
		if w := wants[d.InstanceID]; d.Armed != w.armed || d.Stale != w.stale {
			t.Errorf("%s: armed=%v stale=%v (seen %.0f s ago), want armed=%v stale=%v", d.InstanceID, d.Armed, d.Stale, d.SeenAgeSeconds, w.armed, w.stale)
		}
	}
	if d := rep.Dispatchers[2]; d.InstanceID != "c-dead" || d.SeenAgeSeconds < 120 || d.SeenAgeSeconds > 180 {
		t.Errorf("c-dead: seen_age_seconds %.1f, want about 120 (its last heartbeat)", d.SeenAgeSeconds)
	}

	text := runCLI(t, db.URL, "status")
	if text.code != 0 {
		t.Fatalf("status exited %d: %s", text.code, text.stderr)
	}
	if !strings.Contains(text.stdout, "INSTANCE  ARMED  STALE  STARTED") {
		t.Errorf("no STALE column in:\n%s", text.stdout)
	}
	for _, l := range strings.Split(text.stdout, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		if w, ok := wants[f[0]]; ok {
			if f[1] != yesNo(w.armed) || f[2] != yesNo(w.stale) {
				t.Errorf("line %q: ARMED %s STALE %s, want %s %s", l, f[1], f[2], yesNo(w.armed), yesNo(w.stale))
			}
			delete(wants, f[0])
		}
	}
	if len(wants) != 0 {
		t.Errorf("instances missing from the text output: %v\n%s", wants, text.stdout)
	}
	if !strings.Contains(text.stdout, "stale: no heartbeat for over 1m30s") {
		t.Errorf("the text output does not explain stale:\n%s", text.stdout)
	}
}

func TestStatusJSONOnAnEmptyOutbox(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)

	r := runCLI(t, db.URL, "status", "--json")
	if r.code != 0 {
		t.Fatalf("status --json exited %d: %s", r.code, r.stderr)
	}
	// Lists are [] and the age is 0, never null: scripts can index and compare without checks.
	for _, want := range []string{`"backlog": 0`, `"oldest_due_age_seconds": 0`, `"dead_letters_by_reason": []`, `"dispatchers": []`, `"notify_seconds_left": 0`,
		`"outbox_id_sequence_cache": 1`, `"stream_rows_beyond_sequence": 0`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status --json lacks %s:\n%s", want, r.stdout)
		}
	}
}

func TestStatusHumanReadable(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	insertStatusFixtures(t, db)

	r := runCLI(t, db.URL, "status")
	if r.code != 0 {
		t.Fatalf("status exited %d: %s", r.code, r.stderr)
	}
	lines := strings.Split(r.stdout, "\n")
	field := func(label string) []string {
		for _, l := range lines {
			if rest, ok := strings.CutPrefix(l, label); ok && strings.HasPrefix(rest, " ") {
				return strings.Fields(rest)
			}
		}
		t.Errorf("no %q line in:\n%s", label, r.stdout)
		return []string{""}
	}
	for label, want := range map[string]string{
		"backlog": "4", "in-flight leases": "1", "retries pending": "2", "scheduled": "4",
		"processed last hour": "3", "dead letters": "4", "oldest due age": "10m0s", "producers notify": "yes",
		"oldest undelivered": "20m0s", "  deferred": "2",
	} {
		if got := field(label)[0]; got != want {
			t.Errorf("%s = %q, want %q", label, got, want)
		}
	}
	// Values line up in one column (the first line is the schema version).
	col := strings.Index(lines[0], strconv.Itoa(fluxsql.LatestVersion()))
	for _, l := range lines[:9] {
		if len(l) <= col || l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("value not at column %d: %q", col, l)
		}
	}
	for _, want := range []string{"attempts exhausted", "permanent: HTTP 404", "host-a", "host-b", "INSTANCE", "circuit breaker open; next due in"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}
	// Both instances beat recently: none is stale, and the note that explains stale is left out.
	if strings.Contains(r.stdout, "stale:") {
		t.Errorf("status explains stale instances when none is:\n%s", r.stdout)
	}
}

func TestStatusRefusesAnOutdatedSchema(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)

	r := runCLI(t, db.URL, "status", "--json")
	if r.code != 1 || !strings.Contains(r.stderr, "fluxhook migrate") || r.stdout != "" {
		t.Fatalf("status on an unmigrated database: exit %d, stdout %q, stderr %q; want 1 and the migrate hint", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, db.URL, "status", "extra"); r.code != 2 {
		t.Errorf("status with an argument exited %d, want 2", r.code)
	}
}

// TestStatusShowsStoppedStreams: the heads of ordered streams stopped at a dead letter (parked
// at 'infinity') are listed as deferred under one reason without a due time, in text and JSON,
// and do not break the scheduled-row arithmetic.
func TestStatusShowsStoppedStreams(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO webhook_outbox
		(stream_id, event_type, payload, created_at, order_key, deferred_reason)
		VALUES ('s1', 'stream.updated', '{}', 'infinity', 1, 'stream stopped: permanent failure: HTTP 410'),
		       ('s2', 'stream.updated', '{}', 'infinity', 2, 'stream stopped: permanent failure: HTTP 400')`); err != nil {
		t.Fatal(err)
	}
	text := runCLI(t, db.URL, "status")
	if text.code != 0 {
		t.Fatalf("status exited %d: %s", text.code, text.stderr)
	}
	if !strings.Contains(text.stdout, "ordered stream stopped at a dead letter (replay or purge it)\n") {
		t.Errorf("status does not list the two stopped streams:\n%s", text.stdout)
	}
	js := runCLI(t, db.URL, "status", "--json")
	if js.code != 0 {
		t.Fatalf("status --json exited %d: %s", js.code, js.stderr)
	}
	var rep struct {
		Deferred []struct {
			Reason  string  `json:"reason"`
			Count   int64   `json:"count"`
			NextDue float64 `json:"next_due_seconds"`
		} `json:"deferred_by_reason"`
	}
	if err := json.Unmarshal([]byte(js.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Deferred) != 1 || rep.Deferred[0].Count != 2 || rep.Deferred[0].NextDue != -1 ||
		!strings.Contains(rep.Deferred[0].Reason, "stopped") {
		t.Errorf("deferred_by_reason = %+v, want the two stopped streams under one reason, next due -1", rep.Deferred)
	}
}

// TestStatusShowsStreamRowsBeyondTheSequence: a stream row whose id a producer supplied beyond
// the id sequence never passes ordered delivery's hold-back until the sequence reaches it, and
// a sequence cache above 1 breaks the hold-back's assumption; status shows both (the
// dispatcher's metric and log are not all an operator looks at), and neither when all is well.
func TestStatusShowsStreamRowsBeyondTheSequence(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES ('s1', 'a.b', '{}')`); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, db.URL, "status"); r.code != 0 || strings.Contains(r.stdout, "beyond id sequence") || strings.Contains(r.stdout, "sequence cache") {
		t.Fatalf("status with every id drawn from the sequence: exit %d, output:\n%s", r.code, r.stdout)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (id, stream_id, event_type, payload) VALUES (1000000, 's1', 'a.b', '{}');
		ALTER SEQUENCE webhook_outbox_id_seq CACHE 20`); err != nil {
		t.Fatal(err)
	}
	text := runCLI(t, db.URL, "status")
	if text.code != 0 {
		t.Fatalf("status exited %d: %s", text.code, text.stderr)
	}
	for _, want := range []string{`(?m)^rows beyond id sequence +1 +stream rows with ids supplied by a producer`, `(?m)^id sequence cache +20 +ordered delivery needs 1: ALTER SEQUENCE webhook_outbox_id_seq CACHE 1$`} {
		if !regexp.MustCompile(want).MatchString(text.stdout) {
			t.Errorf("status output does not match %s:\n%s", want, text.stdout)
		}
	}
	js := runCLI(t, db.URL, "status", "--json")
	var rep struct {
		Cache  int64 `json:"outbox_id_sequence_cache"`
		Beyond int64 `json:"stream_rows_beyond_sequence"`
	}
	if err := json.Unmarshal([]byte(js.stdout), &rep); err != nil {
		t.Fatalf("status --json: %v (exit %d, %s)", err, js.code, js.stderr)
	}
	if rep.Cache != 20 || rep.Beyond != 1 {
		t.Errorf("status --json: cache %d, rows beyond %d; want 20 and 1", rep.Cache, rep.Beyond)
	}
}
