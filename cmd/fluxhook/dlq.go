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
  fluxhook dlq list [--limit 50] [FILTER...] [--json]
  fluxhook dlq show ID|DELIVERY-ID [--json]
  fluxhook dlq replay [--force] [--dry-run] [--to-endpoint ID] ID|DELIVERY-ID...
  fluxhook dlq replay --all-matching FILTER... [--force] [--dry-run] [--to-endpoint ID]
  fluxhook dlq purge [--replayed-only] [--dry-run] ID|DELIVERY-ID...
  fluxhook dlq purge --all-matching [FILTER...] [--replayed-only] [--dry-run]

FILTER is any of --event-type T, --reason-contains S, --since DURATION, --delivery-id UUID and
--endpoint-id UUID; the filters combine with AND.

ID is a dead letter's row number (the ID column of dlq list). DELIVERY-ID is the event's
delivery id, the UUID that logs, metrics and the consumer's x-fluxora-delivery-id header
(webhook-id for Standard Webhooks endpoints) carry: the DELIVERY ID column. An event fanned
out to several endpoints, or dead-lettered again after a replay, has several dead letters with
one delivery id: a DELIVERY-ID selects all of them. show prints each, oldest first; with
--json, an ID prints one object and a DELIVERY-ID always an array, even of one.

Replay re-enqueues a dead letter as a new first attempt with the same delivery id, and marks it
replayed. Rows already replayed are skipped unless --force. A row selected by delivery id or
filter is also skipped when a later dead letter of the same delivery to the same endpoint
supersedes it (the event went back there and failed again; replaying both would send it twice):
name it by ID to replay it anyway. A managed endpoint's dead letter goes back to that
endpoint; one whose endpoint was removed is skipped, since it would only fail again, unless
--to-endpoint names another (enabled) endpoint for it. --to-endpoint sends every selected
dead letter there instead of to its own destination, each event once, and only those of the
endpoint's tenant (events never cross tenants); the order key is kept if that endpoint orders
streams. A stream stopped at such a dead letter stays stopped: purge the dead letter to let
it go on. A dead letter of a stream without an order key (its endpoint did not order streams)
that goes to an endpoint ordering them now joins its stream there at the end, after the events
already waiting.
Bulk replay needs at least one filter; bulk purge needs a
filter or --replayed-only. Dead letters stay until purged; the janitor never deletes them.
DURATION is a Go duration (90m, 36h) or a number of days (7d).

An ordered stream whose endpoint stops at a dead letter (fluxhook endpoints --ordering-failure
stop) delivers nothing more until that dead letter is replayed or purged. Replay puts the event
back in its place, at the head of the stream, which then goes on from it; purge gives it up,
and the stream goes on with the next event.
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

// dlqFilter selects dead letters for list and bulk replay and purge. Its zero value matches
// everything, which is why bulk replay and purge insist on a non-empty one.
type dlqFilter struct {
	eventType      string
	reasonContains string
	since          time.Duration
	deliveryID     string // canonical UUID, or ""
	endpointID     string // canonical UUID, or ""
}

func addDLQFilterFlags(fs *flag.FlagSet) *dlqFilter {
	f := &dlqFilter{}
	fs.StringVar(&f.eventType, "event-type", "", "only this event type (exact match)")
	fs.StringVar(&f.reasonContains, "reason-contains", "", "only reasons containing this text (case-insensitive)")
	fs.Var((*sinceValue)(&f.since), "since", "only dead letters that failed within this long of now (e.g. 36h, 7d)")
	fs.Var((*uuidValue)(&f.deliveryID), "delivery-id", "only dead letters of this delivery id (a UUID; every endpoint and every time it failed)")
	fs.Var((*uuidValue)(&f.endpointID), "endpoint-id", "only dead letters of this managed endpoint (a UUID, see fluxhook endpoints list)")
	return f
}

func (f *dlqFilter) empty() bool {
	return f.eventType == "" && f.reasonContains == "" && f.since == 0 && f.deliveryID == "" && f.endpointID == ""
}

