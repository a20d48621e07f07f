package sql_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestOutboxKeysBounded: a stream_id over 256 bytes or an endpoint_url over 2,048 is refused as
// it is written, the constraint named in the error (schema 21). Unbounded, a producer's event
// with a stream_id that fitted the stream index as an event but not as the delivery routing
// makes of it (its endpoint key 39 bytes longer) failed every routing statement of its batch,
// with every tenant's oldest events in it, at every lease's end. The upgrade rewrites a pending
// row's or a dead letter's longer stream_id to its SHA-256 (one stream stays one stream, in
// order) and dead-letters a pending row with a longer endpoint_url; the keys then fit the index,
// fan-out's included.
func TestOutboxKeysBounded(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigratedTo(t, 19)
	ctx := context.Background()
	exec := func(q string, args ...any) error { _, err := db.Pool.Exec(ctx, q, args...); return err }
	long := strings.Repeat("s", 2660)
	longURL := "https://hooks.example.com/" + strings.Repeat("p", 2100)
	// Rows breaking two constraints at once: each update is checked against all of them, so a
	// migration fixing one column at a time failed on these, and stayed undone.
	for _, q := range []string{
		`INSERT INTO webhook_outbox (event_type, payload, created_at, enqueued_at) VALUES ('both.times', '{}', '-infinity', '-infinity')`,
		`INSERT INTO webhook_outbox (event_type, payload, stream_id, created_at) VALUES ('long.and.early', '{}', $1, '-infinity')`,
		`INSERT INTO webhook_outbox (event_type, payload, stream_id, endpoint_url) VALUES ('long.url', '{}', $1, $2)`,
	} {
		args := []any{long, longURL}[:strings.Count(q, "$")]
		if err := exec(q, args...); err != nil {
			t.Fatalf("before schema 20: %v", err)
		}
	}
	for _, q := range []string{
		`INSERT INTO webhook_outbox (event_type, payload, stream_id, order_key) VALUES ('long.stream', '{}', $1, 1), ('long.stream', '{}', $1, 2)`,
		`INSERT INTO webhook_dead_letter (delivery_id, stream_id, event_type, payload, attempts, reason, enqueued_at)
		 VALUES (gen_random_uuid(), $1, 'long.stream', '{}', 1, 'test', now())`,
	} {
		if err := exec(q, long); err != nil {
			t.Fatalf("before schema 21: %v", err)
		}
	}
	if _, err := fluxsql.Migrate(ctx, db.Pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	var fixed int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_outbox WHERE event_type IN ('both.times', 'long.and.early')
		AND isfinite(created_at) AND isfinite(enqueued_at) AND octet_length(stream_id) IS DISTINCT FROM 2660`).Scan(&fixed); err != nil || fixed != 2 {
		t.Errorf("%d of the 2 rows breaking two constraints fixed (%v)", fixed, err)
	}
	hashed := fmt.Sprintf("sha256:%x", sha256Sum(long))
	var streams []string
	rows, err := db.Pool.Query(ctx, `(SELECT stream_id FROM webhook_outbox WHERE event_type = 'long.stream' ORDER BY order_key)
		UNION ALL SELECT stream_id FROM webhook_dead_letter WHERE event_type = 'long.stream'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(streams) != 3 || streams[0] != hashed || streams[1] != hashed || streams[2] != hashed {
		t.Errorf("long stream ids after the upgrade = %q, want all three %q", streams, hashed)
	}
	var reason, dlStream string
	if err := db.Pool.QueryRow(ctx, `SELECT reason, stream_id FROM webhook_dead_letter WHERE event_type = 'long.url'`).Scan(&reason, &dlStream); err != nil ||
		!strings.Contains(reason, "over the limit of 2048") || dlStream != hashed {
		t.Errorf("the row with a long endpoint_url: dead letter %q, stream %q, %v; want one naming the limit, its stream id hashed", reason, dlStream, err)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_outbox WHERE event_type = 'long.url'`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d rows with a long endpoint_url left in the queue (%v), want none", left, err)
	}

	for _, c := range []struct {
		q, constraint string
		arg           string
	}{
		{`INSERT INTO webhook_outbox (event_type, payload, stream_id) VALUES ('x', '{}', $1)`, "webhook_outbox_stream_id_length", strings.Repeat("s", 257)},
		{`INSERT INTO webhook_outbox (event_type, payload, endpoint_url) VALUES ('x', '{}', $1)`, "webhook_outbox_endpoint_url_length", "https://h.example/" + strings.Repeat("p", 2031)},
	} {
		var pe *pgconn.PgError
		if err := exec(c.q, c.arg); !errors.As(err, &pe) || pe.Code != "23514" || pe.ConstraintName != c.constraint {
			t.Errorf("%s with %d bytes: %v; want a check violation of %s", c.q, len(c.arg), err, c.constraint)
		}
	}
	// At the limits, an event and each delivery fan-out makes of it fit the stream index.
	if _, err := fluxsql.EnsureStreamIndex(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := exec(`INSERT INTO webhook_outbox (event_type, payload, stream_id, endpoint_url) VALUES ('x', '{}', $1, $2)`,
		randomText(256), "https://h.example/"+randomText(2030)); err != nil {
		t.Errorf("a row at both limits: %v", err)
	}
	if err := exec(`INSERT INTO webhook_outbox (event_type, payload, stream_id, endpoint_id, routed_at, order_key)
		VALUES ('x', '{}', $1, gen_random_uuid(), now(), 1)`, randomText(256)); err != nil {
		t.Errorf("a delivery of a managed endpoint with a 256-byte stream id: %v", err)
	}
}

// TestUpgradeSeesARowCommittedDuringIt: a producer's row at '-infinity' whose transaction
// commits while the upgrade waits for the outbox's lock is made due by it. Schema 20 made such
// rows due before adding its constraint and missed it: every claim's update of it then failed
// the constraint, and nothing was delivered.
func TestUpgradeSeesARowCommittedDuringIt(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigratedTo(t, 19)
	ctx := context.Background()
	producer, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Rollback(ctx)
	if _, err := producer.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, created_at) VALUES ('late', '{}', '-infinity')`); err != nil {
		t.Fatal(err)
	}
	var producerPID int
	if err := producer.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&producerPID); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() { _, err := fluxsql.Migrate(ctx, db.Pool); migrated <- err }()
	waitBlockedBy(t, db.Pool, producerPID)
	if err := producer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-migrated; err != nil {
		t.Fatalf("migrate: %v", err)
	}
	var due int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_outbox WHERE event_type = 'late' AND isfinite(created_at) AND created_at <= now()`).Scan(&due); err != nil || due != 1 {
		t.Errorf("the row committed during the upgrade: %d due (%v), want 1", due, err)
	}
	// And a claim's update of every pending row passes the constraints.
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET lease_until = now() WHERE NOT processed`); err != nil {
		t.Errorf("updating the pending rows after the upgrade: %v", err)
	}
}

