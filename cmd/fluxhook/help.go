package main

import (
	"context"
	"errors"
	"flag"
	"strings"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
)

// commandHelp is every command's help besides its synopsis and flags (see cli.PrintHelp): what
// it does in one sentence, and an example to copy. The groups' (dlq, endpoints) list their
// subcommands by these sentences (cli.PrintGroupHelp). A test walks every command's -h.
var commandHelp = map[string]cli.Help{
	"serve":   {Sentence: "Run the dispatcher: claim due events, sign and send them, settle the outcomes, until SIGTERM or SIGINT (a second signal cancels the drain).", Example: "DATABASE_URL=postgres://fluxhook@db/app WEBHOOK_URL=https://hooks.example.com/in WEBHOOK_SECRET_FILE=/run/secrets/webhook fluxhook serve"},
	"migrate": {Sentence: "Install or upgrade fluxhook's schema under an advisory lock, or print it as one script for psql.", Example: "fluxhook migrate --print > fluxhook.sql && psql \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -f fluxhook.sql"},
	"status":  {Sentence: "Show whether delivery keeps up and what is stuck, from the database alone.", Example: "fluxhook status --json | jq .backlog"},
	"enqueue": {Sentence: "Write one event to the outbox, as a producer would (smoke tests, manual sends).", Env: rowURLEnv, Example: "fluxhook enqueue --event-type order.paid --payload '{\"order\": 7}'"},
	"receive": {Sentence: "Run a local consumer that verifies each request's signature and prints it (development).", Example: "fluxhook receive --addr 127.0.0.1:8189 --secret-file secret.txt"},
	"demo":    {Sentence: "Show everything fluxhook does on one screen: a throwaway database, a consumer, sample events.", Example: "fluxhook demo --events 5"},
	"version": {Sentence: "Print fluxhook's version, the commit it was built from, and the schema version it needs.", Example: "fluxhook version --json"},
	"bench":   {Sentence: "Run the end-to-end benchmark: PostgreSQL (a throwaway cluster, or a fresh database on DATABASE_URL's server, dropped afterwards), a verifying consumer, the dispatcher and a producer; print the results next to the performance budget, and exit 1 when a check is missed or cannot be computed (--no-budget: measure only).", Example: "fluxhook bench --workload drain,idle"},

	"api": {Sentence: "Serve the management API (docs/api.md) without delivering: endpoints, events, deliveries with every attempt, dead letters and replay, per tenant.", Example: "DATABASE_URL=postgres://fluxhook@db/app API_ADDR=127.0.0.1:8080 fluxhook api"},

	"api-keys":        {Sentence: "Manage the keys of the management API: an admin key sees every tenant, a tenant key only its own.", Example: "fluxhook api-keys add --admin --description 'ops'"},
	"api-keys add":    {Sentence: "Make a key for the management API, for one tenant (--tenant) or every tenant (--admin); it is shown once.", Example: "fluxhook api-keys add --tenant acme --description 'acme portal'"},
	"api-keys list":   {Sentence: "List the API keys (--portal: the portal sessions not yet expired) by prefix, never the keys themselves, with their last use.", Example: "fluxhook api-keys list --portal"},
	"api-keys revoke": {Sentence: "End an API key, with the portal sessions it made, or one portal session, at once: requests with it are answered 401.", Example: "fluxhook api-keys revoke 9c41d7a2-58e3-4b0f-a6d2-71e5c3b8f046"},

	"dlq":        {Sentence: "Find out why events were dead-lettered, send them again once the consumer is fixed, or delete them.", Example: "fluxhook dlq list --reason-contains 'HTTP 404' --since 24h"},
	"dlq list":   {Sentence: "List dead letters, newest first, optionally filtered.", Example: "fluxhook dlq list --event-type order.paid --since 24h"},
	"dlq show":   {Sentence: "Show one dead letter whole: its reason, last status, payload and endpoint.", Example: "fluxhook dlq show 42"},
	"dlq replay": {Sentence: "Send dead letters again, with their delivery ids, to their endpoint or --to-endpoint's.", Example: "fluxhook dlq replay --all-matching --reason-contains 'HTTP 503' --dry-run"},
	"dlq purge":  {Sentence: "Delete dead letters for good.", Example: "fluxhook dlq purge --all-matching --replayed-only --since 720h"},

	"endpoints":               {Sentence: "Manage the consumers that events are routed to: each one's URL, secret, filter, tenant and delivery settings, validated as the dispatcher validates them.", Example: "fluxhook endpoints add --url https://a.example/hooks --event-types 'order.*'"},
	"endpoints add":           {Sentence: "Add a managed endpoint: its URL, secret, filter, tenant and delivery settings.", Env: endpointURLEnv, Example: "fluxhook endpoints add --url https://b.example/hooks --tenant acme --event-types 'order.*' --json"},
	"endpoints list":          {Sentence: "List the managed endpoints, never their secrets.", Env: endpointKeys, Example: "fluxhook endpoints list --json"},
	"endpoints show":          {Sentence: "Show one endpoint and its recent delivery health.", Env: endpointKeys, Example: "fluxhook endpoints show 3f2b8c1e-6d4a-4e7b-9a51-0c8d2e7f4b19"},
	"endpoints update":        {Sentence: "Change an endpoint's URL, filter, tenant, headers or delivery settings.", Env: endpointURLEnv, Example: "fluxhook endpoints update 3f2b8c1e-6d4a-4e7b-9a51-0c8d2e7f4b19 --event-types 'order.*,refund.*'"},
	"endpoints disable":       {Sentence: "Stop routing events to an endpoint; its pending deliveries are dead-lettered.", Env: endpointKeys, Example: "fluxhook endpoints disable 3f2b8c1e-6d4a-4e7b-9a51-0c8d2e7f4b19 --reason 'consumer migrating'"},
	"endpoints enable":        {Sentence: "Route events to an endpoint again.", Env: endpointKeys, Example: "fluxhook endpoints enable 3f2b8c1e-6d4a-4e7b-9a51-0c8d2e7f4b19"},
	"endpoints rotate-secret": {Sentence: "Give an endpoint a new secret; the old one keeps signing during the grace.", Env: endpointKeys, Example: "fluxhook endpoints rotate-secret 3f2b8c1e-6d4a-4e7b-9a51-0c8d2e7f4b19 --grace 24h --secret-file new-secret.txt"},
	"endpoints remove":        {Sentence: "Delete an endpoint; --pending says what becomes of deliveries still pending (refused by default).", Env: endpointKeys, Example: "fluxhook endpoints remove 3f2b8c1e-6d4a-4e7b-9a51-0c8d2e7f4b19"},
	"endpoints reencrypt":     {Sentence: "Seal the stored secrets and headers with WEBHOOK_ENCRYPTION_KEY (after setting or rotating it).", Env: endpointKeys, Example: "WEBHOOK_ENCRYPTION_KEY_FILE=/run/secrets/key fluxhook endpoints reencrypt"},
}

