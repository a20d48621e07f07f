package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// cliResult is one `fluxhook` invocation as a test sees it.
type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs fluxhook in-process with DATABASE_URL set to databaseURL and nothing else in
// the environment.
func runCLI(t *testing.T, databaseURL string, args ...string) cliResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return databaseURL
		}
		return ""
	}
	code := run(args, &stdout, &stderr, getenv)
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// runCLIEnv runs fluxhook in-process with exactly env as its environment.
func runCLIEnv(t *testing.T, env map[string]string, args ...string) cliResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr, func(k string) string { return env[k] })
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// mustExec runs fixture SQL on the test database.
func mustExec(t *testing.T, db *sqltest.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("fixture %q: %v", sql, err)
	}
}

// count returns the result of a count(*) query.
func count(t *testing.T, db *sqltest.DB, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%q: %v", sql, err)
	}
	return n
}

func TestConnectErrorsNeverShowThePassword(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if _, err := connect(ctx, ""); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("connect(\"\") = %v, want an error naming DATABASE_URL", err)
	}
	for _, url := range []string{
		"postgres://app:hunter2@127.0.0.1:1/app?connect_timeout=5",     // nothing listens on port 1
		"postgres://app:hunter2@127.0.0.1:notaport/app",                // does not parse
		"host=127.0.0.1 port=1 user=app password=hunter2 dbname=app",   // keyword/value form
		"postgres://app@127.0.0.1:1/app?password=hunter2&sslmode=nope", // invalid option
	} {
		_, err := connect(ctx, url)
		if err == nil {
			t.Errorf("connect(%q) succeeded", url)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("connect(%q) error shows the password: %v", url, err)
		}
	}
}

func TestConnectPings(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	pool, err := connect(context.Background(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var app string
	if err := pool.QueryRow(context.Background(), "SHOW application_name").Scan(&app); err != nil || app != "fluxhook-cli" {
		t.Errorf("application_name = %q, %v; want fluxhook-cli so operators can tell CLI sessions apart", app, err)
	}
}

func TestHelpDoesNotPrintThePassword(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"status", "-h"}, {"enqueue", "--help"}, {"dlq", "list", "-h"}, {"dlq", "replay", "--bogus"}} {
		r := runCLI(t, "postgres://app:hunter2@db/app", args...)
		if !strings.Contains(r.stdout+r.stderr, "--database-url URL") {
			t.Errorf("%v: usage does not list --database-url:\n%s%s", args, r.stdout, r.stderr)
		}
		if strings.Contains(r.stderr+r.stdout, "hunter2") {
			t.Errorf("%v: usage shows the password from DATABASE_URL:\n%s", args, r.stderr)
		}
	}
}
