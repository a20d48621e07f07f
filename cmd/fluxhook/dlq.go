package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

//go:embed queries/dlq_list.sql
var dlqListSQL string

//go:embed queries/dlq_show.sql
var dlqShowSQL string

//go:embed queries/dlq_lock_ids.sql
var dlqLockIDsSQL string

//go:embed queries/dlq_lock_matching.sql
var dlqLockMatchingSQL string

//go:embed queries/dlq_replay.sql
var dlqReplaySQL string

func init() {
	commands["dlq"] = command{summary: "list, show, replay and purge dead letters", run: runDLQ}
}

const dlqUsage = `usage:
  fluxhook dlq list [--limit 50] [--event-type T] [--reason-contains S] [--since DURATION] [--json]
  fluxhook dlq show ID [--json]
  fluxhook dlq replay [--force] [--dry-run] ID...
  fluxhook dlq replay --all-matching [--event-type T] [--reason-contains S] [--since DURATION] [--force] [--dry-run]
  fluxhook dlq purge [--dry-run] ID...
  fluxhook dlq purge --all-matching [--event-type T] [--reason-contains S] [--since DURATION] [--replayed-only] [--dry-run]

Replay re-enqueues a dead letter as a new first attempt with the same delivery id, and marks it
replayed. Rows already replayed are skipped unless --force. Bulk replay and purge need at least
one filter. Dead letters stay until purged; the janitor never deletes them.
DURATION is a Go duration (90m, 36h) or a number of days (7d).
`

