package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
		// A mistyped or already purged id purges nothing, and the operator must hear of it
		// rather than read a "purged 0" that exits 0; the others are not purged either, as
		// replay replays none when one id is missing.
		if err := deadletters.Missing(ctx, tx, sel); err != nil {
			return err
		}
		var err error
		if purged, err = deadletters.Purge(ctx, tx, sel, deadletters.PurgeOptions{ReplayedOnly: *replayedOnly}); err != nil {
			return err
		}
		if len(purged) == 0 && !*dryRun {
			return errNothingPurged
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
	switch {
	case errors.Is(err, deadletters.ErrNotFound):
		return notFound(err, "purged")
	case err == errNothingPurged && *all && *replayedOnly:
		return errors.New("nothing purged: no dead letter matching the filters was replayed yet (--replayed-only); fluxhook dlq list with the same filters shows them")
	case err == errNothingPurged && *all:
		return errors.New("nothing purged: no dead letter matches the filters; fluxhook dlq list with the same filters shows what they match")
	case err == errNothingPurged:
		return errors.New("nothing purged: none of the dead letters selected was replayed yet (--replayed-only purges only those); fluxhook dlq show ID says whether one was")
	case err != nil && err != errDryRun:
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

// errNothingPurged says a purge selected rows that exist but deleted none of them (a filter
// matching nothing, or --replayed-only with none replayed): the command did nothing it was
// asked to, and exits 1.
var errNothingPurged = errors.New("nothing purged")

// notFound is the message for references (ids, delivery ids) that name no dead letter: which
// ones, for a command that then did nothing what (verb: "purged", "replayed"; "" for a read),
// and where the right ones are listed. Other errors are returned as they are.
func notFound(err error, verb string) error {
	var nf *deadletters.NotFoundError
	if !errors.As(err, &nf) {
		return err
	}
	var parts []string
	if len(nf.IDs) > 0 {
		parts = append(parts, "no dead letter with id "+joinIDs(nf.IDs))
	}
	if len(nf.DeliveryIDs) > 0 {
		parts = append(parts, "no dead letter with delivery id "+strings.Join(nf.DeliveryIDs, ", "))
	}
	if verb != "" {
		parts = append(parts, "nothing "+verb)
	}
	return fmt.Errorf("%s; list them with fluxhook dlq list", strings.Join(parts, "; "))
}