// sqlArgs returns the filter as the $1..$5 of dlq_list.sql, dlq_lock_matching.sql and
// dlq_purge.sql, NULL for an unset filter.
func (f *dlqFilter) sqlArgs() []any {
	args := []any{nil, nil, nil, nil, nil}
	if f.eventType != "" {
		args[0] = f.eventType
	}
	if f.reasonContains != "" {
		args[1] = f.reasonContains
	}
	if f.since > 0 {
		args[2] = f.since.Microseconds()
	}
	if f.deliveryID != "" {
		args[3] = f.deliveryID
	}
	if f.endpointID != "" {
		args[4] = f.endpointID
	}
	return args
}

// uuidValue is a flag holding a UUID in canonical form. It refuses anything else when the
// flags are parsed, so that a mistyped id exits 2 instead of quietly matching nothing.
type uuidValue string

func (v *uuidValue) String() string {
	if v == nil {
		return ""
	}
	return string(*v)
}

func (v *uuidValue) Set(s string) error {
	id, ok := canonicalUUID(s)
	if !ok {
		return fmt.Errorf("%q is not a UUID", s)
	}
	*v = uuidValue(id)
	return nil
}

// canonicalUUID accepts a UUID in the 8-4-4-4-12 form that logs and the delivery id header
// print, in either case, and returns it in lower case: the form PostgreSQL prints, so that
// it compares equal to delivery_id::text. Other spellings PostgreSQL would take (braces, no
// hyphens) are refused: nothing prints them, and a bare run of digits must stay a row id.
func canonicalUUID(s string) (string, bool) {
	if len(s) != 36 {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return "", false
			}
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
		default:
			return "", false
		}
	}
	return strings.ToLower(s), true
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
// names are an interface for scripts; endpoint_url is redacted of any password. delivery_id is
// the id logs, metrics and the consumer see; id is the row's number, which nothing outside
// this table knows. endpoint_id is null unless the row is a managed endpoint's delivery;
// tenant is the event's tenant, null for none; order_key is the event's place in its stream
// for an ordered endpoint's delivery (what a replay keeps, so that it leads the stream again),
// null for an unordered one.
type deadLetter struct {
	ID          int64      `json:"id"`
	OutboxID    *int64     `json:"outbox_id"`
	DeliveryID  string     `json:"delivery_id"`
	EndpointID  *string    `json:"endpoint_id"`
	StreamID    *string    `json:"stream_id"`
	EventType   string     `json:"event_type"`
	EndpointURL *string    `json:"endpoint_url"`
	Attempts    int32      `json:"attempts"`
	LastStatus  *int32     `json:"last_status"`
	LastError   *string    `json:"last_error"`
	Reason      string     `json:"reason"`
	EnqueuedAt  time.Time  `json:"enqueued_at"`
	FailedAt    time.Time  `json:"failed_at"`
	ReplayedAt  *time.Time `json:"replayed_at"`
	Tenant      *string    `json:"tenant"`
	OrderKey    *int64     `json:"order_key"`
	// LastResponseExcerpt is the start of the consumer's last answer (schema 15), shown by
	// dlq show only: nil in a list, and when the dead letter kept none.
	LastResponseExcerpt *string         `json:"last_response_excerpt,omitempty"`
	Payload             json.RawMessage `json:"payload,omitempty"`
}