// The variables the endpoints commands obey that no flag stands for: the keys that seal
// secrets and header values (from the environment only, as serve reads them, never the
// command line), and the network policy a new URL is checked against, serve's own.
var (
	endpointKeys = []cli.EnvVar{
		{Name: "WEBHOOK_ENCRYPTION_KEY", Usage: "the key secrets and header values are sealed with, as serve has it (or WEBHOOK_ENCRYPTION_KEY_FILE: a file holding it)"},
		{Name: "WEBHOOK_ENCRYPTION_KEY_PREVIOUS", Usage: "the key being rotated out, which still opens what it sealed (or WEBHOOK_ENCRYPTION_KEY_PREVIOUS_FILE)"},
	}
	endpointURLEnv = append([]cli.EnvVar{
		{Name: "WEBHOOK_ALLOWED_NETWORKS", Usage: "private networks (CIDRs) a URL may resolve to, as serve has it: a URL at another private address is refused"},
	}, endpointKeys...)
	rowURLEnv = []cli.EnvVar{
		{Name: "WEBHOOK_ROW_URL_NETWORKS", Usage: "networks (CIDRs, or loopback) an --endpoint-url may reach besides public addresses, as serve has it"},
	}
)

func init() {
	for name, h := range commandHelp {
		cli.Helps[name] = h
	}
}

// subcommand is one `fluxhook GROUP NAME` of a command that groups others (dlq, endpoints).
type subcommand struct {
	name string
	run  func(context.Context, *environment, []string) error
}

// runGroup dispatches `fluxhook GROUP SUBCOMMAND ...` to its subcommand, so that both groups
// answer alike: -h, --help and help print the group's page to standard output; no subcommand,
// or an unknown one, prints it to standard error and is a usage error (exit status 2). args is
// the synopsis after the subcommand names; wrap turns the subcommand's error into the one
// reported (endpoints names the flag to fix).
func runGroup(ctx context.Context, env *environment, group, args string, subs []subcommand, argv []string, wrap func(error) error) error {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.name
	}
	if len(argv) == 0 {
		cli.PrintGroupHelp(env.stderr, group, args, names)
		return usageError("%s needs a subcommand: %s or %s", group, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
	}
	switch argv[0] {
	case "help", "-h", "--help":
		cli.PrintGroupHelp(env.stdout, group, args, names)
		return nil
	}
	for _, s := range subs {
		if s.name == argv[0] {
			err := s.run(ctx, env, argv[1:])
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return wrap(err)
		}
	}
	cli.PrintGroupHelp(env.stderr, group, args, names)
	return usageError("unknown %s subcommand %q%s", group, argv[0], didYouMean("fluxhook "+group, argv[0], names))
}
