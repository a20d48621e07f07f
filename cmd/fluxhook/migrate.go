package main

import (
	"context"
	"flag"
	"fmt"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

func init() {
	commands["migrate"] = command{summary: "install or upgrade the schema (or --print it for psql)", run: runMigrate}
}

// runMigrate applies the embedded migrations under an advisory lock, or prints them as one
// script for users who install schemas with psql.
func runMigrate(ctx context.Context, env *environment, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	print := fs.Bool("print", false, "print the SQL for `psql -v ON_ERROR_STOP=1 -f` instead of applying it")
	dbURL := databaseURLFlag(fs, env)
	if err := fs.Parse(args); err != nil {
		return usageError("%v", err)
	}
	if *print {
		_, err := fmt.Fprint(env.stdout, fluxsql.Script())
		return err
	}
	pool, err := connect(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := fluxsql.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintf(env.stdout, "schema is current (version %d)\n", fluxsql.LatestVersion())
		return nil
	}
	fmt.Fprintf(env.stdout, "applied migrations %v; schema is now version %d\n", applied, fluxsql.LatestVersion())
	return nil
}
