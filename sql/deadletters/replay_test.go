package deadletters_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/deadletters"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// replay runs Replay in a transaction of its own, committed unless it fails.
func replay(t *testing.T, db *sqltest.DB, sel deadletters.Selection, opts deadletters.Options) (deadletters.Outcome, error) {
	t.Helper()
	var out deadletters.Outcome
	err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = deadletters.Replay(context.Background(), tx, sel, opts)
		return err
	})
	return out, err
}

func replayedIDs(o deadletters.Outcome) []int64 {
	out := []int64{}
	for _, r := range o.Replayed {
		out = append(out, r.ID)
	}
	return out
}

// TestReplayScoped: a tenant replays only its own dead letters. Another tenant's, named by
// row id or delivery id, is not found and nothing at all is replayed; a filter never reaches
// it; ToEndpoint cannot name another tenant's endpoint; and a skip never names another tenant.
func TestReplayScoped(t *testing.T) {
	t.Parallel()
	db := setup(t)
	own := insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint})
	theirs := insert(t, db, fixture{tenant: globex, endpoint: globexEndpoint})
	theirDelivery := deliveryOf(t, db, theirs)

	for _, sel := range []deadletters.Selection{
		{Tenant: acme, IDs: []int64{own, theirs}},
		{Tenant: acme, IDs: []int64{own}, DeliveryIDs: []string{theirDelivery}},
	} {
		_, err := replay(t, db, sel, deadletters.Options{})
		var nf *deadletters.NotFoundError
		if !errors.Is(err, deadletters.ErrNotFound) || !errors.As(err, &nf) {
			t.Errorf("Replay(%+v) = %v, want not found", sel, err)
		}
	}
	if got := sent(t, db); len(got) != 0 {
		t.Fatalf("a refused replay sent %v", got)
	}

	// A filter matching both tenants' rows replays the caller's only.
	out, err := replay(t, db, deadletters.Selection{Tenant: acme, Matching: &deadletters.Filter{EventType: "invoice.paid"}}, deadletters.Options{})
	if err != nil || !slices.Equal(replayedIDs(out), []int64{own}) || len(out.Skipped) != 0 {
		t.Fatalf("Replay by filter in acme's scope = %+v, %v; want %d alone", out, err, own)
	}
	if got := sent(t, db); len(got) != 1 || got[deliveryOf(t, db, own)] != 1 {
		t.Errorf("replay by filter sent %v, want acme's event once", got)
	}

	// ToEndpoint: another tenant's endpoint does not exist for acme, even for a dry run.
	_, err = replay(t, db, deadletters.Selection{Tenant: acme, IDs: []int64{own}},
		deadletters.Options{Force: true, DryRun: true, ToEndpoint: globexEndpoint})
	if !errors.Is(err, deadletters.ErrEndpointNotFound) {
		t.Errorf("Replay to another tenant's endpoint = %v, want ErrEndpointNotFound", err)
	}
	out, err = replay(t, db, deadletters.Selection{Tenant: acme, IDs: []int64{own}},
		deadletters.Options{Force: true, DryRun: true, ToEndpoint: acmeOther})
	if err != nil || !slices.Equal(replayedIDs(out), []int64{own}) || out.Target == nil || out.Target.ID != acmeOther {
		t.Errorf("dry run to its own other endpoint = %+v, %v", out, err)
	}

	// Its endpoint given to globex since: skipped. The unscoped caller is told to whom; for
	// the scoped caller the endpoint is gone from its tenant, as a removed one.
	moved := insert(t, db, fixture{tenant: acme, endpoint: acmeOther})
	exec(t, db, `UPDATE webhook_endpoints SET tenant = 'globex' WHERE id = $1::uuid`, acmeOther)
	for scope, want := range map[*string]deadletters.SkipReason{acme: deadletters.SkipEndpointRemoved, nil: deadletters.SkipEndpointOtherTenant} {
		out, err := replay(t, db, deadletters.Selection{Tenant: scope, IDs: []int64{moved}}, deadletters.Options{})
		if err != nil || len(out.Replayed) != 0 || len(out.Skipped) != 1 || out.Skipped[0].Reason != want {
			t.Fatalf("Replay of a dead letter whose endpoint changed tenant (scope %v) = %+v, %v; want %s", scope, out, err, want)
		}
		if tenant := out.Skipped[0].EndpointTenant; (scope == nil) != (tenant != nil && *tenant == "globex") {
			t.Errorf("scope %v: endpoint_tenant %v; only an unscoped caller learns it", scope, tenant)
		}
	}
}

