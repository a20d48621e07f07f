package main

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
)

//go:embed queries/dlq_purge.sql
var dlqPurgeSQL string

// runDLQPurge deletes dead letters: the only way they leave the table, since the janitor
// keeps them. Like bulk replay, deleting by filter needs an explicit filter, and --dry-run
// shows what would go.
func runDLQPurge(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("dlq purge", env, "fluxhook dlq purge [--dry-run] ID... | --all-matching FILTER... [--replayed-only]")
	dbURL := databaseURLFlag(fs, env)
	all := fs.Bool("all-matching", false, "purge every dead letter matching the filters (at least one filter required)")
	filter := addDLQFilterFlags(fs)
	replayedOnly := fs.Bool("replayed-only", false, "only dead letters that were already replayed")
	dryRun := fs.Bool("dry-run", false, "report what would be purged and change nothing")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	ids, err := selection("purge", positional, *all, filter)
	if err != nil {
		return err
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	args2 := append(filter.sqlArgs(), any(nil), *replayedOnly)
	if ids != nil {
		args2[3] = ids
	}
	var purged []int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, dlqPurgeSQL, args2...)
		var err error
		purged, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("purging: %w", err)
		}
		if *dryRun {
			return errDryRun
		}
		return nil
	})
	if err != nil && err != errDryRun {
		return err
	}
	verb := "purged"
	if *dryRun {
		verb = "would purge"
	}
	fmt.Fprintf(env.stdout, "%s %d dead letter(s)", verb, len(purged))
	if len(purged) > 0 {
		fmt.Fprintf(env.stdout, ": %s", joinIDs(purged))
	}
	fmt.Fprintln(env.stdout)
	return nil
}

// errDryRun rolls back a dry run's transaction.
var errDryRun = fmt.Errorf("dry run")
