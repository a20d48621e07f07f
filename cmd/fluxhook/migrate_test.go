package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestScriptInstallsThroughPsql checks the promise to users who install by SQL, with what
// they actually run: the output of the fluxhook binary's `migrate --print`, applied twice with
// `psql -f`, installs a schema that fluxhook accepts, whose trigger notifies while the switch
// is set, and from which `serve` delivers.
func TestScriptInstallsThroughPsql(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql not installed")
	}
	db := sqltest.New(t)
	script, err := exec.Command(fluxhookBinary(t), "migrate", "--print").Output()
	if err != nil {
		t.Fatalf("fluxhook migrate --print: %v", err)
	}
	file := filepath.Join(t.TempDir(), "fluxhook.sql")
	if err := os.WriteFile(file, script, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db.URL, "-f", file).CombinedOutput()
		if err != nil {
			t.Fatalf("psql -f: %v\n%s", err, out)
		}
	}
	ctx := context.Background()
	if err := fluxsql.CheckCurrent(ctx, db.Pool); err != nil {
		t.Fatalf("CheckCurrent after psql install: %v", err)
	}
	// Migrating a psql-installed database is a no-op.
	if applied, err := fluxsql.Migrate(ctx, db.Pool); err != nil || len(applied) != 0 {
		t.Fatalf("migrate after psql install = %v, %v", applied, err)
	}

	// The trigger: an original-style insert notifies while the switch is set, and the row
	// gets our columns' defaults.
	listener, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN webhook_outbox"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT setval('webhook_outbox_notify_until',
		(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 60000)`); err != nil {
		t.Fatalf("setting the NOTIFY switch: %v", err)
	}
	var attempt int
	var deliveryID string
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		VALUES ('s1', 'stream.updated', '{"a":1}') RETURNING attempt, delivery_id::text`).Scan(&attempt, &deliveryID); err != nil {
		t.Fatalf("original-style insert: %v", err)
	}
	if attempt != 1 || len(deliveryID) != 36 {
		t.Fatalf("defaults: attempt=%d delivery_id=%q", attempt, deliveryID)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	n, err := listener.WaitForNotification(waitCtx)
	cancel()
	if err != nil {
		t.Fatalf("no NOTIFY for an insert while the switch is set: %v", err)
	}
	if n.Channel != "webhook_outbox" {
		t.Fatalf("NOTIFY on %q, want webhook_outbox", n.Channel)
	}

	// And serve delivers from it, the row inserted above and one inserted once it runs.
	c := newHookConsumer(t, nil)
	p := startServe(t, "serve", serveEnv(db.URL, c.URL()))
	second := enqueueOne(t, db, outbox.Event{EventType: "test.psql"})
	p.waitFor(15*time.Second, "both rows delivered", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries
			WHERE delivery_id::text = ANY($1) AND processed AND status_code = 200`, []string{deliveryID, second}) == 2
	})
	p.stopCleanly()
}

// TestServeRefusesOlderSchema installs only the first migration, as an older fluxhook left
// it: serve must refuse, name both versions and say to run `fluxhook migrate`, having
// registered and claimed nothing.
func TestServeRefusesOlderSchema(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	ctx := context.Background()
	first := fluxsql.Migrations()[0]
	if _, err := db.Pool.Exec(ctx, first.SQL); err != nil {
		t.Fatalf("applying %s: %v", first.Name, err)
	}
	if v, err := fluxsql.CurrentVersion(ctx, db.Pool); err != nil || v != first.Version {
		t.Fatalf("schema version %d, %v; want %d", v, err, first.Version)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('e', '{}')`); err != nil {
		t.Fatal(err)
	}
	c := newHookConsumer(t, nil)
	code, stderr := serveInProcess(serveEnv(db.URL, c.URL()))
	if code == 0 {
		t.Fatalf("serve exited 0 on schema version %d:\n%s", first.Version, stderr)
	}
	for _, want := range []string{
		"schema version " + strconv.Itoa(first.Version),
		"needs " + strconv.Itoa(fluxsql.LatestVersion()),
		"fluxhook migrate",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("exit %d, but the message lacks %q:\n%s", code, want, stderr)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_outbox WHERE lease_until IS NOT NULL OR processed`); n != 0 {
		t.Errorf("serve claimed %d rows from an older schema", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dispatcher`); n != 0 {
		t.Errorf("serve registered %d dispatchers on an older schema", n)
	}
	if arrived, _, _ := c.counts(); arrived != 0 {
		t.Errorf("the consumer got %d requests", arrived)
	}
}

