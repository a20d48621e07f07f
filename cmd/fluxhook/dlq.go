package main

import (
	"bytes"
	"context"
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

	"github.com/fluxora/fluxhook/sql/audit"
	"github.com/fluxora/fluxhook/sql/deadletters"
	"github.com/fluxora/fluxhook/sql/outbox"
)

// The dead letters' logic (the SQL, what replay skips and why, purge) is package
// sql/deadletters, which the management API shares: what is here is the command line, its
// flags, its messages and its exit statuses.

func init() {
	commands["dlq"] = command{summary: "List, show, replay and purge dead letters", run: runDLQ}
}

// dlqSubcommands are dlq's subcommands in the order its help lists them; runDLQ dispatches on
// them, and the help test walks them, so that one cannot be added without a help page.
var dlqSubcommands = []subcommand{
	{"list", runDLQList},
	{"show", runDLQShow},
	{"replay", runDLQReplay},
	{"purge", runDLQPurge},
}

// runDLQ is the operator's way back from a dead letter: see why events failed, then send them
// again once the consumer is fixed, without writing SQL by hand.
func runDLQ(ctx context.Context, env *environment, args []string) error {
	return runGroup(ctx, env, "dlq", "[ID|DELIVERY-ID...] [flags]", dlqSubcommands, args, func(err error) error { return err })
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
	fs.StringVar(&f.eventType, "event-type", "", "only this event `type` (exact match)")
	fs.StringVar(&f.reasonContains, "reason-contains", "", "only reasons containing this `text` (case-insensitive)")
	fs.Var((*sinceValue)(&f.since), "since", "only dead letters that failed within this long of now (e.g. 36h, 7d)")
	document(fs, "since", flagDoc{Placeholder: "DURATION"})
	fs.Var((*uuidValue)(&f.deliveryID), "delivery-id", "only dead letters of this delivery id (every endpoint and every time it failed)")
	document(fs, "delivery-id", flagDoc{Placeholder: "UUID"})
	fs.Var((*uuidValue)(&f.endpointID), "endpoint-id", "only dead letters of this managed endpoint (see fluxhook endpoints list)")
	document(fs, "endpoint-id", flagDoc{Placeholder: "UUID"})
	return f
}

func (f *dlqFilter) empty() bool {
	return f.eventType == "" && f.reasonContains == "" && f.since == 0 && f.deliveryID == "" && f.endpointID == ""
}

