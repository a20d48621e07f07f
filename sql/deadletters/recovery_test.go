package deadletters_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/deadletters"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

func start(t *testing.T, db *sqltest.DB, endpoint string, since time.Duration, tenant *string) deadletters.Recovery {
	t.Helper()
	r, err := deadletters.StartRecovery(context.Background(), db.Pool, endpoint, time.Now().Add(-since), "test", tenant)
	if err != nil {
		t.Fatalf("StartRecovery(%s): %v", endpoint, err)
	}
	return r
}

// onceEach fails unless every delivery in want was sent exactly once, and nothing else.
func onceEach(t *testing.T, db *sqltest.DB, want []string) {
	t.Helper()
	got := sent(t, db)
	for _, d := range want {
		if got[d] != 1 {
			t.Errorf("delivery %s was sent %d times, want once", d, got[d])
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d deliveries sent, want %d", len(got), len(want))
	}
}

// TestRecoveryProgress: a recovery counts the endpoint's dead letters not yet replayed since
// its time, replays them in batches, each moving done, and ends done; it leaves alone those of
// other endpoints, those before its time, those already replayed, and those failing after it
// started.
func TestRecoveryProgress(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	var want []string
	for range 5 {
		want = append(want, deliveryOf(t, db, insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: time.Hour})))
	}
	insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: time.Hour, replayed: true})
	insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: 3 * time.Hour})
	insert(t, db, fixture{tenant: acme, endpoint: acmeOther, failedAgo: time.Hour})

	r := start(t, db, acmeEndpoint, 2*time.Hour, acme)
	if r.State != deadletters.RecoveryRunning || r.Total != 5 || r.Done != 0 || r.CreatedBy != "test" ||
		r.Tenant == nil || *r.Tenant != "acme" || r.EndpointID != acmeEndpoint {
		t.Fatalf("StartRecovery = %+v, want running with total 5", r)
	}
	// Failed after the job started: not its business.
	insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: -time.Second})

	var progress []int
	runner := deadletters.Runner{BatchSize: 2, AfterBatch: func(r deadletters.Recovery) {
		// What GET shows between batches.
		got, err := deadletters.GetRecovery(ctx, db.Pool, r.ID, acme)
		if err != nil || got.State != deadletters.RecoveryRunning || got.Total != 5 {
			t.Errorf("GetRecovery between batches = %+v, %v", got, err)
		}
		progress = append(progress, got.Done)
	}}
	r, err := runner.Run(ctx, db.Pool, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != deadletters.RecoveryDone || r.Done != 5 || r.Total != 5 || r.Replayed != 5 || r.FinishedAt == nil || r.Error != nil {
		t.Errorf("the recovery ended as %+v, want done 5 of 5, 5 replayed", r)
	}
	if !slices.Equal(progress, []int{2, 4, 5}) {
		t.Errorf("done after each batch: %v, want [2 4 5]", progress)
	}
	onceEach(t, db, want)

	// Another tenant's job does not exist for acme; a malformed id is not found either.
	if _, err := deadletters.GetRecovery(ctx, db.Pool, r.ID, globex); !errors.Is(err, deadletters.ErrNotFound) {
		t.Errorf("GetRecovery from another tenant = %v, want ErrNotFound", err)
	}
	if _, err := deadletters.GetRecovery(ctx, db.Pool, "42", nil); !errors.Is(err, deadletters.ErrNotFound) {
		t.Errorf("GetRecovery of a malformed id = %v, want ErrNotFound", err)
	}
	// Run again: nothing to do.
	if again, err := deadletters.RunRecovery(ctx, db.Pool, r.ID); err != nil || again.Done != 5 || again.State != deadletters.RecoveryDone {
		t.Errorf("RunRecovery of a done job = %+v, %v", again, err)
	}
	onceEach(t, db, want)
}

