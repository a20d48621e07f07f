package sql

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// StreamIndexSQL creates the index ordered delivery's head check needs: a stream's undelivered
// rows by endpoint key and order key (schema 6; see docs/ordering.md). The endpoint key (the
// claim's: 'ep:<endpoint_id>', else endpoint_url, else the empty string) is in it so that the
// look for a row's predecessors reads only its own endpoint's rows: keyed by stream alone, a
// delivery to a healthy endpoint read every row another endpoint of its stream had waiting
// (20,000 rows behind a down consumer: 13 ms per look, 1.3 s for a claim passing 100 such
// deliveries). It is not part of the migrations because producers pay for it on every insert
// that has a stream_id (pgbench, 8 clients, asynchronous commit, median of three: 21,187
// transactions/s with it against 23,074 without, 8%), so it exists only once something orders
// its streams: `fluxhook endpoints add|update --ordering stream` and a dispatcher with
// WEBHOOK_ORDERING=stream, or one that sees an ordered endpoint, create it. CONCURRENTLY:
// producers go on inserting while it is built.
const StreamIndexSQL = `CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_outbox_stream_idx
    ON webhook_outbox (stream_id, (coalesce('ep:' || endpoint_id::text, endpoint_url, '')), (coalesce(order_key, id)))
    WHERE NOT processed AND stream_id IS NOT NULL`

// streamIndexColumns is the number of key columns of StreamIndexSQL's index; an index of that
// name with fewer is the stream index before the endpoint key was added to it.
const streamIndexColumns = 3

// streamIndexNext is the name under which EnsureStreamIndex builds the current index beside an
// older one, before it replaces it.
const streamIndexNext = "webhook_outbox_stream_next_idx"

// ErrStreamIndexOutdated is wrapped by EnsureStreamIndex's error when a usable stream index
// exists but could not be brought to its current form and name: the older form (keyed by
// stream alone), which ordered delivery uses more slowly for streams that several endpoints
// order, or the current form left under its successor's name. Callers may go on.
var ErrStreamIndexOutdated = errors.New("the stream index is in its older form")

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
	main, err := indexState(ctx, conn.Conn(), "webhook_outbox_stream_idx")
	if err != nil {
		return false, err
	}
	next, err := indexState(ctx, conn.Conn(), streamIndexNext)
	if err != nil {
		return false, err
	}
	if next == indexCurrent && main != indexCurrent {
		// A replacement stopped after building the successor (before or after dropping the
		// older index): finish it, keeping the successor. Until then the successor serves the
		// head check under its own name: a role that cannot finish it is told what to run.
		finish := fmt.Sprintf("(run as the table's owner: DROP INDEX CONCURRENTLY IF EXISTS webhook_outbox_stream_idx; "+
			"ALTER INDEX %s RENAME TO webhook_outbox_stream_idx)", streamIndexNext)
		if main != indexMissing {
			if err := dropIndex(ctx, conn.Conn(), "webhook_outbox_stream_idx"); err != nil {
				return false, fmt.Errorf("%w; finishing its replacement failed %s: %w", ErrStreamIndexOutdated, finish, err)
			}
		}
		if err := renameNext(ctx, conn.Conn()); err != nil {
			return false, fmt.Errorf("%w; finishing its replacement failed %s: %w", ErrStreamIndexOutdated, finish, err)
		}
		return true, nil
	}
	if next != indexMissing {
		if err := dropIndex(ctx, conn.Conn(), streamIndexNext); err != nil {
			err = fmt.Errorf("dropping %s (a replacement of the stream index that failed): %w", streamIndexNext, err)
			switch main {
			case indexCurrent:
				return false, nil // a leftover beside the index ordering uses: harmless
			case indexOlder:
				return false, fmt.Errorf("%w; %w", ErrStreamIndexOutdated, err)
			}
			return false, err
		}
	}
	switch main {
	case indexCurrent:
		return false, nil
	case indexOlder:
		// Built beside the older index and swapped in, so that ordered claims always have one.
		build := strings.Replace(StreamIndexSQL, "webhook_outbox_stream_idx", streamIndexNext, 1)
		if _, err := conn.Exec(ctx, build); err != nil {
			return false, fmt.Errorf("%w; replacing it failed (run as the table's owner: %s; "+
				"DROP INDEX CONCURRENTLY webhook_outbox_stream_idx; ALTER INDEX %s RENAME TO webhook_outbox_stream_idx): %w",
				ErrStreamIndexOutdated, build, streamIndexNext, err)
		}
		if err := dropIndex(ctx, conn.Conn(), "webhook_outbox_stream_idx"); err != nil {
			return false, fmt.Errorf("%w; dropping it after building its successor failed: %w", ErrStreamIndexOutdated, err)
		}
		return true, renameNext(ctx, conn.Conn())
	case indexInvalid:
		if err := dropIndex(ctx, conn.Conn(), "webhook_outbox_stream_idx"); err != nil {
			return false, fmt.Errorf("dropping the invalid stream index (a build that failed): %w", err)
		}
	}
	if _, err := conn.Exec(ctx, StreamIndexSQL); err != nil {
		return false, fmt.Errorf("creating the stream index that ordered delivery needs "+
			"(run as the table's owner: %s): %w", StreamIndexSQL, err)
	}
	// IF NOT EXISTS does nothing, without an error, when another relation of the schema has the
	// name: reported built, the index was never looked for again.
	if state, err := indexState(ctx, conn.Conn(), "webhook_outbox_stream_idx"); err != nil || state != indexCurrent {
		if err == nil {
			err = errors.New("another relation of webhook_outbox's schema has its name: rename or drop it")
		}
		return false, fmt.Errorf("creating the stream index that ordered delivery needs: %w", err)
	}
	return true, nil
}

