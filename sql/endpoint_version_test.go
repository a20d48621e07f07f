package sql_test

import (
	"context"
	"slices"
	"testing"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestEveryColumnTheDispatcherUsesBumpsTheVersion pins the version triggers
// (webhook_endpoints_changed, webhook_endpoints_changed_update): a dispatcher reloads its
// endpoint cache only when webhook_endpoints_version moves, so an UPDATE of one column it
// routes, signs or sends by that moved nothing would go unseen until the periodic re-read
// (30 s), with events routed or sent by the old value meanwhile. Each case changes one column
// alone, by SQL, and asserts the version moved; the columns the dispatchers write themselves
// on every outcome (last_success_at, failing_since), and those the cache compares without
// (description, disabled_at), must not move it, or every healthy endpoint would make every
// instance reload. Every column of webhook_endpoints must be one case or the other, so that a
// column added later without a thought for the trigger fails here.
func TestEveryColumnTheDispatcherUsesBumpsTheVersion(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	var id string
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, event_types, previous_secret,
		previous_secret_expires_at, retry_rps, max_concurrency)
		VALUES ('https://a.example/hooks', 's1', '{stream.*}', 'old', now() + interval '1 hour', 5, 3)
		RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	version := func() int64 { return db.EndpointsVersion(t) }
	cases := []struct {
		column string
		set    string // the SET clause: this column alone, to a value other than its current one
		bumps  bool
	}{
		{"url", "url = 'https://b.example/hooks'", true},
		{"tenant", "tenant = 'acme'", true},
		{"event_types", "event_types = '{payment.*}'", true},
		{"scheme", "scheme = 'standard'", true},
		{"secret", "secret = 's2'", true},
		{"previous_secret", "previous_secret = 'older'", true},
		{"previous_secret_expires_at", "previous_secret_expires_at = now() + interval '2 hours'", true},
		{"enabled", "enabled = false", true},
		{"disabled_reason", "disabled_reason = 'maintenance'", true},
		{"retry_rps", "retry_rps = 7", true},
		{"max_concurrency", "max_concurrency = 4", true},
		{"headers", `headers = '{"X-Team": "streams"}'`, true},
		{"created_at", "created_at = created_at - interval '1 minute'", true},
		{"ordering", "ordering = 'stream'", true},
		{"ordering_failure", "ordering_failure = 'stop'", true},
		{"permanent_statuses", "permanent_statuses = '{404}'", true},
		{"permanent_statuses", "permanent_statuses = '{}'", true},
		{"permanent_statuses", "permanent_statuses = NULL", true},
		{"restricted", "restricted = true", true},
		{"last_success_at", "last_success_at = now()", false},
		{"failing_since", "failing_since = now()", false},
		{"description", "description = 'the streams team'", false},
		{"disabled_at", "disabled_at = now()", false},
		{"id", "id = gen_random_uuid()", true}, // last: the cases find the row by its id
	}
	// updated_at is the touch trigger's own.
	covered := []string{"updated_at"}
	for _, c := range cases {
		covered = append(covered, c.column)
		before := version()
		if _, err := db.Pool.Exec(ctx, `UPDATE webhook_endpoints SET `+c.set+` WHERE id = $1`, id); err != nil {
			t.Fatalf("%s: %v", c.set, err)
		}
		switch after := version(); {
		case c.bumps && after <= before:
			t.Errorf("UPDATE ... SET %s left webhook_endpoints_version at %d: a running dispatcher never reloads for a change of %s",
				c.set, after, c.column)
		case !c.bumps && after != before:
			t.Errorf("UPDATE ... SET %s moved webhook_endpoints_version (%d to %d): every dispatcher reloads for a column it does not use",
				c.set, before, after)
		}
	}
	rows, err := db.Pool.Query(ctx, `SELECT column_name::text FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'webhook_endpoints'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var col string
		if err := rows.Scan(&col); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(covered, col) {
			t.Errorf("column webhook_endpoints.%s is not covered: say here whether a change of it alone must move the endpoints' version", col)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The version triggers fire for logical replication and session_replication_role =
	// replica too (ENABLE ALWAYS, schema 10): a migration that re-creates one must enable it
	// so again (schema 13 re-created webhook_endpoints_changed_update).
	for _, trigger := range []string{"webhook_endpoints_changed", "webhook_endpoints_changed_update", "webhook_endpoints_truncated"} {
		var enabled string
		if err := db.Pool.QueryRow(ctx, `SELECT tgenabled::text FROM pg_trigger
			WHERE tgrelid = 'webhook_endpoints'::regclass AND tgname = $1`, trigger).Scan(&enabled); err != nil {
			t.Fatalf("trigger %s: %v", trigger, err)
		}
		if enabled != "A" {
			t.Errorf("trigger %s is enabled %q, want ALWAYS (A): a change by logical replication would not move the version", trigger, enabled)
		}
	}
	// Inserts and deletes bump too.
	before := version()
	if _, err := db.Pool.Exec(ctx, `DELETE FROM webhook_endpoints`); err != nil { // the one row, under its new id
		t.Fatal(err)
	}
	if after := version(); after <= before {
		t.Errorf("a DELETE left webhook_endpoints_version at %d", after)
	}
}
