package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/audit"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/stages/send"
)

func init() {
	commands["endpoints"] = command{summary: "Manage webhook endpoints: add, list, show, update, disable, enable, rotate-secret, remove, reencrypt", run: runEndpoints}
}

// endpointsSubcommands are endpoints' subcommands in the order its help lists them;
// runEndpoints dispatches on them, and the help test walks them, so that one cannot be added
// without a help page.
var endpointsSubcommands = []subcommand{
	{"add", runEndpointsAdd},
	{"list", runEndpointsList},
	{"show", runEndpointsShow},
	{"update", runEndpointsUpdate},
	{"disable", runEndpointsDisable},
	{"enable", runEndpointsEnable},
	{"rotate-secret", runEndpointsRotateSecret},
	{"remove", runEndpointsRemove},
	{"reencrypt", runEndpointsReencrypt},
}

// runEndpoints manages webhook_endpoints without hand-written SQL: the operator's way to add a
// consumer, change its filter, rotate its secret or retire it, with every value validated as
// the dispatcher will validate it.
func runEndpoints(ctx context.Context, env *environment, args []string) error {
	return runGroup(ctx, env, "endpoints", "[ID] [flags]", endpointsSubcommands, args, endpointsError)
}

// endpointsError turns the store's validation errors into usage errors (exit status 2) that
// name the flag to fix, its refusal to remove an endpoint with pending deliveries into the
// flags that decide their fate, and an unknown id into where the ids are listed.
func endpointsError(err error) error {
	var inv *endpoints.InvalidError
	var pending *endpoints.PendingError
	switch {
	case errors.As(err, &inv):
		return usageError("--%s: %v", fieldFlag(inv.Field), inv.Err)
	case errors.As(err, &pending):
		return fmt.Errorf("endpoint %s has %s pending; nothing was removed: pass --pending dead-letter (kept in the dead-letter table) or --pending drop (lost)",
			pending.ID, plural(int(pending.Pending), "delivery", "deliveries"))
	case errors.Is(err, endpoints.ErrNotFound):
		return fmt.Errorf("%w; list them with fluxhook endpoints list", err)
	}
	return err
}

// fieldFlag names the flag that sets a field of webhook_endpoints.
func fieldFlag(field string) string {
	if field == "headers" {
		return "header"
	}
	return strings.ReplaceAll(field, "_", "-")
}

// endpointsEnv is what every endpoints subcommand opens: the database and the cipher built
// from WEBHOOK_ENCRYPTION_KEY and WEBHOOK_ENCRYPTION_KEY_PREVIOUS. The keys are read from the
// environment only (the variable, or a file named by its _FILE variable): a flag would put
// them in the shell history and the process list.
func endpointsEnv(ctx context.Context, env *environment, dbURL string) (*pgxpool.Pool, *endpoints.Cipher, error) {
	key, err := secretEnv(env, "WEBHOOK_ENCRYPTION_KEY")
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	previous, err := secretEnv(env, "WEBHOOK_ENCRYPTION_KEY_PREVIOUS")
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	c, err := endpoints.NewCipher(key, previous)
	if err != nil {
		return nil, nil, usageError("%v", err)
	}
	pool, err := connectCurrent(ctx, dbURL)
	if err != nil {
		return nil, nil, err
	}
	return pool, c, nil
}

// warnClear says, where a secret is written, that it is stored readable by anyone who can
// read the table, and how to fix it.
func warnClear(env *environment, c *endpoints.Cipher) {
	if !c.HasKey() {
		fmt.Fprintln(env.stderr, "warning: WEBHOOK_ENCRYPTION_KEY is not set, so the secret is stored in clear in webhook_endpoints;"+
			" set it (openssl rand -base64 32) and run `fluxhook endpoints reencrypt`")
	}
}

// oneID parses flags and the one endpoint id a subcommand takes.
func oneID(fs *flag.FlagSet, args []string, sub string) (string, error) {
	positional, err := parseFlags(fs, args)
	if err != nil {
		return "", err
	}
	if len(positional) != 1 {
		return "", usageError("endpoints %s takes exactly one endpoint id (see `fluxhook endpoints list`)", sub)
	}
	return positional[0], nil
}

// optString is a string flag that remembers whether it was given, for update, where "not
// given" (leave it) and "given empty" (clear it) differ.
type optString struct {
	set bool
	v   string
}

func (o *optString) String() string {
	if o == nil {
		return ""
	}
	return o.v
}

func (o *optString) Set(s string) error { o.set, o.v = true, s; return nil }

func (o *optString) ptr() *string {
	if !o.set {
		return nil
	}
	return &o.v
}

// optInt is optString for integers: 0 restores the dispatcher's default.
type optInt struct {
	set bool
	v   int
}

func (o *optInt) String() string {
	if o == nil || !o.set {
		return ""
	}
	return strconv.Itoa(o.v)
}

