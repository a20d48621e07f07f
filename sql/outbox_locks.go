package sql

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// IsLockTimeout reports whether err is PostgreSQL's lock_not_available: a statement waited its
// lock_timeout for a lock another session holds.
func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable
}

// RowsQuerier runs a query returning rows: a pool, a connection or a transaction.
type RowsQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// LockedOutboxRows returns which of the outbox rows ids another session holds locked now,
// without waiting for any: the rows FOR UPDATE SKIP LOCKED passes over. The rows it can lock
// are locked for the look's own instant (its transaction), which no statement of the
// dispatcher that leases them waits for: only that dispatcher writes them. A dispatcher's
// statement that waited its lock_timeout for one of its rows (settle.sql, route.sql) looks once,
// leaves the locked rows to their lease and writes the others, instead of waiting again for
// each locked row in turn.
func LockedOutboxRows(ctx context.Context, q RowsQuerier, ids []int64) (map[int64]bool, error) {
	rows, err := q.Query(ctx, `
		SELECT o.id FROM webhook_outbox o WHERE o.id = ANY ($1)
		EXCEPT
		SELECT f.id FROM (SELECT id FROM webhook_outbox WHERE id = ANY ($1) FOR UPDATE SKIP LOCKED) f`, ids)
	if err != nil {
		return nil, err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	locked := make(map[int64]bool, len(found))
	for _, id := range found {
		locked[id] = true
	}
	return locked, nil
}
