package sql

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// StreamIndexSQL creates the index ordered delivery's head check needs: a stream's undelivered
// rows by order key (schema 6; see docs/ordering.md). It is not part of the migrations because
// producers pay for it on every insert that has a stream_id (pgbench, 8 clients, asynchronous
// commit, median of three: 21,187 transactions/s with it against 23,074 without, 8%), so it
// exists only once something orders its streams: `fluxhook endpoints add|update --ordering
// stream` and a dispatcher with WEBHOOK_ORDERING=stream, or one that sees an ordered
// endpoint, create it. CONCURRENTLY: producers go on inserting while it is built.
const StreamIndexSQL = `CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_outbox_stream_idx
    ON webhook_outbox (stream_id, (coalesce(order_key, id))) WHERE NOT processed AND stream_id IS NOT NULL`

// IndexExecer is what EnsureStreamIndex needs: statements outside a transaction block (CREATE
// INDEX CONCURRENTLY cannot run in one).
type IndexExecer interface {
	Querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// EnsureStreamIndex creates the stream index unless a valid one exists, and reports whether it
// built it. A build that failed half-way leaves an invalid index, which IF NOT EXISTS would
// take for the real one: it is dropped and built again.
func EnsureStreamIndex(ctx context.Context, db IndexExecer) (bool, error) {
	var valid *bool
	err := db.QueryRow(ctx, `SELECT i.indisvalid FROM pg_index i
		WHERE i.indexrelid = to_regclass('webhook_outbox_stream_idx')`).Scan(&valid)
	switch {
	case err == nil && valid != nil && *valid:
		return false, nil
	case err == nil:
		if _, err := db.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS webhook_outbox_stream_idx`); err != nil {
			return false, fmt.Errorf("dropping the invalid stream index (a build that failed): %w", err)
		}
	case err != pgx.ErrNoRows:
		return false, fmt.Errorf("looking for the stream index: %w", err)
	}
	if _, err := db.Exec(ctx, StreamIndexSQL); err != nil {
		return false, fmt.Errorf("creating the stream index that ordered delivery needs "+
			"(run as the table's owner: %s): %w", StreamIndexSQL, err)
	}
	return true, nil
}
