package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/audit"
	"github.com/fluxora/fluxhook/sql/deadletters"
)

// runDLQPurge deletes dead letters: the only way they leave the table, since the janitor
// keeps them. Like bulk replay, deleting by filter needs an explicit filter, and --dry-run
// shows what would go. --replayed-only counts as one: purging what was already replayed is
// the routine clean-up, and it can delete nothing that was not dealt with.
func runDLQPurge(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("dlq purge", env, "fluxhook dlq purge [--replayed-only] [--dry-run] ID|DELIVERY-ID... | --all-matching [FILTER...] [--replayed-only]")
	dbURL := databaseURLFlag(fs, env)
	all := fs.Bool("all-matching", false, "purge every dead letter matching the filters (at least one filter, or --replayed-only, required)")
	filter := addDLQFilterFlags(fs)
	replayedOnly := fs.Bool("replayed-only", false, "only dead letters that were already replayed")
	dryRun := fs.Bool("dry-run", false, "report what would be purged and change nothing")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	refs, err := selection("purge", positional, *all, filter, *replayedOnly)
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
	var purged []deadletters.Ref
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if purged, err = deadletters.Purge(ctx, tx, sel, deadletters.PurgeOptions{ReplayedOnly: *replayedOnly}); err != nil {
			return err
		}
		if *dryRun {
			return errDryRun
		}
		actor := audit.CLIActor()
		changes := make([]audit.Change, len(purged))
		for i, r := range purged {
			changes[i] = audit.Change{Actor: actor, Action: "dead_letter.purge", ObjectType: "dead_letter",
				ObjectID: strconv.FormatInt(r.ID, 10), Before: map[string]any{"delivery_id": r.DeliveryID}}
		}
		return audit.RecordAll(ctx, tx, changes)
	})
	if err != nil && err != errDryRun {
		return err
	}
	verb := "purged"
	if *dryRun {
		verb = "would purge"
	}
	// A delivery id can stand for several dead letters (endpoints, earlier failures): say
	// which, and say so when it stood for none rather than report a bare 0.
	for _, line := range refs.selected(purged) {
		if *replayedOnly {
			line += " (--replayed-only: those already replayed)"
		}
		fmt.Fprintln(env.stdout, line)
	}
	fmt.Fprintf(env.stdout, "%s %d dead letter(s)", verb, len(purged))
	if len(purged) > 0 {
		ids := make([]int64, len(purged))
		for i, l := range purged {
			ids[i] = l.ID
		}
		fmt.Fprintf(env.stdout, ": %s", joinIDs(ids))
	}
	fmt.Fprintln(env.stdout)
	return nil
}

// errDryRun rolls back a dry run's transaction.
var errDryRun = fmt.Errorf("dry run")
