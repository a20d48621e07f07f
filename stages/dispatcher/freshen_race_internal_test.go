package dispatcher

import (
	"context"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.uber.org/zap/zaptest"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/delivery"
)

const raceKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="

// pauseLoadIDs holds LoadIDs (freshen's read) after its rows were read, before freshen merges
// them: the window in which the preparing stage has read and not yet taken c.mu.
type pauseLoadIDs struct {
	read    chan struct{} // closed once LoadIDs has read its rows
	proceed chan struct{} // closed by the test to let freshen merge
}

type pauseKey struct{}

func (p *pauseLoadIDs) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "id = ANY ($1::uuid[])") {
		return context.WithValue(ctx, pauseKey{}, true)
	}
	return ctx
}

func (p *pauseLoadIDs) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(pauseKey{}) != nil {
		close(p.read)
		<-p.proceed
	}
}

// TestFreshenDoesNotOverwriteANewerConfirmedLoad: freshen reads the batch's endpoints, then
// merges them into the shared cache under c.mu with no check that no load was stored in
// between. The claiming loop's refresh (not serialized with freshen) can load the endpoints
// after a change committed, confirm the cache, and store it; freshen then puts back the row
// it read before the commit. The cache is left confirmed with the rotated-out secret, so
// freshen no longer runs and every later delivery is signed with the old secret (until the
// next version bump or EndpointRecheck).
func TestFreshenDoesNotOverwriteANewerConfirmedLoad(t *testing.T) {
	ctx := t.Context()
	db := sqltest.NewMigrated(t)
	cipher, err := endpoints.NewCipher(raceKey, "")
	if err != nil {
		t.Fatal(err)
	}
	ep, err := endpoints.Add(ctx, db.Pool, cipher, endpoints.New{URL: "http://127.0.0.1:9/hook", Scheme: endpoints.SchemeStandard})
	if err != nil {
		t.Fatal(err)
	}
	version := func() int64 { return db.EndpointsVersion(t) }
	xmin := func() uint64 {
		var x uint64
		if err := db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}

	d, err := New(Config{DatabaseURL: db.URL, EncryptionKey: raceKey, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.closeClients)
	pause := &pauseLoadIDs{read: make(chan struct{}), proceed: make(chan struct{})}
	poolCfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	poolCfg.ConnConfig.Tracer = pause
	d.pool, err = pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.pool.Close)
	// Let a paused read go on before the pool closes (cleanups run last first), so that a
	// failed step fails the test instead of hanging it.
	var released sync.Once
	release := func() { released.Do(func() { close(pause.proceed) }) }
	t.Cleanup(release)

	// An older transaction elsewhere holds xmin back: the cache's first load is not confirmed.
	hold, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(context.Background())
	if _, err := hold.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	d.endpoints.version.Store(version())
	d.endpoints.xmin.Store(xmin())
	d.refreshEndpoints(ctx)
	if d.endpoints.confirmedFor(nil) {
		t.Fatal("setup: the cache was confirmed with xmin held back")
	}

	// A rotation (no grace) is open; a claim has seen its version bump.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	newSecret, err := endpoints.RotateSecret(ctx, tx, cipher, ep.ID, "", -1)
	if err != nil {
		t.Fatal(err)
	}
	d.endpoints.version.Store(version())
	d.refreshEndpoints(ctx) // the claim loop's refresh for the bump: old rows, unconfirmed

	// The preparing stage freshens a batch (claimed while the rotation was still open) and
	// has read the row, the old secret, when it is descheduled.
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.freshen(ctx, []*delivery.Delivery{{EndpointID: ep.ID}})
	}()
	<-pause.read

	// Meanwhile the rotation commits, the long transaction ends, a claim's snapshot passes
	// both, and the claiming loop's refresh confirms the cache with the new secret.
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// The server's real xmin may still be held back by other databases' transactions (CI runs
	// packages at once); every transaction that could have bumped this version has ended.
	d.endpoints.xmin.Store(math.MaxUint64)
	d.refreshEndpoints(ctx)
	if !d.endpoints.confirmedFor(nil) {
		t.Fatal("setup: the cache was not confirmed after every transaction ended")
	}
	if got := d.endpoints.lookup(ep.ID).ep.Secret; got != newSecret {
		t.Fatalf("setup: the confirming load holds %q, want the new secret", got)
	}

	release()
	<-done

	m := d.endpoints.lookup(ep.ID)
	if d.endpoints.confirmedFor(nil) && m.ep.Secret != newSecret {
		t.Errorf("the cache is confirmed at the current version yet holds the rotated-out secret (old %v, new %v): freshen merged a read older than the confirming load; every later delivery skips freshen and is signed with the old secret",
			m.ep.Secret == ep.Secret, m.ep.Secret == newSecret)
	}
	// A delivery enqueued now (after the commit), prepared as prepare does: freshen skips it
	// (confirmed), and it is signed by the cache.
	del := &delivery.Delivery{DeliveryID: "0b6f3b52-5d0a-4c8e-9f59-6a1c0e3c9d11", EventType: "test.event",
		Payload: []byte(`{"n":1}`), Attempt: 1, EnqueuedAt: time.Now(), EndpointID: ep.ID, Header: http.Header{}}
	batch := []*delivery.Delivery{del}
	d.freshen(ctx, batch)
	if reason, _ := d.validate(del); reason != "" {
		t.Fatalf("validate: %s", reason)
	}
	if reason := d.signManaged(del, time.Now()); reason != "" {
		t.Fatalf("signManaged: %s", reason)
	}
	verifies := func(secret string) bool {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			t.Fatal(err)
		}
		return wh.Verify(del.Payload, del.Header) == nil
	}
	if verifies(ep.Secret) || !verifies(newSecret) {
		t.Errorf("a delivery enqueued after the rotation committed: old secret verifies %v, new verifies %v; want only the new",
			verifies(ep.Secret), verifies(newSecret))
	}
}
