package sql_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestProducerCannotSetRoutingColumns inserts, as a producer with the documented grant
// (INSERT on the outbox, nothing else), rows that set each column the dispatcher routes and
// leases by: every one is refused with an error naming the column, even with the
// fluxhook.dispatcher setting a producer may set, and nothing is written. A plain event still
// inserts, and a role that may UPDATE the outbox (the dispatcher, an operator's replay) still
// writes delivery rows with those columns set.
func TestProducerCannotSetRoutingColumns(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	producer, dispatcher := sqltest.NewRole(t, db), sqltest.NewRole(t, db)
	for _, stmt := range []string{
		`GRANT INSERT ON webhook_outbox TO ` + producer,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON webhook_outbox TO ` + dispatcher,
		`INSERT INTO webhook_endpoints (id, url, secret, tenant, event_types)
			VALUES ('00000000-0000-0000-0000-00000000aced', 'https://acme.example/hooks', 's', 'acme', '{acme.*}')`,
	} {
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	prod := sqltest.ConnectAs(t, db, producer)
	disp := sqltest.ConnectAs(t, db, dispatcher)

	const ep = `'00000000-0000-0000-0000-00000000aced'`
	forged := []struct{ column, value string }{
		{"endpoint_id", ep},
		{"routed_at", "now()"},
		{"order_key", "1"},
		{"lease_until", "now() + interval '1 hour'"},
		{"leased_by", "'someone'"},
		{"lease_token", "7"},
		{"attempt", "2"},                            // taken for a retry, it was never routed and went to WEBHOOK_URL whatever its tenant
		{"enqueued_at", "now() + interval '1 day'"}, // it reached endpoints created after it
	}
	for _, f := range forged {
		for _, dispatcherSetting := range []bool{false, true} {
			err := pgx.BeginFunc(ctx, prod, func(tx pgx.Tx) error {
				if dispatcherSetting {
					if _, err := tx.Exec(ctx, `SET LOCAL fluxhook.dispatcher = on`); err != nil {
						return err
					}
				}
				_, err := tx.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, `+f.column+`)
					VALUES ('billing.forged', '{}', `+f.value+`)`)
				return err
			})
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(pgErr.Message, f.column) ||
				!strings.Contains(pgErr.Hint, "without these columns") {
				t.Errorf("producer insert with %s set (fluxhook.dispatcher %v) = %v, want insufficient_privilege naming %s with a hint",
					f.column, dispatcherSetting, err, f.column)
			}
		}
	}
	// Every column at once, as the review's row did, named together.
	_, err := prod.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, endpoint_id, routed_at, order_key)
		VALUES ('billing.forged', '{}', `+ep+`, now(), 1)`)
	if err == nil || !strings.Contains(err.Error(), "endpoint_id, routed_at, order_key") {
		t.Errorf("producer insert with endpoint_id, routed_at and order_key = %v, want them named", err)
	}
	// COPY fires the same trigger.
	_, err = prod.CopyFrom(ctx, pgx.Identifier{"webhook_outbox"}, []string{"event_type", "payload", "endpoint_id"},
		pgx.CopyFromRows([][]any{{"billing.forged", "{}", "00000000-0000-0000-0000-00000000aced"}}))
	if err == nil || !strings.Contains(err.Error(), "endpoint_id") {
		t.Errorf("producer COPY with endpoint_id = %v, want it refused", err)
	}

	if _, err := prod.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, tenant, stream_id, endpoint_url)
		VALUES ('acme.ok', '{}', 'acme', 's', 'https://x.example/')`); err != nil {
		t.Fatalf("producer insert of a plain event: %v", err)
	}
	if _, err := disp.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, tenant, endpoint_id, routed_at, order_key,
		lease_until, leased_by, lease_token) VALUES ('acme.ok', '{}', 'acme', `+ep+`, now(), 1, now(), 'd', 1)`); err != nil {
		t.Fatalf("dispatcher insert of a delivery row: %v", err)
	}
	var forgedRows, plain, deliveries int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE event_type = 'billing.forged'),
		count(*) FILTER (WHERE event_type = 'acme.ok' AND endpoint_id IS NULL),
		count(*) FILTER (WHERE event_type = 'acme.ok' AND endpoint_id IS NOT NULL) FROM webhook_outbox`).
		Scan(&forgedRows, &plain, &deliveries); err != nil {
		t.Fatal(err)
	}
	if forgedRows != 0 || plain != 1 || deliveries != 1 {
		t.Fatalf("outbox holds %d forged, %d plain and %d delivery rows; want 0, 1, 1", forgedRows, plain, deliveries)
	}
}
