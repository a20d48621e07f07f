package status

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/sqltest"
	fluxgate "github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
)

func mustExec(t *testing.T, db *sqltest.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("fixture %q: %v", sql, err)
	}
}

// insertLastHour fills the delivery log with 3 processed rows in the last hour, one of them
// an event that matched no endpoint, and one older row that the last hour does not count.
func insertLastHour(t *testing.T, db *sqltest.DB) {
	t.Helper()
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, created_at, attempt, processed, processed_at) VALUES
		('done.recent',  '{}', now() - interval '5 minutes',  1, true, now() - interval '4 minutes'),
		('done.recent2', '{}', now() - interval '5 minutes',  2, true, now() - interval '59 minutes'),
		('done.old',     '{}', now() - interval '3 hours',    1, true, now() - interval '2 hours')`)
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, processed, processed_at, error) VALUES
		('lonely', '{}', true, now(), 'no endpoint matched')`)
}

// TestStatusStopsCountingAtItsCap: the last hour's processed and unrouted counts stop at the
// cap, so that status reads a bounded part of the log at any rate, and say they stopped; at
// or under the cap they are exact. The fixtures hold 3 processed rows in the last hour, one
// of them unrouted.
func TestStatusStopsCountingAtItsCap(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	insertLastHour(t, db)
	for _, tc := range []struct {
		cap, processed, unrouted        int64
		processedCapped, unroutedCapped bool
	}{
		{cap: 3, processed: 3, unrouted: 1},
		{cap: 0, processed: 0, processedCapped: true, unroutedCapped: true},
	} {
		var rep Report
		err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) (err error) {
			rep, err = readStatus(context.Background(), tx, tc.cap)
			return err
		})
		if err != nil {
			t.Fatalf("cap %d: %v", tc.cap, err)
		}
		if rep.ProcessedLastHour != tc.processed || rep.ProcessedLastHourCapped != tc.processedCapped ||
			rep.UnroutedLastHour != tc.unrouted || rep.UnroutedLastHourCapped != tc.unroutedCapped {
			t.Errorf("cap %d: processed %d (capped %v), unrouted %d (capped %v); want %d (%v), %d (%v)", tc.cap,
				rep.ProcessedLastHour, rep.ProcessedLastHourCapped, rep.UnroutedLastHour, rep.UnroutedLastHourCapped,
				tc.processed, tc.processedCapped, tc.unrouted, tc.unroutedCapped)
		}
	}
	// Capped at 2 of the 3 rows, the unrouted count is whatever the 3 rows read hold: the
	// lonely event or not, at least 0, and never more than 1.
	var rep Report
	if err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) (err error) {
		rep, err = readStatus(context.Background(), tx, 2)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if rep.ProcessedLastHour != 2 || !rep.ProcessedLastHourCapped || !rep.UnroutedLastHourCapped || rep.UnroutedLastHour > 1 {
		t.Errorf("cap 2: processed %d (capped %v), unrouted %d (capped %v); want 2 (true), at most 1 (true)",
			rep.ProcessedLastHour, rep.ProcessedLastHourCapped, rep.UnroutedLastHour, rep.UnroutedLastHourCapped)
	}
}

// TestStatusReadWithZeroOptions: the zero Options read PostgreSQL only, count up to
// DefaultCountCap (the 3 rows exactly), say the breakers are in-process, and leave every
// list empty rather than nil, so that the JSON has [] for scripts to index.
func TestStatusReadWithZeroOptions(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	insertLastHour(t, db)
	rep, err := Read(context.Background(), db.Pool, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ProcessedLastHour != 3 || rep.ProcessedLastHourCapped || rep.UnroutedLastHour != 1 {
		t.Errorf("processed %d (capped %v), unrouted %d; want 3 (false), 1", rep.ProcessedLastHour, rep.ProcessedLastHourCapped, rep.UnroutedLastHour)
	}
	if !strings.Contains(rep.BreakersNote, "in-process") || rep.BreakersUnavailable != "" {
		t.Errorf("breakers note %q, unavailable %q; want the in-process note", rep.BreakersNote, rep.BreakersUnavailable)
	}
	if rep.Deferred == nil || rep.DeadLettersByReason == nil || rep.Dispatchers == nil || rep.Endpoints == nil {
		t.Errorf("a list is nil: %+v", rep)
	}
	if _, err := Read(context.Background(), db.Pool, Options{CountCap: -1}); err == nil || !strings.Contains(err.Error(), "CountCap") {
		t.Errorf("Read with a negative CountCap: %v, want an error naming CountCap", err)
	}
}

// TestStatusReadWithRedisDown: Redis down does not fail Read: the rest of the report is
// complete, the breakers are an empty list and BreakersUnavailable says why.
func TestStatusReadWithRedisDown(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('e', '{}')`)
	rep, err := Read(context.Background(), db.Pool, Options{RedisURL: "redis://127.0.0.1:1/0", // nothing listens on port 1
		WebhookURL: "https://consumer.example/hook"})
	if err != nil {
		t.Fatalf("Read with Redis down: %v", err)
	}
	if rep.Backlog != 1 || rep.Breakers == nil || len(rep.Breakers) != 0 || rep.BreakersUnavailable == "" ||
		rep.BreakersNote != "breaker state unavailable: "+rep.BreakersUnavailable {
		t.Errorf("backlog %d, breakers %#v, unavailable %q, note %q; want the outbox read and the breakers marked unavailable",
			rep.Backlog, rep.Breakers, rep.BreakersUnavailable, rep.BreakersNote)
	}
}

// TestStatusReadsOpenBreakers opens the circuit of the configured consumer (WebhookURL) in the
// shared Redis and checks that Read reports it by hash, open since just now by Redis's clock.
func TestStatusReadsOpenBreakers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	const redisURL = "redis://127.0.0.1:6379/0" // the README's test command starts it
	var b [8]byte
	_, _ = rand.Read(b[:])
	url := "https://consumer-" + hex.EncodeToString(b[:]) + ".example/hook"
	sum := sha256.Sum256([]byte(url))
	hash := hex.EncodeToString(sum[:])
	store, err := redisstore.Open(redisURL, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		br, probe, rl := store.Keys(hash)
		retries, slot := store.RetryKeys(hash)
		_ = store.Client().Del(context.Background(), br, probe, rl, retries, slot).Err()
		_ = store.Close()
	})
	params := fluxgate.Params{Threshold: 1, Reset: time.Hour}.WithDefaults()
	if _, err := store.Record(ctx, params, []fluxgate.EndpointResult{{Hash: hash, Rows: []fluxgate.RowResult{{Result: fluxgate.Failure}}}}); err != nil {
		t.Fatalf("Redis at %s: %v", redisURL, err)
	}

	rep, err := Read(ctx, db.Pool, Options{RedisURL: redisURL, WebhookURL: url})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Breakers) != 1 || rep.BreakersUnavailable != "" {
		t.Fatalf("breakers %+v (unavailable %q), want the consumer's", rep.Breakers, rep.BreakersUnavailable)
	}
	if br := rep.Breakers[0]; br.Endpoint != hash || br.State != string(fluxgate.Open) || br.OpenSince == nil ||
		br.OpenAge() < 0 || br.OpenAge() > time.Minute || br.OpenForSeconds < 3500 {
		t.Errorf("breaker %+v (open age %s), want %s open since just now for about an hour", br, br.OpenAge(), hash)
	}
	if !strings.HasPrefix(rep.BreakersNote, "1 endpoints checked") {
		t.Errorf("breakers note %q, want 1 endpoint checked", rep.BreakersNote)
	}
}
