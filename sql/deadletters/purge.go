package deadletters

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// PurgeOptions tune Purge.
type PurgeOptions struct {
	// ReplayedOnly deletes only the selected rows already replayed: the routine clean-up,
	// which can delete nothing that was not dealt with. With it, a Matching filter may be
	// empty.
	ReplayedOnly bool
}

// Purge deletes the selected dead letters and returns them, in row id order: the only way
// dead letters leave the table, since the janitor keeps them. A reference that finds nothing
// is no error (purging is idempotent): compare the result with the references to say so.
//
// A dead letter at which its ordered stream stopped releases the stream: the event is given
// up, and the stream goes on with its next one (the dispatchers are woken at commit). Run it
// in a transaction and roll back for a dry run.
func Purge(ctx context.Context, q Querier, sel Selection, opts PurgeOptions) ([]Ref, error) {
	if err := sel.check("purge"); err != nil {
		return nil, err
	}
	var s shape
	var args pgx.NamedArgs
	if sel.Matching != nil {
		if sel.Matching.empty() && !opts.ReplayedOnly {
			return nil, invalid("selection", "a filter to purge needs a condition besides the tenant, or ReplayedOnly: purging every dead letter at once is never what was meant")
		}
		var err error
		if s, args, err = sel.Matching.conditions(sel.Tenant); err != nil {
			return nil, err
		}
	} else {
		_, _, args = sel.refArgs()
		s = shape{ByRef: true, Scope: sel.Tenant != nil}
	}
	s.PurgeReplayedOnly = opts.ReplayedOnly
	rows, _ := q.Query(ctx, render("purge.sql", s), args)
	purged, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Ref, error) {
		var ref Ref
		return ref, r.Scan(&ref.ID, &ref.DeliveryID)
	})
	if err != nil {
		return nil, fmt.Errorf("purging: %w", err)
	}
	if purged == nil {
		purged = []Ref{}
	}
	return purged, nil
}

// existsSQL reads which of the referenced dead letters exist in the caller's scope.
const existsSQL = `SELECT d.id, d.delivery_id::text FROM webhook_dead_letter d
WHERE (d.id = ANY (@ids::bigint[]) OR d.delivery_id = ANY (@delivery_ids::uuid[]))
  AND (@scope::text IS NULL OR d.tenant = @scope)`

// Missing returns a NotFoundError naming the references of sel (row ids, delivery ids) that
// find no dead letter in its tenant, or nil when each finds one; a Matching selection names
// none. Purge itself is idempotent and says nothing of a reference that found nothing: a
// caller that must tell "gone already" or "mistyped" from "deleted" (the CLI, whose exit
// status says whether it did what it was asked) asks first, in the same transaction.
func Missing(ctx context.Context, q Querier, sel Selection) error {
	if sel.Matching != nil {
		return nil
	}
	ids, deliveries, args := sel.refArgs()
	if _, ok := args["scope"]; !ok {
		args["scope"] = nil
	}
	rows, _ := q.Query(ctx, existsSQL, args)
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (locked, error) {
		var l locked
		return l, r.Scan(&l.ID, &l.DeliveryID)
	})
	if err != nil {
		return fmt.Errorf("reading dead letters: %w", err)
	}
	return missing(ids, deliveries, found)
}