func (o *optInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("want a whole number ≥ 0 (0 = the dispatcher's default), got %q", s)
	}
	o.set, o.v = true, n
	return nil
}

func (o *optInt) ptr() *int {
	if !o.set {
		return nil
	}
	return &o.v
}

// headerFlag collects repeated --header NAME=VALUE flags.
type headerFlag map[string]string

func (h headerFlag) String() string { return "" }

func (h headerFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=VALUE, got %q", s)
	}
	h[name] = value
	return nil
}

// eventTypes splits a --event-types list; "" is the empty filter (every event). Spaces after
// commas are forgiven, since "a, b" is how people write lists.
func eventTypes(s string) []string {
	list := []string{}
	if strings.TrimSpace(s) == "" {
		return list
	}
	for _, t := range strings.Split(s, ",") {
		list = append(list, strings.TrimSpace(t))
	}
	return list
}

// endpointReport is an endpoint as the subcommands' --json prints it: the fields of show,
// plus the secret where fluxhook just generated one (add, rotate-secret, a scheme change), the
// only moment it is ever printed.
type endpointReport struct {
	endpoints.Details
	Secret string `json:"secret,omitempty"`
}

// changeEndpoint opens the database of an endpoints subcommand that names one endpoint, runs
// change on it in one transaction recorded in the audit trail as action by the CLI's user
// (endpoints.Audited; nil change: a read, not recorded), runs then on the pool after the
// commit (work that cannot run in a transaction, such as an index built concurrently), and
// reads the endpoint back, as every such subcommand reports it: as stored after the change. It
// returns the Cipher too, for what the caller prints.
func changeEndpoint(ctx context.Context, env *environment, dbURL, id, action string,
	change func(tx pgx.Tx, c *endpoints.Cipher) error, then ...func(*pgxpool.Pool)) (endpoints.Details, *endpoints.Cipher, error) {
	pool, c, err := endpointsEnv(ctx, env, dbURL)
	if err != nil {
		return endpoints.Details{}, nil, err
	}
	defer pool.Close()
	if change != nil {
		_, err := endpoints.Audited(ctx, pool, c, id, nil, audit.CLIActor(), action, func(tx pgx.Tx) error { return change(tx, c) })
		if err != nil {
			return endpoints.Details{}, nil, err
		}
	}
	for _, f := range then {
		f(pool)
	}
	d, err := describe(ctx, pool, c, id)
	return d, c, err
}

// describe reads an endpoint back after a change, for printing it as show does.
func describe(ctx context.Context, pool *pgxpool.Pool, c *endpoints.Cipher, id string) (endpoints.Details, error) {
	d, err := endpoints.Describe(ctx, pool, c, id)
	if err != nil {
		return d, err
	}
	d.Endpoint = forDisplay(d.Endpoint)
	return d, nil
}

// forDisplay readies an endpoint for output: the password of a URL stored by SQL masked, and
// the values of headers that look like credentials (Authorization, a token, an API key)
// masked, since show and list must never print a secret, and such a header is one.
func forDisplay(e endpoints.Endpoint) endpoints.Endpoint {
	e.Secret, e.PreviousSecret = "", ""
	e.URL = redactURL(e.URL)
	h := maps.Clone(e.Headers)
	for k := range h {
		if endpoints.SensitiveHeader(k) {
			h[k] = redactedPassword
		}
	}
	e.Headers = h
	return e
}

// shownSecret is the new secret a command may print: one fluxhook generated, which the operator
// sees nowhere else, and never one they gave (--secret, --secret-file, standard input): they
// have it, and printed it would only reach a terminal's scrollback or a CI log.
func shownSecret(given, secret string) string {
	if given != "" {
		return ""
	}
	return secret
}

// printSecret prints a new secret once, with what the operator must do about it; "" (one the
// operator gave, see shownSecret) is only said to be in use.
func printSecret(w io.Writer, id, secret string) {
	if secret == "" {
		fmt.Fprintln(w, "It signs with the secret you gave, which is not printed.")
		return
	}
	fmt.Fprintf(w, "\n  secret: %s\n\n", secret)
	fmt.Fprintf(w, "Store this secret now, in the consumer's configuration: it is not shown again.\n")
	fmt.Fprintf(w, "(If it is lost, `fluxhook endpoints rotate-secret %s` issues a new one.)\n", id)
}

