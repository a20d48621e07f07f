package sql

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// streamIndexLock is the advisory lock that serializes EnsureStreamIndex across sessions: while
// one builds the index, the index exists but is not valid yet, and another must wait for the
// build instead of taking it for a failed one and dropping it (which deadlocks with the build).
const streamIndexLock = 7_164_913_504_118_233_601

// EnsureStreamIndex creates the stream index unless a valid one exists, and reports whether it
// built it. A build that failed half-way leaves an invalid index, which IF NOT EXISTS would
// take for the real one: it is dropped and built again. Sessions that ensure the index at the
// same time (instances starting together) take turns: the lock is tried without waiting inside
// a statement, since CREATE INDEX CONCURRENTLY waits for every statement that is running.
func EnsureStreamIndex(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("ensuring the stream index: %w", err)
	}
	defer conn.Release()
	for {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(streamIndexLock)).Scan(&got); err != nil {
			return false, fmt.Errorf("ensuring the stream index: %w", err)
		}
		if got {
			break
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("ensuring the stream index: waiting for another session's build: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(streamIndexLock))
	}()
	var valid *bool
	err = conn.QueryRow(ctx, `SELECT i.indisvalid FROM pg_index i
		WHERE i.indexrelid = to_regclass('webhook_outbox_stream_idx')`).Scan(&valid)
	switch {
	case err == nil && valid != nil && *valid:
		return false, nil
	case err == nil:
		if _, err := conn.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS webhook_outbox_stream_idx`); err != nil {
			return false, fmt.Errorf("dropping the invalid stream index (a build that failed): %w", err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("looking for the stream index: %w", err)
	}
	if _, err := conn.Exec(ctx, StreamIndexSQL); err != nil {
		return false, fmt.Errorf("creating the stream index that ordered delivery needs "+
			"(run as the table's owner: %s): %w", StreamIndexSQL, err)
	}
	return true, nil
}
