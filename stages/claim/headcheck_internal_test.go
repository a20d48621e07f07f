package claim

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestHeadCheckReadsOnlyItsEndpoint: the head check of a delivery to one endpoint reads that
// endpoint's rows of its stream and the stream's unrouted events, not the rows another
// endpoint of the stream has waiting. Here 20,000 rows wait, parked, for a down endpoint A, and
// ten deliveries of the same stream are due for a healthy endpoint B: keyed by stream alone,
// the stream index made each of B's head checks read all 20,000 of A's rows (1.3 s for a claim
// past 100 such deliveries behind 20,000). Counted in buffers read by the claim statement, in
// a transaction rolled back.
func TestHeadCheckReadsOnlyItsEndpoint(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	db := sqltest.NewMigrated(t)
	if _, err := fluxsql.EnsureStreamIndex(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	const a, b = "6f2a3c1e-0000-4000-8000-0000000000c1", "6f2a3c1e-0000-4000-8000-0000000000c2"
	for _, q := range []string{
		`INSERT INTO webhook_endpoints (id, url, secret, ordering) VALUES
			('` + a + `', 'http://127.0.0.1:9/a', 's', 'stream'), ('` + b + `', 'http://127.0.0.1:9/b', 's', 'stream')`,
		`INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key, created_at, deferred_reason)
			SELECT 's', 'e', '{}', '` + a + `', now(), g, now() + interval '1 hour', 'behind its stream' FROM generate_series(1, 20000) g`,
		`INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key, created_at)
			SELECT 's', 'e', '{}', '` + b + `', now(), 20000 + g, now() - interval '1 minute' FROM generate_series(1, 10) g`,
		`ANALYZE webhook_outbox`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	c := New(db.Pool, "me", time.Minute)
	c.SetOrdering(Ordering{Active: true, Horizon: math.MaxInt64, Routed: true})
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []struct {
		Plan struct {
			SharedHit  int64 `json:"Shared Hit Blocks"`
			SharedRead int64 `json:"Shared Read Blocks"`
		}
	}
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+c.statement(),
		c.args(100, Skip{}, false, Cursor{}, 1, false)...).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("EXPLAIN output %s: %v", raw, err)
	}
	var claimed int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhook_outbox WHERE leased_by = 'me'`).Scan(&claimed); err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	if claimed != 1 {
		t.Fatalf("the claim took %d rows, want B's head alone", claimed)
	}
	if read := plan[0].Plan.SharedHit + plan[0].Plan.SharedRead; read > 600 {
		t.Errorf("the claim read %d buffers for B's ten deliveries; its head checks read A's waiting rows", read)
	}
}