// scanDeadLetter reads the columns of dlq_list.sql, plus the payload for dlq_show.sql.
func scanDeadLetter(row pgx.Row, withPayload bool) (deadLetter, error) {
	var d deadLetter
	dest := []any{&d.ID, &d.OutboxID, &d.DeliveryID, &d.EndpointID, &d.StreamID, &d.EventType, &d.EndpointURL,
		&d.Attempts, &d.LastStatus, &d.LastError, &d.Reason, &d.EnqueuedAt, &d.FailedAt, &d.ReplayedAt,
		&d.Tenant, &d.OrderKey}
	var payload string
	if withPayload {
		dest = append(dest, &d.LastResponseExcerpt, &payload)
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
	fs := newFlagSet("dlq list", env, "fluxhook dlq list [--limit 50] [--event-type T] [--reason-contains S] [--since DURATION] [--delivery-id UUID] [--endpoint-id UUID] [--json]")
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
	// ID is what show, replay and purge take; DELIVERY ID is what the operator arrives with
	// (from a log line, an alert or the consumer), and ENDPOINT tells apart the dead letters
	// of one event fanned out to several endpoints.
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDELIVERY ID\tENDPOINT\tFAILED\tEVENT TYPE\tATTEMPTS\tSTATUS\tREPLAYED\tREASON")
	for _, d := range list {
		status := "-"
		if d.LastStatus != nil {
			status = strconv.Itoa(int(*d.LastStatus))
		}
		replayed := "-"
		if d.ReplayedAt != nil {
			replayed = formatTime(*d.ReplayedAt)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.DeliveryID, dashIfNil(d.EndpointID),
			formatTime(d.FailedAt), printable(d.EventType), d.Attempts, status, replayed, shorten(printable(d.Reason), 60))
	}
	return tw.Flush()
}

func runDLQShow(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("dlq show", env, "fluxhook dlq show ID|DELIVERY-ID [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print JSON: one object for an ID; for a DELIVERY-ID always an array, oldest first, even of one")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usageError("dlq show takes exactly one dead-letter id or delivery id")
	}
	refs, err := parseRefs(positional)
	if err != nil {
		return err
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	var id, deliveryID any
	what := "delivery id " + positional[0]
	if len(refs.ids) == 1 {
		id, what = refs.ids[0], "dead letter "+positional[0]
	} else {
		deliveryID = refs.deliveryIDs[0]
	}
	rows, _ := pool.Query(ctx, dlqShowSQL, id, deliveryID)
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadLetter, error) { return scanDeadLetter(r, true) })
	if err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	if id != nil {
		// A row id names one row, and its JSON stays the one object it always was.
		if len(list) == 0 {
			return fmt.Errorf("dead letter %d not found", refs.ids[0])
		}
		if *asJSON {
			return writeJSON(env.stdout, list[0])
		}
		return printDeadLetter(env.stdout, list[0])
	}
	if len(list) == 0 {
		return fmt.Errorf("no dead letter has delivery id %s", refs.deliveryIDs[0])
	}
	if *asJSON {
		// Always an array for a delivery id, whatever the count: its shape then depends on
		// what the script passed, never on how many times the event failed.
		return writeJSON(env.stdout, list)
	}
	ids := make([]int64, len(list))
	for i, d := range list {
		ids[i] = d.ID
	}
	fmt.Fprintf(env.stdout, "delivery id %s: %s, oldest first\n", refs.deliveryIDs[0], describeDeadLetters(ids))
	for _, d := range list {
		fmt.Fprintln(env.stdout)
		if err := printDeadLetter(env.stdout, d); err != nil {
			return err
		}
	}
	return nil
}

