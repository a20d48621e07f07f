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
		return queryInt(t, db, `SELECT count(*) FROM webhook_outbox
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
