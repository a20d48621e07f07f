package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/audit"
)

func init() {
	commands["api-keys"] = command{summary: "Manage the management API's keys: add, list, revoke", run: runAPIKeys}
}

// apiKeysSubcommands are `fluxhook api-keys`'s subcommands, in the order its help lists them.
var apiKeysSubcommands = []subcommand{
	{"add", runAPIKeysAdd},
	{"list", runAPIKeysList},
	{"revoke", runAPIKeysRevoke},
}

// runAPIKeys makes and revokes the keys the management API accepts. It is the way to the
// first admin key: the API makes keys only for a caller that holds one.
func runAPIKeys(ctx context.Context, env *environment, args []string) error {
	return runGroup(ctx, env, "api-keys", "[ID] [flags]", apiKeysSubcommands, args, func(err error) error { return err })
}

// runAPIKeysAdd makes a key. Its scope is chosen explicitly, --tenant T or --admin: an admin
// key sees every tenant and manages keys, so it must never be what an empty or forgotten
// --tenant "$CUSTOMER" silently makes.
func runAPIKeysAdd(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("api-keys add", env, "fluxhook api-keys add --tenant TENANT | --admin [--description TEXT] [--json]")
	dbURL := databaseURLFlag(fs, env)
	tenant := fs.String("tenant", "", "limit the key to this `tenant`'s endpoints, events and dead letters")
	admin := fs.Bool("admin", false, "make an admin key: every tenant, and the keys themselves")
	description := fs.String("description", "", "free `text` for people: who uses the key")
	asJSON := fs.Bool("json", false, "print the key and its record as one JSON object")
	if err := noArguments(fs, args); err != nil {
		return err
	}
	tenantGiven := false
	fs.Visit(func(f *flag.Flag) { tenantGiven = tenantGiven || f.Name == "tenant" })
	n := apikeys.New{Description: *description, CreatedBy: audit.CLIActor()}
	switch {
	case tenantGiven && *admin:
		return usageError("--tenant and --admin: choose one; a key is either one tenant's or an admin key")
	case tenantGiven && *tenant == "":
		return usageError("--tenant: empty; name the tenant (an empty variable?), or use --admin for an admin key")
	case tenantGiven:
		n.Tenant = tenant
	case !*admin:
		return usageError("choose the key's scope: --tenant T (one tenant's objects) or --admin (every tenant, and the keys)")
	}
	if err := n.Validate(); err != nil {
		return usageError("--%v", err)
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var k apikeys.Key
	var token string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if k, token, err = apikeys.Add(ctx, tx, n); err != nil {
			return err
		}
		return audit.Record(ctx, tx, audit.Change{Actor: n.CreatedBy, Tenant: k.Tenant, Action: "api_key.create",
			ObjectType: "api_key", ObjectID: k.ID, After: k})
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, struct {
			apikeys.Key
			Secret string `json:"key"`
		}{k, token})
	}
	scope := "admin: every tenant"
	if k.Tenant != nil {
		scope = "tenant " + *k.Tenant
	}
	fmt.Fprintf(env.stdout, "added API key %s (%s)\n\n  key: %s\n\n", k.ID, scope, token)
	fmt.Fprintln(env.stdout, "Store this key now: it is not shown again. Send it as Authorization: Bearer <key>.")
	fmt.Fprintf(env.stdout, "(If it is lost or leaked, `fluxhook api-keys revoke %s` ends it.)\n", k.ID)
	return nil
}

