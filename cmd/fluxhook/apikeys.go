package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/audit"
)

func init() {
	commands["api-keys"] = command{summary: "manage the management API's keys: add, list, revoke", run: runAPIKeys}
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
	fs := newFlagSet("api-keys add", env, "fluxhook api-keys add --tenant T | --admin [--description D] [--json]")
	dbURL := databaseURLFlag(fs, env)
	tenant := fs.String("tenant", "", "limit the key to this tenant's endpoints, events and dead letters")
	admin := fs.Bool("admin", false, "make an admin key: every tenant, and the keys themselves")
	description := fs.String("description", "", "free text for people: who uses the key")
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

func runAPIKeysList(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("api-keys list", env, "fluxhook api-keys list [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print the keys as a JSON array")
	if err := noArguments(fs, args); err != nil {
		return err
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
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
	at := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	for _, k := range keys {
		tenant := "(admin)"
		if k.Tenant != nil {
			tenant = printable(*k.Tenant)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Prefix, tenant, orDash(printable(k.Description)),
			k.CreatedAt.UTC().Format(time.RFC3339), at(k.LastUsedAt), at(k.RevokedAt))
	}
	return tw.Flush()
}

func runAPIKeysRevoke(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("api-keys revoke", env, "fluxhook api-keys revoke ID [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print the revoked key as one JSON object")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usageError("api-keys revoke takes exactly one key id (see `fluxhook api-keys list`)")
	}
	id := positional[0]
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var k apikeys.Key
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		before, err := apikeys.Get(ctx, tx, id)
		if err != nil {
			return err
		}
		if k, err = apikeys.Revoke(ctx, tx, id); err != nil {
			return err
		}
		return audit.Record(ctx, tx, audit.Change{Actor: audit.CLIActor(), Tenant: k.Tenant, Action: "api_key.revoke",
			ObjectType: "api_key", ObjectID: k.ID, Before: before, After: k})
	})
	if errors.Is(err, apikeys.ErrNotFound) {
		return fmt.Errorf("API key %s not found; nothing revoked (fluxhook api-keys list shows the keys)", id)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, k)
	}
	fmt.Fprintf(env.stdout, "revoked API key %s (%s): requests with it are refused from now on\n", k.ID, k.Prefix)
	return nil
}
