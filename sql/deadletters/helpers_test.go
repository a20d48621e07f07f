package deadletters_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// Two tenants' endpoints, and one without a tenant.
const (
	acmeEndpoint   = "aaaaaaaa-0000-4000-8000-00000000000a"
	acmeOther      = "aaaaaaaa-0000-4000-8000-00000000000b"
	globexEndpoint = "bbbbbbbb-0000-4000-8000-00000000000a"
	plainEndpoint  = "cccccccc-0000-4000-8000-00000000000a"
)

func ptr[T any](v T) *T { return &v }

var (
	acme   = ptr("acme")
	globex = ptr("globex")
)

// setup returns a migrated database with the endpoints above, all enabled.
func setup(t *testing.T) *sqltest.DB {
	t.Helper()
	db := sqltest.NewMigrated(t)
	for _, e := range []struct{ id, tenant string }{
		{acmeEndpoint, "acme"}, {acmeOther, "acme"}, {globexEndpoint, "globex"}, {plainEndpoint, ""},
	} {
		exec(t, db, `INSERT INTO webhook_endpoints (id, url, secret, tenant)
			VALUES ($1::uuid, 'https://consumer.example/' || $1, 'fixture-secret', nullif($2, ''))`, e.id, e.tenant)
	}
	return db
}

func exec(t *testing.T, db *sqltest.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func count(t *testing.T, db *sqltest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// fixture is the part of a dead letter a test chooses.
type fixture struct {
	tenant    *string
	endpoint  string // "" for none
	eventType string
	reason    string
	failedAgo time.Duration
	replayed  bool
	delivery  string // "" for a new one
}

// insert adds a dead letter and returns its id.
func insert(t *testing.T, db *sqltest.DB, f fixture) int64 {
	t.Helper()
	if f.eventType == "" {
		f.eventType = "invoice.paid"
	}
	if f.reason == "" {
		f.reason = "attempts exhausted"
	}
	var id int64
	err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, reason, enqueued_at, failed_at,
		                                 replayed_at, tenant, endpoint_id)
		VALUES (coalesce(nullif($1, '')::uuid, gen_random_uuid()), $2, '{"n": 1}', 3, $3,
		        now() - $4::bigint * interval '1 microsecond' - interval '1 minute',
		        now() - $4::bigint * interval '1 microsecond',
		        CASE WHEN $5 THEN now() - interval '1 second' END, $6, nullif($7, '')::uuid)
		RETURNING id`,
		f.delivery, f.eventType, f.reason, f.failedAgo.Microseconds(), f.replayed, f.tenant, f.endpoint).Scan(&id)
	if err != nil {
		t.Fatalf("inserting dead letter: %v", err)
	}
	return id
}

// sent counts the events re-enqueued to the outbox, per delivery id: what replays sent.
func sent(t *testing.T, db *sqltest.DB) map[string]int {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(),
		`SELECT delivery_id::text, count(*) FROM webhook_outbox WHERE attempt = 1 GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var d string
		var n int
		if err := rows.Scan(&d, &n); err != nil {
			t.Fatal(err)
		}
		out[d] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func itoa(id int64) string { return strconv.FormatInt(id, 10) }

// deliveryOf returns a dead letter's delivery id.
func deliveryOf(t *testing.T, db *sqltest.DB, id int64) string {
	t.Helper()
	var d string
	if err := db.Pool.QueryRow(context.Background(), `SELECT delivery_id::text FROM webhook_dead_letter WHERE id = $1`, id).Scan(&d); err != nil {
		t.Fatal(err)
	}
	return d
}