// describeDeadLetters names the rows a delivery id selected: "no dead letters",
// "dead letter 5", or "3 dead letters (5, 9, 12)".
func describeDeadLetters(ids []int64) string {
	switch len(ids) {
	case 0:
		return "no dead letters"
	case 1:
		return "dead letter " + strconv.FormatInt(ids[0], 10)
	}
	return fmt.Sprintf("%d dead letters (%s)", len(ids), joinIDs(ids))
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
	fmt.Fprintf(tw, "endpoint_id\t%s\n", orNone(d.EndpointID, "-"))
	fmt.Fprintf(tw, "tenant\t%s\n", orNone(d.Tenant, "-"))
	if d.OrderKey != nil {
		fmt.Fprintf(tw, "order_key\t%d (a replay keeps it)\n", *d.OrderKey)
	} else {
		fmt.Fprintf(tw, "order_key\t- (unordered)\n")
	}
	// A managed endpoint's delivery has no endpoint_url of its own: it goes to the URL the
	// endpoint has when replayed, not to WEBHOOK_URL.
	noURL := "- (the configured WEBHOOK_URL)"
	if d.EndpointID != nil {
		noURL = "- (the managed endpoint's URL)"
	}
	fmt.Fprintf(tw, "endpoint_url\t%s\n", orNone(d.EndpointURL, noURL))
	fmt.Fprintf(tw, "attempts\t%d\n", d.Attempts)
	if d.LastStatus != nil {
		fmt.Fprintf(tw, "last_status\t%d\n", *d.LastStatus)
	} else {
		fmt.Fprintf(tw, "last_status\t-\n")
	}
	fmt.Fprintf(tw, "last_error\t%s\n", orNone(d.LastError, "-"))
	switch {
	case d.LastResponseExcerpt != nil && *d.LastResponseExcerpt == "":
		fmt.Fprintf(tw, "last_answer\t- (an empty body)\n")
	case d.LastResponseExcerpt != nil:
		fmt.Fprintf(tw, "last_answer\t%s\n", printable(*d.LastResponseExcerpt))
	default:
		fmt.Fprintf(tw, "last_answer\t- (none kept)\n")
	}
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
	ID           int64
	DeliveryID   string
	EventType    string
	ReplayedAt   *time.Time
	EndpointID   *string
	SupersededBy *int64 // a later dead letter of the same delivery to the same destination
	Tenant       *string
	// EndpointRemoved: its managed endpoint no longer exists; replayed to it, the event would
	// only be dead-lettered again, so it is replayed only with --to-endpoint.
	EndpointRemoved bool
	// EndpointOtherTenant: its managed endpoint now belongs to another tenant (EndpointTenant,
	// nil for none); the event goes back there never, only with --to-endpoint to an endpoint
	// of its own tenant.
	EndpointOtherTenant bool
	EndpointTenant      *string
}

// replayTarget is the endpoint --to-endpoint names.
type replayTarget struct {
	id      string
	tenant  *string
	ordered bool
}

