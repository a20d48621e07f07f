package sql_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestOutboxTimesFinite: a row due or enqueued at '-infinity', which no client time type
// holds (the claim that took one failed as it read it, each lease's end bringing it back with
// the oldest due rows, none delivered), is refused as it is written, the constraint named in
// the error; 'infinity' stays a due time (the dispatcher parks a stopped stream's rows there).
// Schema 20 makes the pending rows already written so due now, and leaves the others.
func TestOutboxTimesFinite(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigratedTo(t, 19)
	ctx := context.Background()
	exec := func(q string) error { _, err := db.Pool.Exec(ctx, q); return err }
	count := func(q string) int {
		var n int
		if err := db.Pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	for _, q := range []string{
		`INSERT INTO webhook_outbox (event_type, payload, created_at) VALUES ('due.never', '{}', '-infinity')`,
		`INSERT INTO webhook_outbox (event_type, payload, enqueued_at) VALUES ('enqueued.never', '{}', '-infinity')`,
		`INSERT INTO webhook_outbox (event_type, payload, created_at, processed) VALUES ('done.before', '{}', '-infinity', true)`,
	} {
		if err := exec(q); err != nil {
			t.Fatalf("before schema 20: %v", err)
		}
	}
	if _, err := fluxsql.Migrate(ctx, db.Pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if n := count(`SELECT count(*) FROM webhook_outbox WHERE NOT processed AND isfinite(created_at) AND isfinite(enqueued_at)
		AND created_at <= now() AND enqueued_at <= now()`); n != 2 {
		t.Errorf("%d of the 2 pending rows at -infinity are due now after the upgrade", n)
	}
	if n := count(`SELECT count(*) FROM webhook_outbox WHERE processed AND created_at = '-infinity'`); n != 1 {
		t.Errorf("the processed row was changed")
	}
	for _, q := range []string{
		`INSERT INTO webhook_outbox (event_type, payload, created_at) VALUES ('due.never', '{}', '-infinity')`,
		`INSERT INTO webhook_outbox (event_type, payload, enqueued_at) VALUES ('enqueued.never', '{}', '-infinity')`,
		`UPDATE webhook_outbox SET created_at = '-infinity' WHERE NOT processed`,
	} {
		var pe *pgconn.PgError
		if err := exec(q); !errors.As(err, &pe) || pe.Code != "23514" || pe.ConstraintName != "webhook_outbox_times_finite" {
			t.Errorf("%s: %v; want a check violation of webhook_outbox_times_finite", q, err)
		}
	}
	if err := exec(`INSERT INTO webhook_outbox (event_type, payload, created_at) VALUES ('parked', '{}', 'infinity')`); err != nil {
		t.Errorf("a row due at 'infinity': %v", err)
	}
}