// toFilter returns the filter as deadletters takes it. --since counts back from the
// database's clock, as it always did (FailedWithin), not from this machine's.
func (f *dlqFilter) toFilter() deadletters.Filter {
	return deadletters.Filter{
		EventType:      f.eventType,
		ReasonContains: f.reasonContains,
		FailedWithin:   f.since,
		DeliveryID:     f.deliveryID,
		EndpointID:     f.endpointID,
	}
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

// canonicalUUID is the UUID form every id argument takes (see deadletters.CanonicalUUID).
var canonicalUUID = deadletters.CanonicalUUID

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

// deadLetter is one webhook_dead_letter row as list, show and their --json print it (see
// deadletters.DeadLetter: the JSON names are an interface for scripts).
type deadLetter = deadletters.DeadLetter

// redactDeadLetter redacts a password in d's endpoint_url the way every URL the commands
// print is redacted (deadletters already masks the user info's password; this also masks a
// password= query parameter).
func redactDeadLetter(d *deadLetter) {
	if d.EndpointURL != nil {
		redacted := redactURL(*d.EndpointURL)
		d.EndpointURL = &redacted
	}
}

func runDLQList(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("dlq list", env, "fluxhook dlq list [--limit N] [--event-type TYPE] [--reason-contains TEXT] [--since DURATION] [--delivery-id UUID] [--endpoint-id UUID] [--json]")
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

	f := filter.toFilter()
	f.Limit = *limit
	list, err := deadletters.List(ctx, pool, f)
	if err != nil {
		return err
	}
	for i := range list {
		redactDeadLetter(&list[i])
	}
	if len(list) == *limit {
		fmt.Fprintf(env.stderr, "showing the %d most recent matches; raise --limit to see more\n", *limit)
	}
	if *asJSON {
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

	if len(refs.ids) == 1 {
		// A row id names one row, and its JSON stays the one object it always was.
		d, err := deadletters.Get(ctx, pool, refs.ids[0], nil)
		if err != nil {
			return notFound(err, "")
		}
		redactDeadLetter(&d)
		if *asJSON {
			return writeJSON(env.stdout, d)
		}
		return printDeadLetter(env.stdout, d)
	}
	list, err := deadletters.ByDelivery(ctx, pool, refs.deliveryIDs[0], nil)
	if err != nil {
		return notFound(err, "")
	}
	for i := range list {
		redactDeadLetter(&list[i])
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

func runDLQReplay(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("dlq replay", env, "fluxhook dlq replay [--force] [--dry-run] [--to-endpoint ID] ID|DELIVERY-ID... | --all-matching FILTER...")
	dbURL := databaseURLFlag(fs, env)
	all := fs.Bool("all-matching", false, "replay every dead letter matching the filters (at least one filter required)")
	filter := addDLQFilterFlags(fs)
	force := fs.Bool("force", false, "replay rows that were already replayed")
	dryRun := fs.Bool("dry-run", false, "report what would be replayed and change nothing")
	var toEndpoint uuidValue
	fs.Var(&toEndpoint, "to-endpoint", "send the events to this enabled managed endpoint instead of their own (the one a removed endpoint's dead letters need); only events of its tenant go")
	document(fs, "to-endpoint", flagDoc{Placeholder: "ID"})
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

	sel := deadletters.Selection{IDs: refs.ids, DeliveryIDs: refs.deliveryIDs}
	if *all {
		f := filter.toFilter()
		sel = deadletters.Selection{Matching: &f}
	}
	opts := deadletters.Options{Force: *force, DryRun: *dryRun, ToEndpoint: string(toEndpoint)}
	var out deadletters.Outcome
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if out, err = deadletters.Replay(ctx, tx, sel, opts); err != nil {
			return err
		}
		return audit.RecordAll(ctx, tx, deadletters.AuditReplays(out, audit.CLIActor(), opts))
	})
	switch {
	case errors.Is(err, deadletters.ErrEndpointNotFound):
		return fmt.Errorf("--to-endpoint: endpoint %s not found; nothing replayed (fluxhook endpoints list shows the endpoints)", toEndpoint)
	case errors.Is(err, deadletters.ErrEndpointDisabled):
		return fmt.Errorf("--to-endpoint: endpoint %s is disabled; nothing replayed: enable it first (fluxhook endpoints enable %s)", toEndpoint, toEndpoint)
	case errors.Is(err, deadletters.ErrNotFound):
		return notFound(err, "replayed")
	case err != nil:
		return err
	}
	if *all && len(out.Replayed)+len(out.Skipped) == 0 && !*dryRun {
		// Asked to replay, and nothing matched: a script must not take that for success.
		return errors.New("nothing replayed: no dead letter matches the filters; fluxhook dlq list with the same filters shows what they match")
	}
	o := replayOutcome{Outcome: out}
	if !*all {
		o.selected = refs.selected(refsOf(out.Rows()))
	}
	if err := o.print(env.stdout, *all, *dryRun); err != nil {
		return err
	}
	if skipped := len(out.Skipped); len(out.Replayed) == 0 && skipped > 0 && !*dryRun {
		// Asked to replay, and did nothing: a script must not take that for success.
		return fmt.Errorf("nothing replayed: each of the %d dead letters selected was skipped, for the reason above", skipped)
	}
	return nil
}

// replayOutcome is what a replay did, or would do with --dry-run, and selected says which
// rows each delivery id argument stood for.
type replayOutcome struct {
	deadletters.Outcome
	selected []string
}

func (o *replayOutcome) print(w io.Writer, all, dryRun bool) error {
	if all && len(o.Replayed)+len(o.Skipped) == 0 {
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
	for _, l := range o.Replayed {
		endpoint := ""
		switch {
		case o.Target != nil:
			endpoint = " to endpoint_id " + o.Target.ID
		case l.EndpointID != nil:
			endpoint = " endpoint_id " + *l.EndpointID
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\tdelivery_id %s%s\n", verb, l.ID, printable(l.EventType), l.DeliveryID, endpoint)
	}
	for _, reason := range deadletters.SkipReasons {
		for _, l := range o.SkippedFor(reason) {
			fmt.Fprintf(tw, "skipped\t%d\t%s\t%s\n", l.ID, printable(l.EventType), o.why(l))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	summary := fmt.Sprintf("%s %d", verb, len(o.Replayed))
	if n := len(o.SkippedFor(deadletters.SkipAlreadyReplayed)); n > 0 {
		summary += fmt.Sprintf(", skipped %d already replayed", n)
	}
	if n := len(o.SkippedFor(deadletters.SkipSuperseded)); n > 0 {
		summary += fmt.Sprintf(", skipped %d superseded", n)
	}
	if n := len(o.SkippedFor(deadletters.SkipEndpointRemoved)); n > 0 {
		summary += fmt.Sprintf(", skipped %d of removed endpoints", n)
	}
	if n := len(o.SkippedFor(deadletters.SkipOtherTenant)) + len(o.SkippedFor(deadletters.SkipEndpointOtherTenant)); n > 0 {
		summary += fmt.Sprintf(", skipped %d of other tenants", n)
	}
	if n := len(o.SkippedFor(deadletters.SkipSameEvent)); n > 0 {
		summary += fmt.Sprintf(", skipped %d of events already going there", n)
	}
	if n := len(o.SkippedFor(deadletters.SkipURLTooLong)); n > 0 {
		summary += fmt.Sprintf(", skipped %d with a URL over %d bytes", n, outbox.MaxEndpointURLBytes)
	}
	if dryRun {
		summary += " (dry run: nothing changed)"
	}
	_, err := fmt.Fprintln(w, summary)
	return err
}

// why says why a dead letter was skipped, and what replays it if anything does.
func (o *replayOutcome) why(l deadletters.Skip) string {
	switch l.Reason {
	case deadletters.SkipAlreadyReplayed:
		return fmt.Sprintf("already replayed at %s; --force replays it again", formatTime(*l.ReplayedAt))
	case deadletters.SkipSuperseded:
		return fmt.Sprintf("superseded by dead letter %d (same delivery, same endpoint); replay %d by its ID to send it anyway",
			*l.SupersededBy, l.ID)
	case deadletters.SkipEndpointRemoved:
		return fmt.Sprintf("its endpoint %s was removed; --to-endpoint ID replays it to another endpoint of its tenant", *l.EndpointID)
	case deadletters.SkipSameEvent:
		return fmt.Sprintf("the same event (delivery_id %s) already goes to endpoint %s once", l.DeliveryID, o.Target.ID)
	case deadletters.SkipOtherTenant:
		return fmt.Sprintf("its tenant (%s) is not endpoint %s's (%s): events never cross tenants",
			tenantName(l.Tenant), o.Target.ID, tenantName(o.Target.Tenant))
	case deadletters.SkipURLTooLong:
		return fmt.Sprintf("its endpoint_url is longer than the %d bytes the queue takes; --to-endpoint ID replays it to a managed endpoint",
			outbox.MaxEndpointURLBytes)
	case deadletters.SkipEndpointOtherTenant:
		return fmt.Sprintf("its endpoint %s now belongs to %s, not to the event's tenant (%s): events never cross tenants; --to-endpoint ID replays it to an endpoint of its tenant",
			*l.EndpointID, tenantName(l.EndpointTenant), tenantName(l.Tenant))
	}
	return string(l.Reason)
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

// selected says, for each delivery id argument, which of the rows found it stands for: the
// message that keeps a delivery id with several dead letters from acting on more than the
// operator expected without saying so.
func (r dlqRefs) selected(found []deadletters.Ref) []string {
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

// refsOf returns the references of rows.
func refsOf(rows []deadletters.Row) []deadletters.Ref {
	refs := make([]deadletters.Ref, len(rows))
	for i, r := range rows {
		refs[i] = r.Ref
	}
	return refs
}

func dashIfNil(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// joinIDs writes row ids as the messages name them: "5, 9, 12".
var joinIDs = deadletters.JoinIDs

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