func runDLQReplay(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("dlq replay", env, "fluxhook dlq replay [--force] [--dry-run] [--to-endpoint ID] ID|DELIVERY-ID... | --all-matching FILTER...")
	dbURL := databaseURLFlag(fs, env)
	all := fs.Bool("all-matching", false, "replay every dead letter matching the filters (at least one filter required)")
	filter := addDLQFilterFlags(fs)
	force := fs.Bool("force", false, "replay rows that were already replayed")
	dryRun := fs.Bool("dry-run", false, "report what would be replayed and change nothing")
	var toEndpoint uuidValue
	fs.Var(&toEndpoint, "to-endpoint", "send the events to this enabled managed endpoint instead of their own (the one a removed endpoint's dead letters need); only events of its tenant go")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	refs, err := selection("replay", positional, *all, filter, false)
	if err != nil {
		return err
	}

	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	var out replayOutcome
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var rows pgx.Rows
		if *all {
			rows, _ = tx.Query(ctx, dlqLockMatchingSQL, filter.sqlArgs()...)
		} else {
			rows, _ = tx.Query(ctx, dlqLockIDsSQL, nonNil(refs.ids), nonNil(refs.deliveryIDs))
		}
		locked, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lockedDeadLetter, error) {
			var l lockedDeadLetter
			return l, r.Scan(&l.ID, &l.DeliveryID, &l.EventType, &l.ReplayedAt, &l.EndpointID, &l.SupersededBy,
				&l.Tenant, &l.EndpointRemoved, &l.EndpointOtherTenant, &l.EndpointTenant)
		})
		if err != nil {
			return fmt.Errorf("reading dead letters: %w", err)
		}
		var target *replayTarget
		if toEndpoint != "" {
			if target, err = lockReplayTarget(ctx, tx, string(toEndpoint)); err != nil {
				return err
			}
			out.target = target
		}
		if !*all {
			if err := refs.missing(locked, "nothing replayed"); err != nil {
				return err
			}
			out.selected = refs.selected(locked)
		}
		toTarget := map[string]bool{} // delivery ids replayed so far (to the target, with one)
		for _, l := range locked {
			switch {
			case l.ReplayedAt != nil && !*force:
				out.skip = append(out.skip, l)
			case target == nil && l.EndpointRemoved:
				out.removed = append(out.removed, l)
			case target == nil && l.EndpointOtherTenant:
				out.ownOtherTenant = append(out.ownOtherTenant, l)
			case target != nil && !sameTenant(l.Tenant, target.tenant):
				out.otherTenant = append(out.otherTenant, l)
			case target != nil && toTarget[l.DeliveryID]:
				// An event fanned out to several endpoints has a dead letter for each: to one
				// target it goes once.
				out.sameEvent = append(out.sameEvent, l)
			case l.SupersededBy != nil && !slices.Contains(refs.ids, l.ID):
				// Selected through its delivery id or a filter, not by name: the newer dead
				// letter stands for this delivery to this endpoint, and replaying both would
				// send the event there twice in one go.
				out.superseded = append(out.superseded, l)
			default:
				out.replay = append(out.replay, l)
				toTarget[l.DeliveryID] = true
			}
		}
		if *dryRun || len(out.replay) == 0 {
			return nil
		}
		replayIDs := make([]int64, len(out.replay))
		for i, l := range out.replay {
			replayIDs[i] = l.ID
		}
		var n int64
		var targetID any
		ordered := false
		if target != nil {
			targetID, ordered = target.id, target.ordered
		}
		var keyless []int64
		if err := tx.QueryRow(ctx, dlqReplaySQL, replayIDs, targetID, ordered).Scan(&n, &keyless); err != nil {
			return fmt.Errorf("replaying: %w", err)
		}
		if n != int64(len(out.replay)) {
			return fmt.Errorf("replaying: wrote %d outbox rows for %d dead letters; rolled back", n, len(out.replay))
		}
		if len(keyless) > 0 {
			// Rows of this transaction, which no claim sees before it commits: none can be
			// taken without its key.
			if _, err := tx.Exec(ctx, `UPDATE webhook_outbox SET order_key = id WHERE id = ANY($1)`, keyless); err != nil {
				return fmt.Errorf("replaying: keying the events that join an ordered stream: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := out.print(env.stdout, *all, *dryRun); err != nil {
		return err
	}
	if skipped := len(out.skip) + len(out.superseded) + len(out.removed) + len(out.otherTenant) + len(out.ownOtherTenant) +
		len(out.sameEvent); len(out.replay) == 0 && skipped > 0 && !*dryRun {
		// Asked to replay, and did nothing: a script must not take that for success.
		return fmt.Errorf("nothing replayed: each of the %d dead letters selected was skipped, for the reason above", skipped)
	}
	return nil
}

// lockReplayTarget reads and locks (against removal or disabling until the replay commits)
// the endpoint --to-endpoint names, refusing one that does not exist or is disabled: a replay
// to it would only be dead-lettered again.
func lockReplayTarget(ctx context.Context, tx pgx.Tx, id string) (*replayTarget, error) {
	t := &replayTarget{id: id}
	var enabled bool
	err := tx.QueryRow(ctx, `SELECT tenant, enabled, ordering = 'stream' FROM webhook_endpoints WHERE id = $1::uuid FOR SHARE`, id).
		Scan(&t.tenant, &enabled, &t.ordered)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("--to-endpoint: endpoint %s not found; nothing replayed (fluxhook endpoints list shows the endpoints)", id)
	}
	if err != nil {
		return nil, fmt.Errorf("--to-endpoint: reading endpoint %s: %w", id, err)
	}
	if !enabled {
		return nil, fmt.Errorf("--to-endpoint: endpoint %s is disabled; nothing replayed: enable it first (fluxhook endpoints enable %s)", id, id)
	}
	return t, nil
}

