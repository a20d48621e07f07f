package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every stage is a service
// that must stop completely.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deadline returns the context a test's statements run under: a claim that blocks (a lock it
// should have skipped) fails the test within seconds instead of hanging to the package
// timeout.
func deadline(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// poolWith opens a pool on url whose sessions start with the given settings (as a role's or
// database's own settings would), adjusted by configure when not nil; closed at cleanup.
func poolWith(tb testing.TB, url string, params map[string]string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// openProducer begins a transaction that inserts an event and stays open, as a producer's
// does until it commits: it holds webhook_outbox's RowExclusiveLock and an id of the queue's
// sequence. Rolled back at cleanup, if the test has not ended it.
func openProducer(t *testing.T, ctx context.Context, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('other', '{}')`); err != nil {
		t.Fatal(err)
	}
	return tx
}
