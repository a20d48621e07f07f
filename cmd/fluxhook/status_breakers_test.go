package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluxora/fluxhook/sql/sqltest"
	fluxgate "github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
)

// TestStatusShowsOpenBreakers opens a circuit in the shared Redis for an endpoint that has a
// pending row, and checks that `status` reports it by hash, never by URL.
func TestStatusShowsOpenBreakers(t *testing.T) {
	t.Parallel()
	const redisURL = "redis://127.0.0.1:6379/0"
	if err := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at 127.0.0.1:6379 (the README's test command starts it): %v", err)
	}
	db := sqltest.NewMigrated(t)
	var b [8]byte
	_, _ = rand.Read(b[:])
	url := "https://consumer-" + hex.EncodeToString(b[:]) + ".example/hook?token=sekrit"
	sum := sha256.Sum256([]byte(url))
	hash := hex.EncodeToString(sum[:])
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, endpoint_url) VALUES ('e', '{}', $1)`, url)

	store, err := redisstore.Open(redisURL, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	t.Cleanup(func() {
		br, probe, rl := store.Keys(hash)
		_ = store.Client().Del(context.Background(), br, probe, rl).Err()
	})
	params := fluxgate.Params{Threshold: 2, Reset: time.Hour}.WithDefaults()
	fail := fluxgate.EndpointResult{Hash: hash, Rows: []fluxgate.RowResult{{Result: fluxgate.Failure}, {Result: fluxgate.Failure}}}
	if _, err := store.Record(context.Background(), params, []fluxgate.EndpointResult{fail}); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, db.URL, "status", "--json", "--redis-url", redisURL)
	if r.code != 0 {
		t.Fatalf("status: %d %s", r.code, r.stderr)
	}
	if strings.Contains(r.stdout, "consumer-") || strings.Contains(r.stdout, "sekrit") {
		t.Fatal("status printed the endpoint URL")
	}
	var rep struct {
		Breakers []breakerStatus `json:"breakers"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Breakers) != 1 || rep.Breakers[0].Endpoint != hash || rep.Breakers[0].State != "open" || rep.Breakers[0].OpenForSeconds < 3500 {
		t.Fatalf("breakers = %+v; want the endpoint open for about an hour", rep.Breakers)
	}
	// Without REDIS_URL the report says where the state lives instead of showing it closed.
	r = runCLI(t, db.URL, "status")
	if r.code != 0 || !strings.Contains(r.stdout, "in-process") {
		t.Fatalf("status without Redis: %d\n%s", r.code, r.stdout)
	}
}

// TestStatusWithRedisDown: when the Redis holding the breakers cannot be reached, status
// still prints everything PostgreSQL knows, says the breaker part is unavailable and why, and
// exits 0, in text and in JSON.
func TestStatusWithRedisDown(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('e', '{}')`)
	down := "redis://127.0.0.1:1/0" // nothing listens on port 1
	r := runCLI(t, db.URL, "status", "--json", "--redis-url", down, "--webhook-url", "https://consumer.example/hook")
	if r.code != 0 {
		t.Fatalf("status --json with Redis down exited %d: %s", r.code, r.stderr)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status --json printed %q: %v", r.stdout, err)
	}
	if rep.Backlog != 1 || rep.BreakersUnavailable == "" || !strings.Contains(rep.BreakersNote, "unavailable") {
		t.Errorf("backlog %d, breakers_unavailable %q, note %q; want the outbox read and the breakers marked unavailable",
			rep.Backlog, rep.BreakersUnavailable, rep.BreakersNote)
	}
	text := runCLI(t, db.URL, "status", "--redis-url", down, "--webhook-url", "https://consumer.example/hook")
	if text.code != 0 || !strings.Contains(text.stdout, "backlog") || !strings.Contains(text.stdout, "breaker state unavailable") {
		t.Errorf("status with Redis down: exit %d, output:\n%s%s", text.code, text.stdout, text.stderr)
	}
}
