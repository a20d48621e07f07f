package main

import (
	"context"
	"fmt"
	"time"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

func init() {
	commands["migrate"] = command{summary: "Install or upgrade the schema (or --print it for psql)", run: runMigrate}
}

// runMigrate applies the embedded migrations under an advisory lock, or prints them as one
// script for users who install schemas with psql.
func runMigrate(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("migrate", env, "fluxhook migrate [--print] [--lock-timeout DURATION]")
	print := fs.Bool("print", false, "print the schema as one SQL script, for psql \"$DATABASE_URL\" -v ON_ERROR_STOP=1 -f FILE, instead of applying it")
	lockTimeout := fs.Duration("lock-timeout", fluxsql.DefaultLockTimeout,
		"longest wait for each table lock (every producer's insert waits behind it); then roll back and retry, "+
			fmt.Sprint(fluxsql.DefaultLockAttempts)+" attempts in all; 0 waits as long as it takes")
	dbURL := databaseURLFlag(fs, env)
	if err := noArguments(fs, args); err != nil {
		return err
	}
	if *lockTimeout < 0 {
		return usageError("--lock-timeout must not be negative")
	}
	opts := fluxsql.MigrateOptions{LockTimeout: *lockTimeout}
	if *lockTimeout == 0 {
		opts.LockTimeout = -1 // MigrateOptions' "no bound"; its zero means the default
	}
	if *print {
		_, err := fmt.Fprint(env.stdout, fluxsql.ScriptWith(opts))
		return err
	}
	opts.OnLockTimeout = func(attempt int, pause time.Duration, err error) {
		fmt.Fprintf(env.stderr, "fluxhook migrate: attempt %d of %d: a lock was not granted within %s (another transaction holds a lock on the schema's tables); rolled back, retrying in %s\n",
			attempt, fluxsql.DefaultLockAttempts, *lockTimeout, pause)
	}
	pool, err := connect(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := fluxsql.MigrateWith(ctx, pool, opts)
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