// TestStartRecoveryRefuses: an endpoint that does not exist in the caller's tenant, a disabled
// one, and nonsense arguments are refused, each with its error, and no job is recorded.
func TestStartRecoveryRefuses(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	exec(t, db, `UPDATE webhook_endpoints SET enabled = false, disabled_reason = 'test' WHERE id = $1::uuid`, acmeOther)
	hour := time.Now().Add(-time.Hour)
	cases := []struct {
		endpoint string
		since    time.Time
		actor    string
		tenant   *string
		want     error
	}{
		{globexEndpoint, hour, "k", acme, deadletters.ErrEndpointNotFound},
		{"dddddddd-0000-4000-8000-00000000000a", hour, "k", nil, deadletters.ErrEndpointNotFound},
		{plainEndpoint, hour, "k", acme, deadletters.ErrEndpointNotFound},
		{acmeOther, hour, "k", acme, deadletters.ErrEndpointDisabled},
		{"nope", hour, "k", nil, deadletters.ErrInvalid},
		{acmeEndpoint, time.Now().Add(time.Hour), "k", nil, deadletters.ErrInvalid},
		{acmeEndpoint, time.Time{}, "k", nil, deadletters.ErrInvalid},
		{acmeEndpoint, hour, " ", nil, deadletters.ErrInvalid},
	}
	for _, tc := range cases {
		if _, err := deadletters.StartRecovery(ctx, db.Pool, tc.endpoint, tc.since, tc.actor, tc.tenant); !errors.Is(err, tc.want) {
			t.Errorf("StartRecovery(%s, %v, %q, %v) = %v, want %v", tc.endpoint, tc.since, tc.actor, tc.tenant, err, tc.want)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_recoveries`); n != 0 {
		t.Errorf("refused recoveries recorded %d jobs", n)
	}
	// An admin may recover an endpoint without a tenant, and one of any tenant.
	for _, e := range []string{plainEndpoint, globexEndpoint} {
		if _, err := deadletters.StartRecovery(ctx, db.Pool, e, hour, "admin", nil); err != nil {
			t.Errorf("StartRecovery(%s) as admin: %v", e, err)
		}
	}
}

// TestRecoveryTwiceAtOnce: a second job of an endpoint is refused while one runs, naming it;
// the job run three times at once (processes resuming it together) sends every event exactly
// once, and each run sees it end done, having dealt with all of them.
func TestRecoveryTwiceAtOnce(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	const n = 60
	exec(t, db, `INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, reason, enqueued_at, failed_at, tenant, endpoint_id)
		SELECT gen_random_uuid(), 'invoice.paid', jsonb_build_object('n', i), 3, 'attempts exhausted', now() - interval '2 hours',
		       now() - interval '1 hour' + i * interval '1 second', 'acme', $1::uuid
		FROM generate_series(1, $2::int) i`, acmeEndpoint, n)
	rows, err := db.Pool.Query(ctx, `SELECT delivery_id::text FROM webhook_dead_letter`)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			t.Fatal(err)
		}
		want = append(want, d)
	}
	rows.Close()

	a := start(t, db, acmeEndpoint, 2*time.Hour, acme)
	for _, scope := range []*string{nil, acme} {
		var running *deadletters.RunningError
		if _, err := deadletters.StartRecovery(ctx, db.Pool, acmeEndpoint, time.Now().Add(-time.Hour), "test", scope); !errors.As(err, &running) || running.ID != a.ID {
			t.Fatalf("a second recovery of the endpoint (scope %v) = %v; want a RunningError naming %s", scope, err, a.ID)
		}
	}
	runner := deadletters.Runner{BatchSize: 7}
	results := make([]deadletters.Recovery, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i, id := range []string{a.ID, a.ID, a.ID} {
		wg.Go(func() { results[i], errs[i] = runner.Run(ctx, db.Pool, id) })
	}
	wg.Wait()
	for i, r := range results {
		if errs[i] != nil || r.State != deadletters.RecoveryDone || r.Done != n || r.Total != n {
			t.Errorf("run %d ended %+v, %v; want done %d of %d", i, r, errs[i], n, n)
		}
	}
	onceEach(t, db, want)
	if r, err := deadletters.GetRecovery(ctx, db.Pool, a.ID, nil); err != nil || r.Replayed != n {
		t.Errorf("the job = %+v, %v; want %d replayed", r, err, n)
	}
	// Ended, it no longer holds the endpoint: a new job starts, with nothing left to replay.
	if b := start(t, db, acmeEndpoint, 2*time.Hour, nil); b.Total != 0 {
		t.Errorf("a recovery after the first = %+v; want nothing left to replay", b)
	}
}

// TestRecoveryCancelled: a job cancelled between its batches stops before the next (what it
// replayed stays replayed), ends cancelled, and frees the endpoint for a new job; a cancel of
// an ended job, or from another tenant, changes nothing.
func TestRecoveryCancelled(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	for range 5 {
		insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: time.Hour})
	}
	r := start(t, db, acmeEndpoint, 2*time.Hour, acme)
	if _, _, err := deadletters.CancelRecovery(ctx, db.Pool, r.ID, globex); !errors.Is(err, deadletters.ErrNotFound) {
		t.Fatalf("CancelRecovery from another tenant = %v; want ErrNotFound", err)
	}
	runner := deadletters.Runner{BatchSize: 2, AfterBatch: func(got deadletters.Recovery) {
		if c, cancelled, err := deadletters.CancelRecovery(ctx, db.Pool, got.ID, acme); err != nil || !cancelled || c.State != deadletters.RecoveryCancelled {
			t.Errorf("CancelRecovery of the running job = %+v, %v, %v", c, cancelled, err)
		}
	}}
	got, err := runner.Run(ctx, db.Pool, r.ID)
	if err != nil || got.State != deadletters.RecoveryCancelled || got.Done != 2 || got.FinishedAt == nil {
		t.Fatalf("Run of a job cancelled after its first batch = %+v, %v; want cancelled with 2 done", got, err)
	}
	if n := len(sent(t, db)); n != 2 {
		t.Errorf("%d events sent; want the first batch's 2", n)
	}
	if again, cancelled, err := deadletters.CancelRecovery(ctx, db.Pool, r.ID, nil); err != nil || cancelled || again.State != deadletters.RecoveryCancelled {
		t.Errorf("a second cancel = %+v, %v, %v; want the job as it is", again, cancelled, err)
	}
	if next := start(t, db, acmeEndpoint, 2*time.Hour, acme); next.Total != 3 {
		t.Errorf("a recovery after the cancelled one = %+v; want the 3 left", next)
	}
}

// TestRecoveryResumes: a job interrupted after a batch (its process died, or shut down) stays
// running with its progress; ResumeStale, as a new process calls it at start, picks it up
// once it is stale, and it goes on from where it was, sending nothing twice.
func TestRecoveryResumes(t *testing.T) {
	t.Parallel()
	db := setup(t)
	var want []string
	for range 5 {
		want = append(want, deliveryOf(t, db, insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: time.Hour})))
	}
	r := start(t, db, acmeEndpoint, 2*time.Hour, acme)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := deadletters.Runner{BatchSize: 2, AfterBatch: func(deadletters.Recovery) { cancel() }}.Run(ctx, db.Pool, r.ID)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("an interrupted Run = %v, want context.Canceled", err)
	}
	got, err := deadletters.GetRecovery(context.Background(), db.Pool, r.ID, nil)
	if err != nil || got.State != deadletters.RecoveryRunning || got.Done != 2 {
		t.Fatalf("the interrupted job = %+v, %v; want running with 2 done", got, err)
	}
	if n := len(sent(t, db)); n != 2 {
		t.Fatalf("the interrupted job sent %d events, want its first batch's 2", n)
	}

	// Fresh, it is someone's: not resumed.
	if resumed, err := deadletters.ResumeStale(context.Background(), db.Pool, time.Hour); err != nil || len(resumed) != 0 {
		t.Fatalf("ResumeStale of a fresh job = %+v, %v; want none", resumed, err)
	}
	exec(t, db, `UPDATE webhook_recoveries SET updated_at = now() - interval '10 minutes' WHERE id = $1::uuid`, r.ID)
	resumed, err := deadletters.Runner{BatchSize: 2}.ResumeStale(context.Background(), db.Pool, 5*time.Minute)
	if err != nil || len(resumed) != 1 || resumed[0].ID != r.ID || resumed[0].State != deadletters.RecoveryDone ||
		resumed[0].Done != 5 || resumed[0].Replayed != 5 {
		t.Fatalf("ResumeStale = %+v, %v; want the job done, 5 of 5", resumed, err)
	}
	onceEach(t, db, want)
	if again, err := deadletters.ResumeStale(context.Background(), db.Pool, time.Nanosecond); err != nil || len(again) != 0 {
		t.Errorf("ResumeStale after the job was done = %+v, %v; want none", again, err)
	}
}

// TestRecoveryFailsWhenEndpointDisabled: an endpoint disabled while its dead letters are
// recovered ends the job failed, saying why, before another batch goes to it.
func TestRecoveryFailsWhenEndpointDisabled(t *testing.T) {
	t.Parallel()
	db := setup(t)
	for range 4 {
		insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: time.Hour})
	}
	r := start(t, db, acmeEndpoint, 2*time.Hour, nil)
	runner := deadletters.Runner{BatchSize: 2, AfterBatch: func(deadletters.Recovery) {
		exec(t, db, `UPDATE webhook_endpoints SET enabled = false, disabled_reason = 'test' WHERE id = $1::uuid`, acmeEndpoint)
	}}
	got, err := runner.Run(context.Background(), db.Pool, r.ID)
	if !errors.Is(err, deadletters.ErrRecoveryFailed) || got.State != deadletters.RecoveryFailed || got.Done != 2 ||
		got.Error == nil || !strings.Contains(*got.Error, "was disabled") || got.FinishedAt == nil {
		t.Errorf("Run with the endpoint disabled after a batch = %+v, %v; want failed after 2, saying so", got, err)
	}
	if n := len(sent(t, db)); n != 2 {
		t.Errorf("%d events sent, want the first batch's 2", n)
	}
}
