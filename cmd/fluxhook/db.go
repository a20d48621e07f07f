package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

// This file holds what the operator commands (enqueue, status, dlq) share: the database flag,
// connecting without leaking the password, and command-line parsing.

// redactedPassword replaces passwords wherever a URL is shown.
const redactedPassword = "xxxxx"

// databaseURLFlag registers --database-url on fs, defaulting to DATABASE_URL. The default is
// shown redacted in -h output: flag would otherwise print the password from the environment.
func databaseURLFlag(fs *flag.FlagSet, env *environment) *string {
	v := &databaseURLValue{url: env.getenv("DATABASE_URL")}
	fs.Var(v, "database-url", "PostgreSQL connection URL (env DATABASE_URL)")
	return &v.url
}

// databaseURLValue is a string flag whose printed form has its password redacted.
type databaseURLValue struct{ url string }

func (v *databaseURLValue) String() string {
	if v == nil {
		return ""
	}
	return redactURL(v.url)
}

func (v *databaseURLValue) Set(s string) error { v.url = s; return nil }

// connect opens a small pool for an operator command and pings it, so that a wrong URL fails
// here with one clear message instead of in the first query. Errors never contain the
// password.
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, errors.New("no database configured: set DATABASE_URL or pass --database-url")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, scrubPassword(fmt.Errorf("invalid database URL %s: %w", redactURL(url), err), "")
	}
	password := cfg.ConnConfig.Password
	// One connection does the work; the second keeps a slow ping from blocking a query.
	cfg.MaxConns = 2
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "fluxhook-cli"
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

// passwordError hides a password that a wrapped error might spell out, while errors.Is/As
// still see the original.
type passwordError struct {
	msg string
	err error
}

func (e *passwordError) Error() string { return e.msg }
func (e *passwordError) Unwrap() error { return e.err }

// scrubPassword returns err with every occurrence of password, and of anything that looks
// like a password in a connection string, replaced.
func scrubPassword(err error, password string) error {
	msg := err.Error()
	if password != "" {
		msg = strings.ReplaceAll(msg, password, redactedPassword)
	}
	msg = kvPassword.ReplaceAllString(msg, "${1}"+redactedPassword)
	return &passwordError{msg: msg, err: err}
}

var (
	// kvPassword matches password=... in a keyword/value connection string, quoted or not.
	kvPassword = regexp.MustCompile(`(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)`)
	// queryPassword matches password=... in a URL's query, which pgx also accepts.
	queryPassword = regexp.MustCompile(`(?i)([?&](?:ssl)?password=)[^&#]*`)
)

// redactURL returns u fit for logs and error messages: the password in the user info, in a
// password= or sslpassword= query parameter, or in a keyword/value connection string is
// replaced by xxxxx. It is used for database URLs and for webhook endpoint URLs alike.
// Malformed URLs are redacted on a best-effort basis that prefers masking too much.
func redactURL(u string) string {
	scheme, rest, isURL := strings.Cut(u, "://")
	if !isURL {
		return kvPassword.ReplaceAllString(u, "${1}"+redactedPassword)
	}
	if parsed, err := url.Parse(u); err == nil {
		if parsed.User != nil {
			if _, has := parsed.User.Password(); has {
				parsed.User = url.UserPassword(parsed.User.Username(), redactedPassword)
			}
		}
		if parsed.RawQuery != "" {
			parsed.RawQuery = redactQuery(parsed.RawQuery)
		}
		return parsed.String()
	}
	// Unparseable, for example a password with an unescaped '/' or '#': mask everything
	// between the first ':' of the user info and the last '@'.
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		if colon := strings.Index(rest[:at], ":"); colon >= 0 {
			rest = rest[:colon+1] + redactedPassword + rest[at:]
		}
	}
	return queryPassword.ReplaceAllString(scheme+"://"+rest, "${1}"+redactedPassword)
}

// redactQuery masks password parameters in a raw query, keeping the other parameters exactly
// as they were written.
func redactQuery(raw string) string {
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		key, _, _ := strings.Cut(p, "=")
		if k, err := url.QueryUnescape(key); err == nil {
			key = k
		}
		if k := strings.ToLower(key); k == "password" || k == "sslpassword" {
			parts[i] = key + "=" + redactedPassword
		}
	}
	return strings.Join(parts, "&")
}

// newFlagSet returns a flag set for `fluxhook NAME` that reports to stderr and returns errors,
// so that run can turn them into exit status 2.
func newFlagSet(name string, env *environment, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args and returns the positional arguments. Flags may follow positional
// ones (`dlq replay 7 --force`), which the flag package alone does not allow. -h returns
// flag.ErrHelp after printing the usage: callers return nil for it, since asking for help is
// not a failure. Other errors are usage errors.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError("%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// noArguments is parseFlags for commands that take flags only.
func noArguments(fs *flag.FlagSet, args []string) error {
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return usageError("unexpected argument %q", positional[0])
	}
	return nil
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

// writeJSON prints v for scripts: indented, and without encoding/json's HTML escaping, so that
// payloads and URLs read as they are stored.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