// runDLQ is the operator's way back from a dead letter: see why events failed, then send them
// again once the consumer is fixed, without writing SQL by hand.
func runDLQ(ctx context.Context, env *environment, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(env.stderr, dlqUsage)
		return usageError("dlq needs a subcommand: list, show, replay or purge")
	}
	var err error
	switch args[0] {
	case "list":
		err = runDLQList(ctx, env, args[1:])
	case "show":
		err = runDLQShow(ctx, env, args[1:])
	case "replay":
		err = runDLQReplay(ctx, env, args[1:])
	case "purge":
		err = runDLQPurge(ctx, env, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(env.stdout, dlqUsage)
		return nil
	default:
		fmt.Fprint(env.stderr, dlqUsage)
		return usageError("unknown dlq subcommand %q", args[0])
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// dlqFilter selects dead letters for list and bulk replay. Its zero value matches everything,
// which is why bulk replay insists on a non-empty one.
type dlqFilter struct {
	eventType      string
	reasonContains string
	since          time.Duration
}

func addDLQFilterFlags(fs *flag.FlagSet) *dlqFilter {
	f := &dlqFilter{}
	fs.StringVar(&f.eventType, "event-type", "", "only this event type (exact match)")
	fs.StringVar(&f.reasonContains, "reason-contains", "", "only reasons containing this text (case-insensitive)")
	fs.Var((*sinceValue)(&f.since), "since", "only dead letters that failed within this long of now (e.g. 36h, 7d)")
	return f
}

func (f *dlqFilter) empty() bool {
	return f.eventType == "" && f.reasonContains == "" && f.since == 0
}

// sqlArgs returns the filter as the $1..$3 of dlq_list.sql and dlq_lock_matching.sql, NULL for
// an unset filter.
func (f *dlqFilter) sqlArgs() []any {
	args := []any{nil, nil, nil}
	if f.eventType != "" {
		args[0] = f.eventType
	}
	if f.reasonContains != "" {
		args[1] = f.reasonContains
	}
	if f.since > 0 {
		args[2] = f.since.Microseconds()
	}
	return args
}

// sinceValue is a positive duration flag that also accepts whole days ("7d"), the unit dead
// letters are usually looked at in and one time.ParseDuration lacks.
type sinceValue time.Duration

func (v *sinceValue) String() string {
	if v == nil || *v == 0 {
		return ""
	}
	return time.Duration(*v).String()
}

func (v *sinceValue) Set(s string) error {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 100*365 {
			return fmt.Errorf("invalid number of days %q", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return err
		}
	}
	if d <= 0 {
		return fmt.Errorf("must be positive, got %s", s)
	}
	*v = sinceValue(d)
	return nil
}

// deadLetter is one webhook_dead_letter row as list, show and their --json print it. The JSON
// names are an interface for scripts; endpoint_url is redacted of any password.
type deadLetter struct {
	ID          int64           `json:"id"`
	OutboxID    *int64          `json:"outbox_id"`
	DeliveryID  string          `json:"delivery_id"`
	StreamID    *string         `json:"stream_id"`
	EventType   string          `json:"event_type"`
	EndpointURL *string         `json:"endpoint_url"`
	Attempts    int32           `json:"attempts"`
	LastStatus  *int32          `json:"last_status"`
	LastError   *string         `json:"last_error"`
	Reason      string          `json:"reason"`
	EnqueuedAt  time.Time       `json:"enqueued_at"`
	FailedAt    time.Time       `json:"failed_at"`
	ReplayedAt  *time.Time      `json:"replayed_at"`
	Payload     json.RawMessage `json:"payload,omitempty"`
}

// scanDeadLetter reads the columns of dlq_list.sql, plus the payload for dlq_show.sql.
func scanDeadLetter(row pgx.Row, withPayload bool) (deadLetter, error) {
	var d deadLetter
	dest := []any{&d.ID, &d.OutboxID, &d.DeliveryID, &d.StreamID, &d.EventType, &d.EndpointURL, &d.Attempts,
		&d.LastStatus, &d.LastError, &d.Reason, &d.EnqueuedAt, &d.FailedAt, &d.ReplayedAt}
	var payload string
	if withPayload {
		dest = append(dest, &payload)
	}
	if err := row.Scan(dest...); err != nil {
		return d, err
	}
	if d.EndpointURL != nil {
		redacted := redactURL(*d.EndpointURL)
		d.EndpointURL = &redacted
	}
	if withPayload {
		d.Payload = json.RawMessage(payload)
	}
	d.EnqueuedAt, d.FailedAt = d.EnqueuedAt.UTC(), d.FailedAt.UTC()
	if d.ReplayedAt != nil {
		t := d.ReplayedAt.UTC()
		d.ReplayedAt = &t
	}
	return d, nil
}

func runDLQList(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("dlq list", env, "fluxhook dlq list [--limit 50] [--event-type T] [--reason-contains S] [--since DURATION] [--json]")
	dbURL := databaseURLFlag(fs, env)
	limit := fs.Int("limit", 50, "most rows to show, newest first")
	filter := addDLQFilterFlags(fs)
	asJSON := fs.Bool("json", false, "print a JSON array (without payloads; see dlq show)")
	if err := noArguments(fs, args); err != nil {
		return err
	}
	if *limit <= 0 {
		return usageError("--limit must be positive, got %d", *limit)
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	rows, _ := pool.Query(ctx, dlqListSQL, append(filter.sqlArgs(), *limit)...)
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadLetter, error) { return scanDeadLetter(r, false) })
	if err != nil {
		return fmt.Errorf("listing dead letters: %w", err)
	}
	if len(list) == *limit {
		fmt.Fprintf(env.stderr, "showing the %d most recent matches; raise --limit to see more\n", *limit)
	}
	if *asJSON {
		if list == nil {
			list = []deadLetter{}
		}
		return writeJSON(env.stdout, list)
	}
	if len(list) == 0 {
		_, err := fmt.Fprintln(env.stdout, "no dead letters match")
		return err
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tFAILED\tEVENT TYPE\tATTEMPTS\tSTATUS\tREPLAYED\tREASON")
	for _, d := range list {
		status := "-"
		if d.LastStatus != nil {
			status = strconv.Itoa(int(*d.LastStatus))
		}
		replayed := "-"
		if d.ReplayedAt != nil {
			replayed = formatTime(*d.ReplayedAt)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, formatTime(d.FailedAt), printable(d.EventType),
			d.Attempts, status, replayed, shorten(printable(d.Reason), 60))
	}
	return tw.Flush()
}

func runDLQShow(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("dlq show", env, "fluxhook dlq show ID [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print the row as one JSON object")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usageError("dlq show takes exactly one dead-letter id")
	}
	ids, err := parseIDs(positional)
	if err != nil {
		return err
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	d, err := scanDeadLetter(pool.QueryRow(ctx, dlqShowSQL, ids[0]), true)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("dead letter %d not found", ids[0])
	}
	if err != nil {
		return fmt.Errorf("reading dead letter %d: %w", ids[0], err)
	}
	if *asJSON {
		return writeJSON(env.stdout, d)
	}
	return printDeadLetter(env.stdout, d)
}

func printDeadLetter(w io.Writer, d deadLetter) error {
	orNone := func(s *string, none string) string {
		if s == nil {
			return none
		}
		return printable(*s)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%d\n", d.ID)
	if d.OutboxID != nil {
		fmt.Fprintf(tw, "outbox_id\t%d\n", *d.OutboxID)
	} else {
		fmt.Fprintf(tw, "outbox_id\t-\n")
	}
	fmt.Fprintf(tw, "delivery_id\t%s\n", d.DeliveryID)
	fmt.Fprintf(tw, "event_type\t%s\n", printable(d.EventType))
	fmt.Fprintf(tw, "stream_id\t%s\n", orNone(d.StreamID, "-"))
	fmt.Fprintf(tw, "endpoint_url\t%s\n", orNone(d.EndpointURL, "- (the configured WEBHOOK_URL)"))
	fmt.Fprintf(tw, "attempts\t%d\n", d.Attempts)
	if d.LastStatus != nil {
		fmt.Fprintf(tw, "last_status\t%d\n", *d.LastStatus)
	} else {
		fmt.Fprintf(tw, "last_status\t-\n")
	}
	fmt.Fprintf(tw, "last_error\t%s\n", orNone(d.LastError, "-"))
	fmt.Fprintf(tw, "reason\t%s\n", printable(d.Reason))
	fmt.Fprintf(tw, "enqueued_at\t%s\n", formatTime(d.EnqueuedAt))
	fmt.Fprintf(tw, "failed_at\t%s\n", formatTime(d.FailedAt))
	if d.ReplayedAt != nil {
		fmt.Fprintf(tw, "replayed_at\t%s\n", formatTime(*d.ReplayedAt))
	} else {
		fmt.Fprintf(tw, "replayed_at\t- (not replayed)\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var payload bytes.Buffer
	if err := json.Indent(&payload, d.Payload, "", "  "); err != nil {
		return fmt.Errorf("formatting payload: %w", err)
	}
	_, err := fmt.Fprintf(w, "payload:\n%s\n", payload.Bytes())
	return err
}

// lockedDeadLetter is what replay needs to know about a row before deciding to replay it.
type lockedDeadLetter struct {
	ID         int64
	DeliveryID string
	EventType  string
	ReplayedAt *time.Time
}

func runDLQReplay(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("dlq replay", env, "fluxhook dlq replay [--force] [--dry-run] ID... | --all-matching FILTER...")
	dbURL := databaseURLFlag(fs, env)
	all := fs.Bool("all-matching", false, "replay every dead letter matching the filters (at least one filter required)")
	filter := addDLQFilterFlags(fs)
	force := fs.Bool("force", false, "replay rows that were already replayed")
	dryRun := fs.Bool("dry-run", false, "report what would be replayed and change nothing")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	ids, err := selection("replay", positional, *all, filter)
	if err != nil {
		return err
	}

	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	var replay, skip []lockedDeadLetter
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var rows pgx.Rows
		if *all {
			rows, _ = tx.Query(ctx, dlqLockMatchingSQL, filter.sqlArgs()...)
		} else {
			rows, _ = tx.Query(ctx, dlqLockIDsSQL, ids)
		}
		locked, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lockedDeadLetter, error) {
			var l lockedDeadLetter
			return l, r.Scan(&l.ID, &l.DeliveryID, &l.EventType, &l.ReplayedAt)
		})
		if err != nil {
			return fmt.Errorf("reading dead letters: %w", err)
		}
		if !*all && len(locked) != len(ids) {
			return fmt.Errorf("dead letter %s not found; nothing replayed", joinIDs(missingIDs(ids, locked)))
		}
		for _, l := range locked {
			if l.ReplayedAt != nil && !*force {
				skip = append(skip, l)
			} else {
				replay = append(replay, l)
			}
		}
		if *dryRun || len(replay) == 0 {
			return nil
		}
		replayIDs := make([]int64, len(replay))
		for i, l := range replay {
			replayIDs[i] = l.ID
		}
		var n int64
		if err := tx.QueryRow(ctx, dlqReplaySQL, replayIDs).Scan(&n); err != nil {
			return fmt.Errorf("replaying: %w", err)
		}
		if n != int64(len(replay)) {
			return fmt.Errorf("replaying: wrote %d outbox rows for %d dead letters; rolled back", n, len(replay))
		}
		return nil
	})
	if err != nil {
		return err
	}
	return printReplay(env.stdout, replay, skip, *all, *dryRun)
}

