package sql

import (
	"context"
	_ "embed"
	"fmt"
)

//go:embed outbox_ids.sql
var outboxIDsSQL string

// OutboxIDs is what ordered delivery's hold-back assumes of webhook_outbox's ids, as found:
// the dispatcher checks it while an endpoint orders its streams, and `fluxhook status` shows
// it, since a row that can never pass the hold-back is otherwise silently stuck.
type OutboxIDs struct {
	// SequenceCache is the id sequence's CACHE. Above 1 a session draws ids ahead and
	// inserts them after later ids commit, so a stream could go backwards.
	SequenceCache int64
	// BeyondSequence counts unprocessed stream rows keyed beyond the sequence's last value
	// (ids a producer supplied itself): under ordered delivery each waits until the sequence
	// reaches it.
	BeyondSequence int64
}

// CheckOutboxIDs reads OutboxIDs with one scan of the unprocessed rows.
func CheckOutboxIDs(ctx context.Context, db Querier) (OutboxIDs, error) {
	var ids OutboxIDs
	if err := db.QueryRow(ctx, outboxIDsSQL).Scan(&ids.SequenceCache, &ids.BeyondSequence); err != nil {
		return ids, fmt.Errorf("checking the outbox's ids for ordered delivery: %w", err)
	}
	return ids, nil
}
