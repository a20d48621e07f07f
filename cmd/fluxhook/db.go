package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
	fluxsql "github.com/fluxora/fluxhook/sql"
)

// This file holds what the operator commands (enqueue, status, dlq) share: the database flag,
// connecting without leaking the password, and command-line parsing. The flag parsing and the
// redaction live in internal/cli, which the bench (internal/bench) uses too; the names below
// are this package's for them.

// redactedPassword replaces passwords wherever a URL is shown.
const redactedPassword = cli.RedactedPassword

// databaseURLFlag registers --database-url on fs, defaulting to DATABASE_URL, printed redacted.
func databaseURLFlag(fs *flag.FlagSet, env *environment) *string {
	return cli.DatabaseURLFlag(fs, env.getenv)
}

// internal/cli's redaction, flag parsing and JSON output, as the commands here call them.
var (
	redactURL     = cli.RedactURL
	scrubPassword = cli.ScrubPassword
	parseFlags    = cli.ParseFlags
	noArguments   = cli.NoArguments
	writeJSON     = cli.WriteJSON
	document      = cli.Document
)

// flagDoc is what a flag's help line says besides its usage (cli.FlagDoc).
type flagDoc = cli.FlagDoc

// connect opens a small pool for an operator command and pings it, so that a wrong URL fails
// here with one clear message instead of in the first query. Errors never contain the
// password.
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	// One connection does the work; the second keeps a slow ping from blocking a query.
	return connectPool(ctx, url, 2, "fluxhook-cli")
}

// connectPool is connect with the pool's size and the sessions' application_name (what
// pg_stat_activity shows) chosen by the caller: the API serves concurrent requests.
func connectPool(ctx context.Context, url string, maxConns int32, appName string) (*pgxpool.Pool, error) {
	cfg, problem := parseDatabaseURL(url)
	if problem != "" {
		// A configuration mistake, reported and exited on as serve does (status 2), in serve's
		// words.
		return nil, fmt.Errorf("%w: DATABASE_URL: %s", errInvalidConfig, problem)
	}
	password := cfg.ConnConfig.Password
	cfg.MaxConns = maxConns
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, scrubPassword(fmt.Errorf("connecting to %s: %w", redactURL(url), err), password)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, scrubPassword(fmt.Errorf("connecting to %s: %w", redactURL(url), err), password)
	}
	return pool, nil
}

// connectCurrent is connect for commands that read fluxhook's tables: it refuses a database
// whose schema is missing or outdated with the error that says to run `fluxhook migrate`,
// rather than failing later on a missing table or column.
func connectCurrent(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pool, err := connect(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := fluxsql.CheckCurrent(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// newFlagSet returns a flag set for `fluxhook NAME` that prints its help to the command's
// stdout when asked (-h) and to its stderr with a usage error, and returns errors, so that run
// can turn them into exit status 2.
func newFlagSet(name string, env *environment, synopsis string) *flag.FlagSet {
	return cli.NewFlagSet(name, env.stdout, env.stderr, synopsis)
}

// printable escapes control characters in database text (event types, reasons, errors) before
// it reaches a terminal, where an escape sequence in a dead letter could rewrite the screen.
func printable(s string) string {
	if !strings.ContainsFunc(s, isControlRune) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControlRune(r) {
			fmt.Fprintf(&b, `\x%02x`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isControlRune(r rune) bool { return r < 0x20 || (r >= 0x7f && r < 0xa0) }

// parseDatabaseURL parses a DATABASE_URL, or says what is wrong with it in words that follow
// "DATABASE_URL: ", never echoing a password: every command reports the same mistake the same
// way, with a hint for a mistyped scheme (pgx's own message for postgress:// is about
// keyword/value strings).
func parseDatabaseURL(url string) (*pgxpool.Config, string) {
	if url == "" {
		return nil, "is required: a PostgreSQL URL such as postgres://user@localhost:5432/app; set it, or pass --database-url"
	}
	if scheme, _, ok := strings.Cut(url, "://"); ok && scheme != "postgres" && scheme != "postgresql" && !strings.ContainsAny(scheme, " =") {
		return nil, fmt.Sprintf("has the scheme %q: a PostgreSQL URL starts with postgres:// (or postgresql://)", scheme)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Sprintf("is not a valid PostgreSQL connection string (%s)", redactURL(err.Error()))
	}
	return cfg, ""
}