// TestScriptUpgradesOriginalTableThenServeDelivers installs fluxhook, with the binary's
// `migrate --print` through psql, over the original dispatcher's table holding delivered and
// pending rows (its DDL as we know it; sql/original_test.go checks the upgrade itself in
// detail, and a variant). serve then delivers each pending row once, with the delivery id the
// upgrade gave it, and nothing the original had delivered; and a producer still inserting in
// the original's form is delivered too.
func TestScriptUpgradesOriginalTableThenServeDelivers(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql not installed")
	}
	ctx := context.Background()
	db := sqltest.New(t)
	if _, err := db.Pool.Exec(ctx, `
		CREATE TABLE webhook_outbox (
			id BIGSERIAL PRIMARY KEY,
			stream_id TEXT,
			event_type TEXT NOT NULL,
			payload JSONB NOT NULL,
			created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
			processed BOOLEAN NOT NULL DEFAULT false
		);
		CREATE INDEX ON webhook_outbox (processed, created_at);
		INSERT INTO webhook_outbox (stream_id, event_type, payload, created_at, processed) VALUES
			('s1', 'original.delivered.1', '{"n": 1}', now() - interval '2 days', true),
			('s1', 'original.delivered.2', '{"n": 2}', now() - interval '1 day', true),
			('s2', 'original.pending.1', '{"n": 3}', now() - interval '10 minutes', false),
			(NULL, 'original.pending.2', '{"n": 4}', now() - interval '1 minute', false);
		INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES ('s3', 'original.pending.3', '{"n": 5}');`); err != nil {
		t.Fatalf("the original's table: %v", err)
	}
	script, err := exec.Command(fluxhookBinary(t), "migrate", "--print").Output()
	if err != nil {
		t.Fatalf("fluxhook migrate --print: %v", err)
	}
	file := filepath.Join(t.TempDir(), "fluxhook.sql")
	if err := os.WriteFile(file, script, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db.URL, "-f", file).CombinedOutput()
	if err != nil {
		t.Fatalf("psql -f over the original's table: %v\n%s", err, out)
	}
	if err := fluxsql.CheckCurrent(ctx, db.Pool); err != nil {
		t.Fatalf("CheckCurrent after the upgrade: %v", err)
	}
	ids := map[string]string{} // event type -> delivery id
	rows, err := db.Pool.Query(ctx, `SELECT event_type, delivery_id::text FROM webhook_deliveries WHERE NOT processed`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var event, id string
		if err := rows.Scan(&event, &id); err != nil {
			t.Fatal(err)
		}
		ids[event] = id
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 3 {
		t.Fatalf("pending rows after the upgrade: %v, want the original's three", ids)
	}

	c := newHookConsumer(t, nil)
	p := startServe(t, "serve", serveEnv(db.URL, c.URL()))
	p.instanceID()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		VALUES ('s4', 'original.form.after', '{"n": 6}')`); err != nil {
		t.Fatalf("an insert in the original's form: %v", err)
	}
	p.waitFor(30*time.Second, "the four pending rows delivered", func() bool {
		_, _, ok := c.counts()
		return ok >= 4 && queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE NOT processed`) == 0
	})
	p.stopCleanly()
	seen := map[string]int{}
	for _, r := range c.requests() {
		seen[r.Event]++
		if r.VerifyErr != nil {
			t.Errorf("%s: signature: %v", r.Event, r.VerifyErr)
		}
		if want, ok := ids[r.Event]; ok && r.DeliveryID != want {
			t.Errorf("%s delivered with delivery id %s, want the one the upgrade gave it, %s", r.Event, r.DeliveryID, want)
		}
	}
	for _, e := range []string{"original.pending.1", "original.pending.2", "original.pending.3", "original.form.after"} {
		if seen[e] != 1 {
			t.Errorf("%s delivered %d times, want once", e, seen[e])
		}
	}
	for _, e := range []string{"original.delivered.1", "original.delivered.2"} {
		if seen[e] != 0 {
			t.Errorf("%s, delivered by the original, was sent again", e)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE processed AND status_code = 200`); n != 4 {
		t.Errorf("%d rows settled as delivered, want 4", n)
	}
}

// TestMigrateLockTimeoutFlag: `fluxhook migrate --lock-timeout` bounds each lock wait, says on
// stderr that it rolled back and will retry, and migrates once the long transaction ends;
// --print writes the same bound into the script.
func TestMigrateLockTimeoutFlag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.New(t)
	for _, m := range fluxsql.Migrations() {
		if m.Version > 4 {
			break
		}
		if _, err := db.Pool.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("applying %s: %v", m.Name, err)
		}
	}
	// A producer's transaction left open: its ROW EXCLUSIVE lock on webhook_outbox blocks
	// migration 5's ALTER TABLE.
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	holder, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('long', '{}')`); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr syncBuffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return db.URL
		}
		return ""
	}
	code := make(chan int, 1)
	go func() { code <- run([]string{"migrate", "--lock-timeout", "300ms"}, &stdout, &stderr, getenv) }()
	pollUntil(t, 30*time.Second, "migrate to report a lock timeout", func() bool {
		return strings.Contains(stderr.String(), "attempt 1 of 4: a lock was not granted within 300ms")
	})
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		// From schema 4: migration 5 (the one the lock held back) and every one after it.
		var want []string
		for v := 5; v <= fluxsql.LatestVersion(); v++ {
			want = append(want, strconv.Itoa(v))
		}
		if c != 0 || !strings.Contains(stdout.String(), "applied migrations ["+strings.Join(want, " ")+"]") {
			t.Fatalf("migrate exited %d: %s%s", c, stdout.String(), stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("migrate did not finish within 30 s of the lock's release: %s", stderr.String())
	}

	r := runCLI(t, "", "migrate", "--print", "--lock-timeout", "10s")
	if r.code != 0 || !strings.Contains(r.stdout, "SET LOCAL lock_timeout = '10s';") {
		t.Errorf("migrate --print --lock-timeout 10s exited %d and does not set lock_timeout = '10s':\n%.600s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, "", "migrate", "--print"); !strings.Contains(r.stdout, "SET LOCAL lock_timeout = '5s';") {
		t.Errorf("migrate --print does not set lock_timeout = '5s':\n%.600s", r.stdout)
	}
	if r := runCLI(t, "", "migrate", "--lock-timeout", "-1s"); r.code != 2 {
		t.Errorf("migrate --lock-timeout -1s exited %d, want 2 (usage): %s", r.code, r.stderr)
	}
}