func printReplay(w io.Writer, replay, skip []lockedDeadLetter, all, dryRun bool) error {
	if all && len(replay) == 0 && len(skip) == 0 {
		_, err := fmt.Fprintln(w, "no dead letters match")
		return err
	}
	verb := "replayed"
	if dryRun {
		verb = "would replay"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, l := range replay {
		fmt.Fprintf(tw, "%s\t%d\t%s\tdelivery_id %s\n", verb, l.ID, printable(l.EventType), l.DeliveryID)
	}
	for _, l := range skip {
		fmt.Fprintf(tw, "skipped\t%d\t%s\talready replayed at %s; --force replays it again\n", l.ID, printable(l.EventType), formatTime(*l.ReplayedAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	summary := fmt.Sprintf("%s %d", verb, len(replay))
	if len(skip) > 0 {
		summary += fmt.Sprintf(", skipped %d already replayed", len(skip))
	}
	if dryRun {
		summary += " (dry run: nothing changed)"
	}
	_, err := fmt.Fprintln(w, summary)
	return err
}

// parseIDs parses dead-letter ids, dropping duplicates so that `replay 7 7` replays once.
func parseIDs(args []string) ([]int64, error) {
	var ids []int64
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, usageError("%q is not a dead-letter id", a)
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func missingIDs(want []int64, found []lockedDeadLetter) []int64 {
	var missing []int64
	for _, id := range want {
		if !slices.ContainsFunc(found, func(l lockedDeadLetter) bool { return l.ID == id }) {
			missing = append(missing, id)
		}
	}
	return missing
}

func joinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ", ")
}

// shorten keeps table rows on one line; dlq show prints the full text.
func shorten(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// selection checks how a bulk command (replay, purge) was told which dead letters to touch:
// ids, or --all-matching with at least one filter, never neither and never both. It returns
// the ids (nil with --all-matching).
func selection(verb string, positional []string, all bool, filter *dlqFilter) ([]int64, error) {
	switch {
	case all && len(positional) > 0:
		return nil, usageError("give dead-letter ids or --all-matching, not both")
	case all && filter.empty():
		return nil, usageError("--all-matching needs at least one of --event-type, --reason-contains or --since; %s every dead letter at once is never what was meant", gerund(verb))
	case !all && !filter.empty():
		return nil, usageError("--event-type, --reason-contains and --since select rows only with --all-matching")
	case !all && len(positional) == 0:
		return nil, usageError("dlq %s needs dead-letter ids, or --all-matching with a filter", verb)
	case !all:
		return parseIDs(positional)
	}
	return nil, nil
}

func gerund(verb string) string {
	if verb == "purge" {
		return "purging"
	}
	return verb + "ing"
}