// runAPIKeysList lists the keys, or with --portal the portal sessions that have not expired:
// the links an operator may need to end before they do.
func runAPIKeysList(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("api-keys list", env, "fluxhook api-keys list [--portal] [--json]")
	dbURL := databaseURLFlag(fs, env)
	portal := fs.Bool("portal", false, "list the portal sessions that have not expired (revoked ones included) instead of the keys")
	asJSON := fs.Bool("json", false, "print the keys as a JSON array")
	if err := noArguments(fs, args); err != nil {
		return err
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *portal {
		return listPortalSessions(ctx, env, pool, *asJSON)
	}
	keys, err := apikeys.List(ctx, pool)
	if err != nil {
		return err
	}
	if *asJSON {
		if keys == nil {
			keys = []apikeys.Key{}
		}
		return writeJSON(env.stdout, keys)
	}
	if len(keys) == 0 {
		fmt.Fprintln(env.stdout, "no API keys: `fluxhook api-keys add` makes one")
		return nil
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPREFIX\tTENANT\tDESCRIPTION\tCREATED\tLAST USED\tREVOKED")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Prefix, keyTenant(k), orDash(printable(k.Description)),
			k.CreatedAt.UTC().Format(time.RFC3339), timeOrDash(k.LastUsedAt), timeOrDash(k.RevokedAt))
	}
	return tw.Flush()
}

// listPortalSessions prints the portal sessions that have not expired, newest first, every
// one of them: an operator looking for the link to end wants them all, and expired ones are
// left out, so the list is at most a day of links.
func listPortalSessions(ctx context.Context, env *environment, pool *pgxpool.Pool, asJSON bool) error {
	var all []apikeys.Session
	f := apikeys.SessionFilter{Limit: 1000}
	for {
		list, err := apikeys.ListPortalSessions(ctx, pool, f)
		if err != nil {
			return err
		}
		all = append(all, list...)
		if len(list) < f.Limit {
			break
		}
		last := list[len(list)-1]
		f.AfterCreated, f.AfterID = last.CreatedAt, last.ID
	}
	if asJSON {
		if all == nil {
			all = []apikeys.Session{}
		}
		return writeJSON(env.stdout, all)
	}
	if len(all) == 0 {
		fmt.Fprintln(env.stdout, "no portal sessions that have not expired")
		return nil
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPREFIX\tTENANT\tCREATED BY\tCREATED\tEXPIRES\tLAST USED\tREVOKED")
	for _, s := range all {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Prefix, keyTenant(s.Key), printable(s.CreatedBy),
			s.CreatedAt.UTC().Format(time.RFC3339), s.ExpiresAt.UTC().Format(time.RFC3339), timeOrDash(s.LastUsedAt), timeOrDash(s.RevokedAt))
	}
	return tw.Flush()
}

// keyTenant is a key's or a session's scope as the lists show it.
func keyTenant(k apikeys.Key) string {
	if k.Tenant == nil {
		return "(admin)"
	}
	return printable(*k.Tenant)
}

func timeOrDash(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// runAPIKeysRevoke ends a key, with the portal sessions it made, or one portal session: both
// are ids `api-keys list` (--portal) shows.
func runAPIKeysRevoke(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("api-keys revoke", env, "fluxhook api-keys revoke ID [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print the revoked key or session as one JSON object")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usageError("api-keys revoke takes exactly one key or portal session id (see `fluxhook api-keys list`, --portal)")
	}
	id := positional[0]
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var k apikeys.Key
	var ended []apikeys.Key
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		k, ended, err = apikeys.RevokeAudited(ctx, tx, id, audit.CLIActor())
		if errors.Is(err, apikeys.ErrNotFound) {
			k, err = apikeys.RevokePortalSessionAudited(ctx, tx, id, audit.CLIActor())
		}
		return err
	})
	if errors.Is(err, apikeys.ErrNotFound) {
		return fmt.Errorf("API key or portal session %s not found; nothing revoked (fluxhook api-keys list shows the keys, --portal the sessions)", id)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		if k.Portal {
			return writeJSON(env.stdout, apikeys.SessionOf(k))
		}
		return writeJSON(env.stdout, k)
	}
	if k.Portal {
		fmt.Fprintf(env.stdout, "revoked portal session %s (%s): its link is refused from now on\n", k.ID, k.Prefix)
		return nil
	}
	fmt.Fprintf(env.stdout, "revoked API key %s (%s): requests with it are refused from now on\n", k.ID, k.Prefix)
	if len(ended) > 0 {
		fmt.Fprintf(env.stdout, "and the %d portal sessions it made\n", len(ended))
	}
	return nil
}