// TestReplaySkipsAndForce: the reasons of the outcome, and the refusals of a selection that
// is not one.
func TestReplaySkipsAndForce(t *testing.T) {
	t.Parallel()
	db := setup(t)
	done := insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, replayed: true})
	first := insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint})
	again := insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, delivery: deliveryOf(t, db, first)})

	out, err := replay(t, db, deadletters.Selection{Tenant: acme, Matching: &deadletters.Filter{EndpointID: acmeEndpoint}}, deadletters.Options{})
	if err != nil || !slices.Equal(replayedIDs(out), []int64{again}) {
		t.Fatalf("Replay = %+v, %v; want %d replayed", out, err, again)
	}
	reasons := map[int64]deadletters.SkipReason{}
	for _, s := range out.Skipped {
		reasons[s.ID] = s.Reason
	}
	if reasons[done] != deadletters.SkipAlreadyReplayed || reasons[first] != deadletters.SkipSuperseded ||
		out.SkippedFor(deadletters.SkipSuperseded)[0].SupersededBy == nil || *out.SkippedFor(deadletters.SkipSuperseded)[0].SupersededBy != again {
		t.Errorf("skipped %+v, want %d already replayed and %d superseded by %d", out.Skipped, done, first, again)
	}
	if rows := out.Rows(); len(rows) != 3 || rows[0].ID != done || rows[2].ID != again {
		t.Errorf("Rows() = %+v, want all three in id order", rows)
	}

	// Named by id, with Force, the superseded and the replayed go too.
	out, err = replay(t, db, deadletters.Selection{IDs: []int64{done, first}}, deadletters.Options{Force: true})
	if err != nil || !slices.Equal(replayedIDs(out), []int64{done, first}) {
		t.Errorf("Replay --force by id = %+v, %v", out, err)
	}

	for _, sel := range []deadletters.Selection{
		{},
		{IDs: []int64{1}, Matching: &deadletters.Filter{EventType: "x"}},
		{Matching: &deadletters.Filter{}},
		{Tenant: acme, Matching: &deadletters.Filter{Tenant: acme}},
		{Matching: &deadletters.Filter{EventType: "x", Limit: 5}},
		{DeliveryIDs: []string{"nope"}},
		{IDs: []int64{-1}},
	} {
		if _, err := replay(t, db, sel, deadletters.Options{}); !errors.Is(err, deadletters.ErrInvalid) {
			t.Errorf("Replay(%+v) = %v, want ErrInvalid", sel, err)
		}
	}
}

// TestPurgeScoped: a tenant purges only its own dead letters; another's, named, is left.
func TestPurgeScoped(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	own := insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, replayed: true})
	theirs := insert(t, db, fixture{tenant: globex, endpoint: globexEndpoint, replayed: true})

	got, err := deadletters.Purge(ctx, db.Pool, deadletters.Selection{Tenant: acme, IDs: []int64{own, theirs}}, deadletters.PurgeOptions{})
	if err != nil || len(got) != 1 || got[0].ID != own {
		t.Errorf("Purge in acme's scope = %+v, %v; want %d alone", got, err, own)
	}
	got, err = deadletters.Purge(ctx, db.Pool, deadletters.Selection{Tenant: acme, Matching: &deadletters.Filter{}},
		deadletters.PurgeOptions{ReplayedOnly: true})
	if err != nil || len(got) != 0 {
		t.Errorf("Purge of acme's replayed = %+v, %v; want none left", got, err)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE id = $1`, theirs); n != 1 {
		t.Error("another tenant's dead letter was purged")
	}
	if _, err := deadletters.Purge(ctx, db.Pool, deadletters.Selection{Matching: &deadletters.Filter{}}, deadletters.PurgeOptions{}); !errors.Is(err, deadletters.ErrInvalid) {
		t.Errorf("Purge of everything = %v, want ErrInvalid", err)
	}
}

// TestReplaySkipsAURLTooLongForTheQueue: a dead letter whose endpoint_url is longer than the
// queue takes since schema 21 (only one written before it can be) is skipped, saying so,
// instead of failing the replay: a filtered replay that selects it still replays the others
// (it rolled back whole). Replayed to a managed endpoint, it goes.
func TestReplaySkipsAURLTooLongForTheQueue(t *testing.T) {
	t.Parallel()
	db := setup(t)
	short := insert(t, db, fixture{tenant: acme, eventType: "order.old"})
	long := insert(t, db, fixture{tenant: acme, eventType: "order.old"})
	// Written as before schema 21: the dead-letter table has no limit on the URL.
	exec(t, db, `UPDATE webhook_dead_letter SET endpoint_url = 'https://consumer.example/' || repeat('a', 3000) WHERE id = $1`, long)
	exec(t, db, `UPDATE webhook_dead_letter SET endpoint_url = 'https://consumer.example/short' WHERE id = $1`, short)

	out, err := replay(t, db, deadletters.Selection{Tenant: acme, Matching: &deadletters.Filter{EventType: "order.old"}}, deadletters.Options{})
	if err != nil {
		t.Fatalf("filtered replay: %v", err)
	}
	if !slices.Equal(replayedIDs(out), []int64{short}) {
		t.Errorf("replayed %v, want %d alone", replayedIDs(out), short)
	}
	if skipped := out.SkippedFor(deadletters.SkipURLTooLong); len(skipped) != 1 || skipped[0].ID != long {
		t.Errorf("skipped as too long: %+v, want dead letter %d", skipped, long)
	}
	out, err = replay(t, db, deadletters.Selection{Tenant: acme, IDs: []int64{long}}, deadletters.Options{ToEndpoint: acmeOther})
	if err != nil || !slices.Equal(replayedIDs(out), []int64{long}) {
		t.Fatalf("replay to a managed endpoint = %+v, %v; want it replayed", out, err)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE delivery_id = $1 AND endpoint_id = $2 AND endpoint_url IS NULL`,
		deliveryOf(t, db, long), acmeOther); n != 1 {
		t.Errorf("%d rows of the event for the managed endpoint, want 1", n)
	}
}