func runEndpointsAdd(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("endpoints add", env, "fluxhook endpoints add --url URL [flags]")
	dbURL := databaseURLFlag(fs, env)
	var n endpoints.New
	fs.StringVar(&n.URL, "url", "", "where deliveries go: https://..., or http:// for a loopback host (required)")
	document(fs, "url", flagDoc{Placeholder: "URL"})
	types := fs.String("event-types", "", `comma-separated event types and "prefix.*" patterns`)
	document(fs, "event-types", flagDoc{Placeholder: "TYPES", Default: "every event"})
	fs.StringVar(&n.Tenant, "tenant", "", "receive only this tenant's events")
	document(fs, "tenant", flagDoc{Placeholder: "TENANT", Default: "events without a tenant"})
	fs.StringVar(&n.Scheme, "scheme", endpoints.SchemeFluxora, "how requests are signed (docs/wire-format.md)")
	document(fs, "scheme", flagDoc{Placeholder: "fluxora|standard", Default: endpoints.SchemeFluxora})
	secret := fs.String("secret", "", "signing secret, or - to read it from standard input")
	document(fs, "secret", flagDoc{Placeholder: "SECRET", Default: "generated and printed once (standard: whsec_ + base64)"})
	secretFile := fs.String("secret-file", "", "read the signing secret from this `file` (one line), keeping it off the command line")
	fs.StringVar(&n.Description, "description", "", "free `text` for people")
	fs.IntVar(&n.RetryRPS, "retry-rps", 0, "attempts per second before retries are deferred")
	document(fs, "retry-rps", flagDoc{Placeholder: "N", Default: "serve's WEBHOOK_RETRY_RPS"})
	fs.IntVar(&n.MaxConcurrency, "max-concurrency", 0, "concurrent requests")
	document(fs, "max-concurrency", flagDoc{Placeholder: "N", Default: "serve's WEBHOOK_ENDPOINT_CONCURRENCY"})
	permanent := fs.String("permanent-statuses", "", "answers dead-lettered at once besides 410, e.g. 400,404,422, or none")
	document(fs, "permanent-statuses", flagDoc{Placeholder: "STATUSES", Default: "serve's WEBHOOK_PERMANENT_STATUSES"})
	headers := headerFlag{}
	fs.Var(headers, "header", "extra request header (repeatable)")
	document(fs, "header", flagDoc{Placeholder: "NAME=VALUE"})
	fs.StringVar(&n.Ordering, "ordering", endpoints.OrderingNone, "delivery order: stream sends each stream_id's events one at a time, in order; none keeps no order")
	document(fs, "ordering", flagDoc{Placeholder: "none|stream", Default: endpoints.OrderingNone})
	fs.StringVar(&n.OrderingFailure, "ordering-failure", endpoints.OrderingFailureSkip,
		"what an ordered stream does at a dead letter: skip it, or stop until it is replayed or purged")
	document(fs, "ordering-failure", flagDoc{Placeholder: "skip|stop", Default: endpoints.OrderingFailureSkip})
	fs.BoolVar(&n.Disabled, "disabled", false, "add it without routing events to it yet")
	asJSON := fs.Bool("json", false, "print the endpoint as one JSON object, with its secret when fluxhook generated it")
	if err := noArguments(fs, args); err != nil {
		return err
	}
	if n.URL == "" {
		return usageError("--url is required")
	}
	if err := send.ValidateURL(n.URL); err == nil {
		if err := reachableURL(env, "url", n.URL, false); err != nil {
			return err
		}
	}
	var err error
	if n.Secret, err = secretArg(env, "secret", *secret, *secretFile); err != nil {
		return err
	}
	n.EventTypes, n.Headers = eventTypes(*types), headers
	if strings.TrimSpace(*permanent) != "" {
		if n.PermanentStatuses, err = permanentStatuses(*permanent); err != nil {
			return err
		}
	}
	pool, c, err := endpointsEnv(ctx, env, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	added, err := endpoints.AddAudited(ctx, pool, c, n, audit.CLIActor())
	if err != nil {
		return err
	}
	warnClear(env, c)
	if added.Ordering == endpoints.OrderingStream {
		ensureStreamIndex(ctx, env, pool)
	}
	d, err := describe(ctx, pool, c, added.ID)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, endpointReport{Details: d, Secret: shownSecret(n.Secret, added.Secret)})
	}
	state := "enabled"
	if !added.Enabled {
		state = "disabled: nothing is routed to it until `fluxhook endpoints enable " + added.ID + "`"
	}
	fmt.Fprintf(env.stdout, "added endpoint %s (%s, %s)\n", added.ID, added.Scheme, state)
	printSecret(env.stdout, added.ID, shownSecret(n.Secret, added.Secret))
	return nil
}

func runEndpointsList(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("endpoints list", env, "fluxhook endpoints list [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print a JSON array of endpoints (never their secrets)")
	if err := noArguments(fs, args); err != nil {
		return err
	}
	pool, c, err := endpointsEnv(ctx, env, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	list, err := endpoints.List(ctx, pool, c)
	if err != nil {
		return err
	}
	for i := range list {
		list[i] = forDisplay(list[i])
	}
	if *asJSON {
		return writeJSON(env.stdout, list)
	}
	if len(list) == 0 {
		_, err := fmt.Fprintln(env.stdout, "no endpoints; add one with `fluxhook endpoints add --url URL`")
		return err
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tURL\tTENANT\tEVENTS\tORDERING\tPERMANENT\tENABLED\tDISABLED REASON")
	for _, e := range list {
		enabled, reason := "yes", "-"
		if !e.Enabled {
			enabled, reason = "no", shorten(printable(e.DisabledReason), 50)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, shorten(printable(listURL(e.URL)), 60), orDash(e.Tenant),
			shorten(printable(filterText(e.EventTypes)), 40), orderingText(e), permanentText(e.PermanentStatuses), enabled, reason)
	}
	return tw.Flush()
}

// listURL shortens a URL for the table: scheme, host and path, with "?…" standing for a query,
// which may carry a token the table has no reason to show (show prints it).
func listURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return raw
	}
	short := u.Scheme + "://" + u.Host + u.EscapedPath()
	if u.RawQuery != "" || u.ForceQuery {
		short += "?…"
	}
	return short
}