// sameTenant says whether an event of tenant a may go to an endpoint of tenant b: both
// without one, or the same one. Never across tenants, replays included.
func sameTenant(a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// replayOutcome is what a replay did, or would do with --dry-run: selected says which rows
// each delivery id argument stood for; target is --to-endpoint's endpoint, nil without it.
type replayOutcome struct {
	selected                                                  []string
	target                                                    *replayTarget
	replay, skip, superseded, removed, otherTenant, sameEvent []lockedDeadLetter
	// ownOtherTenant: replayed to their own endpoint, whose tenant has changed since.
	ownOtherTenant []lockedDeadLetter
}

func (o *replayOutcome) print(w io.Writer, all, dryRun bool) error {
	if all && len(o.replay)+len(o.skip)+len(o.superseded)+len(o.removed)+len(o.otherTenant)+len(o.ownOtherTenant)+len(o.sameEvent) == 0 {
		_, err := fmt.Fprintln(w, "no dead letters match")
		return err
	}
	for _, s := range o.selected {
		fmt.Fprintln(w, s)
	}
	verb := "replayed"
	if dryRun {
		verb = "would replay"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, l := range o.replay {
		endpoint := ""
		switch {
		case o.target != nil:
			endpoint = " to endpoint_id " + o.target.id
		case l.EndpointID != nil:
			endpoint = " endpoint_id " + *l.EndpointID
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\tdelivery_id %s%s\n", verb, l.ID, printable(l.EventType), l.DeliveryID, endpoint)
	}
	for _, l := range o.skip {
		fmt.Fprintf(tw, "skipped\t%d\t%s\talready replayed at %s; --force replays it again\n", l.ID, printable(l.EventType), formatTime(*l.ReplayedAt))
	}
	for _, l := range o.superseded {
		fmt.Fprintf(tw, "skipped\t%d\t%s\tsuperseded by dead letter %d (same delivery, same endpoint); replay %d by its ID to send it anyway\n",
			l.ID, printable(l.EventType), *l.SupersededBy, l.ID)
	}
	for _, l := range o.removed {
		fmt.Fprintf(tw, "skipped\t%d\t%s\tits endpoint %s was removed; --to-endpoint ID replays it to another endpoint of its tenant\n",
			l.ID, printable(l.EventType), *l.EndpointID)
	}
	for _, l := range o.sameEvent {
		fmt.Fprintf(tw, "skipped\t%d\t%s\tthe same event (delivery_id %s) already goes to endpoint %s once\n",
			l.ID, printable(l.EventType), l.DeliveryID, o.target.id)
	}
	for _, l := range o.otherTenant {
		fmt.Fprintf(tw, "skipped\t%d\t%s\tits tenant (%s) is not endpoint %s's (%s): events never cross tenants\n",
			l.ID, printable(l.EventType), tenantName(l.Tenant), o.target.id, tenantName(o.target.tenant))
	}
	for _, l := range o.ownOtherTenant {
		fmt.Fprintf(tw, "skipped\t%d\t%s\tits endpoint %s now belongs to %s, not to the event's tenant (%s): events never cross tenants; --to-endpoint ID replays it to an endpoint of its tenant\n",
			l.ID, printable(l.EventType), *l.EndpointID, tenantName(l.EndpointTenant), tenantName(l.Tenant))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	summary := fmt.Sprintf("%s %d", verb, len(o.replay))
	if len(o.skip) > 0 {
		summary += fmt.Sprintf(", skipped %d already replayed", len(o.skip))
	}
	if len(o.superseded) > 0 {
		summary += fmt.Sprintf(", skipped %d superseded", len(o.superseded))
	}
	if len(o.removed) > 0 {
		summary += fmt.Sprintf(", skipped %d of removed endpoints", len(o.removed))
	}
	if n := len(o.otherTenant) + len(o.ownOtherTenant); n > 0 {
		summary += fmt.Sprintf(", skipped %d of other tenants", n)
	}
	if len(o.sameEvent) > 0 {
		summary += fmt.Sprintf(", skipped %d of events already going there", len(o.sameEvent))
	}
	if dryRun {
		summary += " (dry run: nothing changed)"
	}
	_, err := fmt.Fprintln(w, summary)
	return err
}

// tenantName is how replay's messages name a tenant, "no tenant" for none.
func tenantName(t *string) string {
	if t == nil {
		return "no tenant"
	}
	return printable(*t)
}

// dlqRefs are the dead letters named on a command line: row ids, and delivery ids each of
// which may stand for several rows. Each list is in argument order without duplicates, so
// that `replay 7 7` replays once.
type dlqRefs struct {
	ids         []int64
	deliveryIDs []string // canonical, as canonicalUUID returns them
}

// parseRefs parses ID|DELIVERY-ID arguments: a positive integer is a row id, a UUID a delivery
// id, and anything else is a usage error naming the argument.
func parseRefs(args []string) (dlqRefs, error) {
	var r dlqRefs
	for _, a := range args {
		if id, err := strconv.ParseInt(a, 10, 64); err == nil && id > 0 {
			if !slices.Contains(r.ids, id) {
				r.ids = append(r.ids, id)
			}
			continue
		}
		d, ok := canonicalUUID(a)
		if !ok {
			return dlqRefs{}, usageError("%q is not a dead-letter id (a positive integer, the ID column of dlq list) or a delivery id (a UUID like 0b6f3c1e-9a4d-4c52-8f0e-3d2a1b4c5d6e)", a)
		}
		if !slices.Contains(r.deliveryIDs, d) {
			r.deliveryIDs = append(r.deliveryIDs, d)
		}
	}
	return r, nil
}

// missing returns an error naming the row ids not found and the delivery ids without a dead
// letter, ending with consequence, or nil when every reference found something.
func (r dlqRefs) missing(found []lockedDeadLetter, consequence string) error {
	var ids []int64
	for _, id := range r.ids {
		if !slices.ContainsFunc(found, func(l lockedDeadLetter) bool { return l.ID == id }) {
			ids = append(ids, id)
		}
	}
	var deliveries []string
	for _, d := range r.deliveryIDs {
		if !slices.ContainsFunc(found, func(l lockedDeadLetter) bool { return l.DeliveryID == d }) {
			deliveries = append(deliveries, d)
		}
	}
	var parts []string
	if len(ids) > 0 {
		parts = append(parts, fmt.Sprintf("dead letter %s not found", joinIDs(ids)))
	}
	if len(deliveries) > 0 {
		parts = append(parts, fmt.Sprintf("no dead letter has delivery id %s", strings.Join(deliveries, ", ")))
	}
	if len(parts) == 0 {
		return nil
	}
	return fmt.Errorf("%s; %s", strings.Join(parts, "; "), consequence)
}

// selected says, for each delivery id argument, which of the rows found it stands for: the
// message that keeps a delivery id with several dead letters from acting on more than the
// operator expected without saying so.
func (r dlqRefs) selected(found []lockedDeadLetter) []string {
	var lines []string
	for _, d := range r.deliveryIDs {
		var ids []int64
		for _, l := range found {
			if l.DeliveryID == d {
				ids = append(ids, l.ID)
			}
		}
		lines = append(lines, fmt.Sprintf("delivery id %s: %s", d, describeDeadLetters(ids)))
	}
	return lines
}

// nonNil passes an empty list to PostgreSQL as an empty array rather than NULL, so that
// `= ANY` over it is false, not unknown.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func dashIfNil(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
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
// ids and delivery ids, or --all-matching with at least one filter, never neither and never
// both. For purge, --replayed-only (narrowing) is a filter of its own: "everything already
// replayed" is a deliberate choice, unlike "everything". It returns the references (none with
// --all-matching).
func selection(verb string, positional []string, all bool, filter *dlqFilter, narrowing bool) (dlqRefs, error) {
	const filters = "--event-type, --reason-contains, --since, --delivery-id or --endpoint-id"
	switch {
	case all && len(positional) > 0:
		return dlqRefs{}, usageError("give dead-letter ids or --all-matching, not both")
	case all && filter.empty() && !narrowing:
		also := ""
		if verb == "purge" {
			also = " (or --replayed-only)"
		}
		return dlqRefs{}, usageError("--all-matching needs at least one of %s%s; %s every dead letter at once is never what was meant", filters, also, gerund(verb))
	case !all && !filter.empty():
		return dlqRefs{}, usageError("--event-type, --reason-contains, --since, --delivery-id and --endpoint-id select rows only with --all-matching (a delivery id can also be given as an argument)")
	case !all && len(positional) == 0:
		return dlqRefs{}, usageError("dlq %s needs dead-letter ids or delivery ids, or --all-matching with a filter", verb)
	case !all:
		return parseRefs(positional)
	}
	return dlqRefs{}, nil
}

func gerund(verb string) string {
	if verb == "purge" {
		return "purging"
	}
	return verb + "ing"
}