// waitBlockedBy waits until some session of pool waits for a lock that pid holds.
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session waited for session %d's lock within 10 s", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBuiltinsQualifiedAgainstPlantedFunctions: a pg_sequence_last_value(text) or setval(text,
// bigint) planted in a schema on the session's path (one whose CREATE is not revoked) outranks
// the built-in, which takes a regclass, for a quoted sequence name. The insert trigger's
// functions run for every producer: they may not call the planted one. (The dispatcher's
// statements: TestClaimIgnoresPlantedBuiltins in stages/claim.)
func TestBuiltinsQualifiedAgainstPlantedFunctions(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	for _, q := range []string{
		`CREATE FUNCTION public.pg_sequence_last_value(text) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'planted pg_sequence_last_value ran'; END $$`,
		`CREATE FUNCTION public.setval(text, bigint) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'planted setval ran'; END $$`,
		`CREATE FUNCTION public.nextval(text) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'planted nextval ran'; END $$`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	before := db.EndpointsVersion(t)
	for _, q := range []string{
		`INSERT INTO webhook_outbox (event_type, payload) VALUES ('x', '{}')`,
		`SELECT webhook_outbox_notify_wanted()`,
		// The endpoints' version trigger runs for the API, the CLI and the dispatcher.
		`INSERT INTO webhook_endpoints (url, secret) VALUES ('https://x.example/', 'abc')`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Errorf("%s: %v", strings.SplitN(q, "\n", 2)[0], err)
		}
	}
	if after := db.EndpointsVersion(t); after <= before {
		t.Errorf("the endpoints' version stayed at %d after an endpoint was added", after)
	}
}

// TestStreamIndexIgnoresDecoys: an index named as the stream index (or its successor) on another
// table, in a schema later on the path, is not taken for it: EnsureStreamIndex builds the real
// one beside it and leaves it alone, and an older-form index is replaced all the same.
func TestStreamIndexIgnoresDecoys(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	for _, q := range []string{
		`CREATE SCHEMA decoy`,
		`CREATE TABLE decoy.t (a int, b int, c int)`,
		`CREATE INDEX webhook_outbox_stream_idx ON decoy.t (a, b, c)`,
		`CREATE INDEX webhook_outbox_stream_next_idx ON decoy.t (a, b, c)`,
		`UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'decoy.webhook_outbox_stream_idx'::regclass`,
		`CREATE INDEX webhook_outbox_stream_idx ON webhook_outbox (stream_id, (coalesce(order_key, id))) WHERE NOT processed AND stream_id IS NOT NULL`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "public, decoy"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if usable, err := fluxsql.StreamIndexUsable(ctx, pool); err != nil || !usable {
		t.Fatalf("StreamIndexUsable = %v, %v; want the older index usable", usable, err)
	}
	if built, err := fluxsql.EnsureStreamIndex(ctx, pool); err != nil || !built {
		t.Fatalf("EnsureStreamIndex = %v, %v; want the older index replaced", built, err)
	}
	var columns int
	if err := db.Pool.QueryRow(ctx, `SELECT i.indnkeyatts FROM pg_index i WHERE i.indisvalid
		AND i.indexrelid = 'public.webhook_outbox_stream_idx'::regclass AND i.indrelid = 'public.webhook_outbox'::regclass`).Scan(&columns); err != nil || columns != 3 {
		t.Errorf("the outbox's stream index: %d key columns (%v), want the current form's 3", columns, err)
	}
	// A relation of the outbox's own schema under the index's name: reported, not taken for
	// the index (CREATE INDEX IF NOT EXISTS passes over it without an error).
	same := sqltest.NewMigrated(t)
	for _, q := range []string{`CREATE TABLE public.d (x int)`, `CREATE INDEX webhook_outbox_stream_idx ON public.d (x)`} {
		if _, err := same.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if built, err := fluxsql.EnsureStreamIndex(ctx, same.Pool); err == nil || built {
		t.Errorf("EnsureStreamIndex beside another table's index of its name = %v, %v; want an error", built, err)
	}
	var decoys int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'decoy' AND c.relname IN ('webhook_outbox_stream_idx', 'webhook_outbox_stream_next_idx')`).Scan(&decoys); err != nil || decoys != 2 {
		t.Errorf("%d of the decoy schema's 2 indexes left (%v): another schema's index was dropped", decoys, err)
	}
}

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }

// randomText is n bytes of hex that PostgreSQL cannot compress: an index tuple holds it whole.
func randomText(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}