// orderingText is the ORDERING column: "none", or "stream/" and what the stream does at a
// dead letter, the one case where that matters; show prints both settings in full.
func orderingText(e endpoints.Endpoint) string {
	if e.Ordering != endpoints.OrderingStream {
		return printable(e.Ordering)
	}
	return e.Ordering + "/" + printable(e.OrderingFailure)
}

func filterText(types []string) string {
	if len(types) == 0 {
		return "*"
	}
	return strings.Join(types, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return printable(s)
}

func runEndpointsShow(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("endpoints show", env, "fluxhook endpoints show ID [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print the endpoint as one JSON object (never its secrets)")
	id, err := oneID(fs, args, "show")
	if err != nil {
		return err
	}
	d, c, err := changeEndpoint(ctx, env, *dbURL, id, "", nil)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, d)
	}
	return printEndpoint(env.stdout, d, c.HasKey())
}

func printEndpoint(w io.Writer, d endpoints.Details, haveKey bool) error {
	when := func(t time.Time, none string) string {
		if t.IsZero() {
			return none
		}
		return formatTime(t)
	}
	limit := func(n int, env string) string {
		if n == 0 {
			return "default (" + env + ")"
		}
		return strconv.Itoa(n)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\n", d.ID)
	fmt.Fprintf(tw, "url\t%s\n", printable(d.URL))
	if d.Restricted {
		fmt.Fprintf(tw, "restricted\tyes: a tenant wrote the URL; it reaches public addresses and WEBHOOK_ROW_URL_NETWORKS only (endpoints update --url vouches for a URL)\n")
	}
	fmt.Fprintf(tw, "description\t%s\n", orDash(d.Description))
	tenant := "- (receives events without a tenant)"
	if d.Tenant != "" {
		tenant = printable(d.Tenant)
	}
	fmt.Fprintf(tw, "tenant\t%s\n", tenant)
	events := "* (every event)"
	if len(d.EventTypes) > 0 {
		events = printable(strings.Join(d.EventTypes, ", "))
	}
	fmt.Fprintf(tw, "event_types\t%s\n", events)
	fmt.Fprintf(tw, "scheme\t%s\n", d.Scheme)
	if d.Enabled {
		fmt.Fprintf(tw, "enabled\tyes\n")
	} else {
		fmt.Fprintf(tw, "enabled\tno, since %s: %s\n", when(d.DisabledAt, "?"), orDash(d.DisabledReason))
	}
	fmt.Fprintf(tw, "retry_rps\t%s\n", limit(d.RetryRPS, "WEBHOOK_RETRY_RPS"))
	fmt.Fprintf(tw, "max_concurrency\t%s\n", limit(d.MaxConcurrency, "WEBHOOK_ENDPOINT_CONCURRENCY"))
	fmt.Fprintf(tw, "permanent_statuses\t%s\n", permanentDetails(d.PermanentStatuses))
	ordering, failure := orderingDetails(d.Endpoint)
	fmt.Fprintf(tw, "ordering\t%s\n", ordering)
	fmt.Fprintf(tw, "ordering_failure\t%s\n", failure)
	if len(d.Headers) == 0 {
		fmt.Fprintf(tw, "headers\t-\n")
	}
	for i, k := range slices.Sorted(maps.Keys(d.Headers)) {
		label := ""
		if i == 0 {
			label = "headers"
		}
		fmt.Fprintf(tw, "%s\t%s: %s\n", label, printable(k), printable(d.Headers[k]))
	}
	switch {
	case d.SecretEncrypted:
		fmt.Fprintf(tw, "secret\tencrypted at rest (WEBHOOK_ENCRYPTION_KEY); never shown\n")
	case haveKey:
		fmt.Fprintf(tw, "secret\tstored in clear; never shown: run `fluxhook endpoints reencrypt` to encrypt it\n")
	default:
		fmt.Fprintf(tw, "secret\tstored in clear; never shown: set WEBHOOK_ENCRYPTION_KEY and run `fluxhook endpoints reencrypt`\n")
	}
	switch {
	case d.PreviousSecretInGrace:
		fmt.Fprintf(tw, "previous_secret\tstill signs until %s (rotation grace)\n", formatTime(d.PreviousUntil))
	case !d.PreviousUntil.IsZero():
		fmt.Fprintf(tw, "previous_secret\tgrace ended %s; no longer signs\n", formatTime(d.PreviousUntil))
	default:
		fmt.Fprintf(tw, "previous_secret\tnone\n")
	}
	fmt.Fprintf(tw, "pending_deliveries\t%d\n", d.PendingDeliveries)
	if d.StoppedStreams > 0 {
		fmt.Fprintf(tw, "stopped_streams\t%d, each held at a dead letter until it is replayed or purged (fluxhook dlq list --endpoint-id %s)\n",
			d.StoppedStreams, d.ID)
	} else {
		fmt.Fprintf(tw, "stopped_streams\t0\n")
	}
	fmt.Fprintf(tw, "last_success_at\t%s\n", when(d.LastSuccessAt, "- (none yet)"))
	fmt.Fprintf(tw, "failing_since\t%s\n", when(d.FailingSince, "- (not failing)"))
	fmt.Fprintf(tw, "created_at\t%s\n", formatTime(d.CreatedAt))
	fmt.Fprintf(tw, "updated_at\t%s\n", formatTime(d.UpdatedAt))
	if d.LoadError != "" {
		fmt.Fprintf(tw, "problem\t%s\n", printable(d.LoadError))
	}
	return tw.Flush()
}

// orderingDetails is show's ordering and ordering_failure: each value with what it does, since
// the difference between skip and stop is what an operator looks it up for.
func orderingDetails(e endpoints.Endpoint) (ordering, failure string) {
	switch e.Ordering {
	case endpoints.OrderingNone:
		ordering = "none (no order between events)"
	case endpoints.OrderingStream:
		ordering = "stream (each stream's events one at a time, in order)"
	default:
		ordering = printable(e.Ordering)
	}
	switch {
	case e.Ordering != endpoints.OrderingStream:
		// Kept for when the endpoint is ordered: saying what it does now would mislead.
		failure = printable(e.OrderingFailure) + " (applies with ordering stream)"
	case e.OrderingFailure == endpoints.OrderingFailureSkip:
		failure = "skip (a dead-lettered event is left behind; its stream goes on)"
	case e.OrderingFailure == endpoints.OrderingFailureStop:
		failure = "stop (a dead-lettered event stops its stream until it is replayed or purged)"
	default:
		failure = printable(e.OrderingFailure)
	}
	return ordering, failure
}

// permanentStatuses reads --permanent-statuses as WEBHOOK_PERMANENT_STATUSES is read
// (send.ParsePermanentStatuses): comma-separated statuses from 300 to 599, or none. The error
// names the flag rather than the variable.
func permanentStatuses(v string) ([]int, error) {
	list, err := send.ParsePermanentStatuses(v)
	if err != nil {
		return nil, usageError("--permanent-statuses: %s", strings.TrimPrefix(err.Error(), "WEBHOOK_PERMANENT_STATUSES: "))
	}
	return list, nil
}

// permanentDetails is what `endpoints show` says of an endpoint's permanent statuses: list's
// PERMANENT column (permanentText) and what it means.
func permanentDetails(list []int) string {
	switch {
	case list == nil:
		return "default (WEBHOOK_PERMANENT_STATUSES)"
	case len(list) == 0:
		return "none (only 410 is dead-lettered at once; every other failure is retried)"
	}
	return strings.ReplaceAll(permanentText(list), ",", ", ") + " and 410 (dead-lettered at once)"
}

// permanentText is `endpoints list`'s PERMANENT column: "default" when the endpoint follows
// WEBHOOK_PERMANENT_STATUSES (NULL), "none" when it retries everything but 410 ('{}'), else its
// own statuses, so that an override shows without opening each endpoint.
func permanentText(list []int) string {
	switch {
	case list == nil:
		return "default"
	case len(list) == 0:
		return "none"
	}
	s := make([]string, len(list))
	for i, n := range list {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func runEndpointsUpdate(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("endpoints update", env, "fluxhook endpoints update ID [flags]")
	dbURL := databaseURLFlag(fs, env)
	var u, types, tenant, description, scheme, secret, ordering, orderingFailure, permanent optString
	var rps, conc optInt
	fs.Var(&u, "url", "new URL: https://..., or http:// for a loopback host")
	document(fs, "url", flagDoc{Placeholder: "URL"})
	fs.Var(&types, "event-types", `new filter: comma-separated event types and "prefix.*" patterns ("" = every event)`)
	document(fs, "event-types", flagDoc{Placeholder: "TYPES"})
	fs.Var(&tenant, "tenant", `new tenant ("" = none: events without a tenant)`)
	document(fs, "tenant", flagDoc{Placeholder: "TENANT"})
	fs.Var(&description, "description", "new description")
	document(fs, "description", flagDoc{Placeholder: "TEXT"})
	fs.Var(&rps, "retry-rps", "new retry rate (0 = serve's WEBHOOK_RETRY_RPS)")
	document(fs, "retry-rps", flagDoc{Placeholder: "N"})
	fs.Var(&conc, "max-concurrency", "new concurrency limit (0 = serve's WEBHOOK_ENDPOINT_CONCURRENCY)")
	document(fs, "max-concurrency", flagDoc{Placeholder: "N"})
	fs.Var(&permanent, "permanent-statuses", `answers dead-lettered at once besides 410, e.g. 400,404,422, or none ("" = serve's WEBHOOK_PERMANENT_STATUSES)`)
	document(fs, "permanent-statuses", flagDoc{Placeholder: "STATUSES"})
	headers := headerFlag{}
	fs.Var(headers, "header", "add or replace a request header (repeatable)")
	document(fs, "header", flagDoc{Placeholder: "NAME=VALUE"})
	clearHeaders := fs.Bool("clear-headers", false, "remove every custom header first (then --header sets the new ones)")
	fs.Var(&ordering, "ordering", "new delivery order: stream sends each stream_id's events one at a time, in order; none keeps no order")
	document(fs, "ordering", flagDoc{Placeholder: "none|stream"})
	fs.Var(&orderingFailure, "ordering-failure", "what an ordered stream does at a dead letter: skip it, or stop until it is replayed or purged")
	document(fs, "ordering-failure", flagDoc{Placeholder: "skip|stop"})
	fs.Var(&scheme, "scheme", "new signature scheme; a change comes with a new secret")
	document(fs, "scheme", flagDoc{Placeholder: "fluxora|standard"})
	fs.Var(&secret, "secret", "the new secret for a --scheme change, or - to read it from standard input")
	document(fs, "secret", flagDoc{Placeholder: "SECRET", Default: "generated and printed once"})
	secretFile := fs.String("secret-file", "", "read the new secret for a --scheme change from this `file` (one line)")
	asJSON := fs.Bool("json", false, "print the updated endpoint as one JSON object (with a new secret fluxhook generated for a --scheme change)")
	id, err := oneID(fs, args, "update")
	if err != nil {
		return err
	}
	p := endpoints.Patch{URL: u.ptr(), Description: description.ptr(), Tenant: tenant.ptr(), RetryRPS: rps.ptr(),
		MaxConcurrency: conc.ptr(), Scheme: scheme.ptr(), Secret: secret.ptr(), Ordering: ordering.ptr(),
		OrderingFailure: orderingFailure.ptr()}
	if types.set {
		list := eventTypes(types.v)
		p.EventTypes = &list
	}
	if permanent.set {
		var list []int // "": NULL, the dispatcher's setting
		if strings.TrimSpace(permanent.v) != "" {
			if list, err = permanentStatuses(permanent.v); err != nil {
				return err
			}
		}
		p.PermanentStatuses = &list
	}
	if len(headers) > 0 || *clearHeaders {
		h := map[string]string(headers)
		p.Headers, p.MergeHeaders = &h, !*clearHeaders
	}
	if u.set && send.ValidateURL(u.v) == nil {
		if err := reachableURL(env, "url", u.v, false); err != nil {
			return err
		}
	}
	if u.set {
		// The operator writes this URL: it is theirs to vouch for, under their network policy,
		// even over one a tenant wrote through the API (restricted).
		operator := false
		p.Restricted = &operator
	}
	if (secret.set || *secretFile != "") && !scheme.set {
		return usageError("--secret and --secret-file change the secret only with --scheme; to replace it, use `fluxhook endpoints rotate-secret %s --secret-file PATH`", id)
	}
	if secret.set || *secretFile != "" {
		v, err := secretArg(env, "secret", secret.v, *secretFile)
		if err != nil {
			return err
		}
		p.Secret = &v
	}
	if !u.set && !types.set && !tenant.set && !description.set && !rps.set && !conc.set && len(headers) == 0 && !*clearHeaders &&
		!scheme.set && !ordering.set && !orderingFailure.set && !permanent.set {
		return usageError("endpoints update needs something to change: --url, --event-types, --tenant, --description, --retry-rps, --max-concurrency, --permanent-statuses, --header, --clear-headers, --ordering, --ordering-failure or --scheme")
	}
	var res endpoints.Updated
	d, c, err := changeEndpoint(ctx, env, *dbURL, id, "endpoint.update", func(tx pgx.Tx, c *endpoints.Cipher) (err error) {
		res, err = endpoints.Update(ctx, tx, c, id, p)
		return err
	}, func(pool *pgxpool.Pool) {
		if ordering.set && *p.Ordering == endpoints.OrderingStream {
			ensureStreamIndex(ctx, env, pool)
		}
	})
	if err != nil {
		return err
	}
	changed := res.NewSecret != ""
	if changed {
		warnClear(env, c)
	}
	var given string
	if p.Secret != nil {
		given = *p.Secret
	}
	newSecret := shownSecret(given, res.NewSecret)
	if *asJSON {
		return writeJSON(env.stdout, endpointReport{Details: d, Secret: newSecret})
	}
	fmt.Fprintf(env.stdout, "updated endpoint %s\n", d.ID)
	if res.DeadLettered > 0 {
		fmt.Fprintf(env.stdout, "Its tenant changed: its %d pending deliveries, routed under the old tenant, were dead-lettered (%q); `fluxhook dlq replay --to-endpoint ID` sends them to an endpoint of their tenant.\n",
			res.DeadLettered, endpoints.TenantChangedReason)
	}
	if changed {
		fmt.Fprintf(env.stdout, "The scheme is now %s, with a new secret; the old one no longer signs.\n", d.Scheme)
		printSecret(env.stdout, d.ID, newSecret)
	}
	return nil
}

func runEndpointsDisable(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("endpoints disable", env, "fluxhook endpoints disable ID [--reason TEXT] [--json]")
	dbURL := databaseURLFlag(fs, env)
	reason := fs.String("reason", "", "why, shown by list and show")
	document(fs, "reason", flagDoc{Placeholder: "TEXT", Default: endpoints.DefaultDisabledReason})
	asJSON := fs.Bool("json", false, "print the endpoint as one JSON object")
	id, err := oneID(fs, args, "disable")
	if err != nil {
		return err
	}
	d, _, err := changeEndpoint(ctx, env, *dbURL, id, "endpoint.disable", func(tx pgx.Tx, _ *endpoints.Cipher) error {
		return endpoints.Disable(ctx, tx, id, *reason)
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, d)
	}
	fmt.Fprintf(env.stdout, "disabled endpoint %s: %s\nNo events are routed to it", d.ID, printable(d.DisabledReason))
	if d.PendingDeliveries > 0 {
		fmt.Fprintf(env.stdout, "; the dispatcher dead-letters its %d pending deliveries (replayable with `fluxhook dlq replay` once it is enabled)", d.PendingDeliveries)
	}
	_, err = fmt.Fprintln(env.stdout, ".")
	return err
}

func runEndpointsEnable(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("endpoints enable", env, "fluxhook endpoints enable ID [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print the endpoint as one JSON object")
	id, err := oneID(fs, args, "enable")
	if err != nil {
		return err
	}
	d, _, err := changeEndpoint(ctx, env, *dbURL, id, "endpoint.enable", func(tx pgx.Tx, _ *endpoints.Cipher) error {
		return endpoints.Enable(ctx, tx, id)
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, d)
	}
	_, err = fmt.Fprintf(env.stdout, "enabled endpoint %s: events are routed to it again\n", d.ID)
	return err
}

func runEndpointsRotateSecret(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("endpoints rotate-secret", env, "fluxhook endpoints rotate-secret ID [--secret SECRET|- | --secret-file FILE] [--grace DURATION] [--json]")
	dbURL := databaseURLFlag(fs, env)
	secret := fs.String("secret", "", "the new secret, or - to read it from standard input")
	document(fs, "secret", flagDoc{Placeholder: "SECRET", Default: "generated in the endpoint's scheme and printed once"})
	secretFile := fs.String("secret-file", "", "read the new secret from this `file` (one line), keeping it off the command line")
	grace := fs.Duration("grace", endpoints.DefaultGrace, "how long the old secret keeps signing; 0 drops it at once (a leaked secret)")
	asJSON := fs.Bool("json", false, "print the endpoint as one JSON object, with its new secret when fluxhook generated it")
	id, err := oneID(fs, args, "rotate-secret")
	if err != nil {
		return err
	}
	given, err := secretArg(env, "secret", *secret, *secretFile)
	if err != nil {
		return err
	}
	newSecret := given
	g := *grace
	switch {
	case g < 0:
		return usageError("--grace must not be negative, got %v", g)
	case g == 0:
		g = endpoints.NoGrace
	}
	d, c, err := changeEndpoint(ctx, env, *dbURL, id, "endpoint.rotate_secret", func(tx pgx.Tx, c *endpoints.Cipher) (err error) {
		newSecret, err = endpoints.RotateSecret(ctx, tx, c, id, newSecret, g)
		return err
	})
	if err != nil {
		return err
	}
	warnClear(env, c)
	if *asJSON {
		return writeJSON(env.stdout, endpointReport{Details: d, Secret: shownSecret(given, newSecret)})
	}
	fmt.Fprintf(env.stdout, "rotated the secret of endpoint %s\n", d.ID)
	if d.PreviousSecretInGrace {
		fmt.Fprintf(env.stdout, "The old secret keeps signing until %s; give the consumer the new one before then.\n", formatTime(d.PreviousUntil))
	} else {
		fmt.Fprintf(env.stdout, "The old secret no longer signs.\n")
	}
	printSecret(env.stdout, d.ID, shownSecret(given, newSecret))
	return nil
}

// removeReport is `endpoints remove --json`.
type removeReport struct {
	ID           string `json:"id"`
	Removed      bool   `json:"removed"`
	DeadLettered int64  `json:"dead_lettered"`
	Dropped      int64  `json:"dropped"`
}

func runEndpointsRemove(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("endpoints remove", env, "fluxhook endpoints remove ID [--pending refuse|dead-letter|drop] [--json]")
	dbURL := databaseURLFlag(fs, env)
	pending := fs.String("pending", string(endpoints.PendingRefuse),
		"what to do with deliveries still pending: refuse (remove nothing), dead-letter (move them to the dead-letter table) or drop (delete them: they are lost)")
	document(fs, "pending", flagDoc{Placeholder: "refuse|dead-letter|drop", Default: string(endpoints.PendingRefuse)})
	asJSON := fs.Bool("json", false, "print what was removed as one JSON object")
	id, err := oneID(fs, args, "remove")
	if err != nil {
		return err
	}
	action, err := endpoints.ParsePendingAction(*pending)
	if err != nil {
		return err
	}
	pool, c, err := endpointsEnv(ctx, env, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	r, err := endpoints.RemoveAudited(ctx, pool, c, id, nil, audit.CLIActor(), action)
	if err != nil {
		return err
	}
	// Report the id as stored, whatever case it was typed in.
	id = strings.ToLower(id)
	if *asJSON {
		return writeJSON(env.stdout, removeReport{ID: id, Removed: true, DeadLettered: r.DeadLettered, Dropped: r.Dropped})
	}
	fmt.Fprintf(env.stdout, "removed endpoint %s\n", id)
	switch {
	case r.DeadLettered > 0:
		fmt.Fprintf(env.stdout, "%d pending deliveries moved to the dead-letter table (reason \"endpoint removed\")\n", r.DeadLettered)
	case r.Dropped > 0:
		fmt.Fprintf(env.stdout, "%d pending deliveries dropped\n", r.Dropped)
	}
	return nil
}

func runEndpointsReencrypt(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("endpoints reencrypt", env, "fluxhook endpoints reencrypt [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, `print {"reencrypted": ENDPOINTS, "secrets": N, "headers": N}`)
	if err := noArguments(fs, args); err != nil {
		return err
	}
	pool, c, err := endpointsEnv(ctx, env, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	r, err := endpoints.Reseal(ctx, pool, c)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, r)
	}
	if r.Endpoints == 0 {
		_, err = fmt.Fprintln(env.stdout, "nothing to re-encrypt: every secret and header value is encrypted with WEBHOOK_ENCRYPTION_KEY, bound to its endpoint")
	} else {
		_, err = fmt.Fprintf(env.stdout, "re-encrypted the secrets of %d endpoints with WEBHOOK_ENCRYPTION_KEY (secrets: %d, header values: %d)\n",
			r.Endpoints, r.Secrets, r.Headers)
	}
	if err == nil && (env.getenv("WEBHOOK_ENCRYPTION_KEY_PREVIOUS") != "" || env.getenv("WEBHOOK_ENCRYPTION_KEY_PREVIOUS_FILE") != "") {
		_, err = fmt.Fprintln(env.stdout, "WEBHOOK_ENCRYPTION_KEY_PREVIOUS can be removed once every dispatcher runs with the new key.")
	}
	return err
}

// ensureStreamIndex creates the index ordered delivery needs, once an endpoint orders its
// streams (it is not part of the schema: producers would pay for it with ordering off). A
// failure is a warning: the endpoint is changed already, and every dispatcher that sees an
// ordered endpoint tries again.
func ensureStreamIndex(ctx context.Context, env *environment, pool *pgxpool.Pool) {
	built, err := fluxsql.EnsureStreamIndex(ctx, pool)
	switch {
	case err != nil:
		fmt.Fprintf(env.stderr, "warning: %v\n", err)
	case built:
		fmt.Fprintln(env.stderr, "created index webhook_outbox_stream_idx, which ordered delivery needs")
	}
}

// reachableURL refuses a URL the dispatcher can never reach by its address alone (a private or
// link-local IP, say), under the network setting named by setting as this command's
// environment has it (serve's must allow the same): stored, it would only be dead-lettered at
// every delivery. rowURL: the URL is a row's endpoint_url (WEBHOOK_ROW_URL_NETWORKS).
func reachableURL(env *environment, flagName, rawURL string, rowURL bool) error {
	setting, parse := "WEBHOOK_ALLOWED_NETWORKS", send.ParseAllowedNetworks
	if rowURL {
		setting, parse = "WEBHOOK_ROW_URL_NETWORKS", send.ParseRowURLNetworks
	}
	networks, err := parse(env.getenv(setting))
	if err != nil {
		return usageError("%v", err)
	}
	if err := send.CheckURL(rawURL, networks, rowURL); err != nil {
		return usageError("--%s: %s (serve applies %s: set it here too to store this URL)", flagName,
			strings.TrimPrefix(err.Error(), "endpoint refused: "), setting)
	}
	return nil
}

// plural writes n with the noun's singular or plural form.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