// StreamIndexUsable reports whether a valid stream index exists, in its current form or an
// older one that EnsureStreamIndex would replace: the head check can use either, so a caller
// that must not wait for a build (a dispatcher starting) may leave the replacement to later.
func StreamIndexUsable(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("looking for the stream index: %w", err)
	}
	defer conn.Release()
	for _, name := range []string{"webhook_outbox_stream_idx", streamIndexNext} {
		state, err := indexState(ctx, conn.Conn(), name)
		if err != nil {
			return false, err
		}
		if state == indexCurrent || state == indexOlder {
			return true, nil
		}
	}
	return false, nil
}

// indexStatus is what EnsureStreamIndex finds under an index name.
type indexStatus int

const (
	indexMissing indexStatus = iota
	indexInvalid             // a build that failed (or is running in a session that does not hold the lock)
	indexOlder               // valid, keyed by stream alone
	indexCurrent             // valid, StreamIndexSQL's
)

// indexState reads the state of the index name on webhook_outbox. It looks the name up among
// that table's own indexes, not through the search_path: an index of that name in another
// schema on the path (a role that may create objects there could plant one) was taken for the
// stream index, and a dispatcher owning the outbox dropped the real one and never rebuilt it.
// The statements that drop or rename it name its schema for the same reason (see qualified).
func indexState(ctx context.Context, conn *pgx.Conn, name string) (indexStatus, error) {
	var valid bool
	var columns int
	err := conn.QueryRow(ctx, `SELECT i.indisvalid, i.indnkeyatts
		FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = 'webhook_outbox'::pg_catalog.regclass AND c.relname = $1`, name).Scan(&valid, &columns)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return indexMissing, nil
	case err != nil:
		return indexMissing, fmt.Errorf("looking for index %s: %w", name, err)
	case !valid:
		return indexInvalid, nil
	case columns < streamIndexColumns:
		return indexOlder, nil
	}
	return indexCurrent, nil
}

// renameNext gives the successor built beside the older stream index that index's name.
func renameNext(ctx context.Context, conn *pgx.Conn) error {
	next, err := qualified(ctx, conn, streamIndexNext)
	if err == nil {
		_, err = conn.Exec(ctx, `ALTER INDEX `+next+` RENAME TO webhook_outbox_stream_idx`)
	}
	if err != nil {
		return fmt.Errorf("renaming %s to webhook_outbox_stream_idx: %w", streamIndexNext, err)
	}
	return nil
}

// dropIndex drops the index name of webhook_outbox's schema, if it exists, concurrently.
func dropIndex(ctx context.Context, conn *pgx.Conn, name string) error {
	q, err := qualified(ctx, conn, name)
	if err == nil {
		_, err = conn.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+q)
	}
	return err
}

// qualified is name in webhook_outbox's schema, quoted: where its indexes are.
func qualified(ctx context.Context, conn *pgx.Conn, name string) (string, error) {
	var q string
	err := conn.QueryRow(ctx, `SELECT pg_catalog.format('%I.%I', n.nspname, $1::text)
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = 'webhook_outbox'::pg_catalog.regclass`, name).Scan(&q)
	return q, err
}
