package main

// The fault suite: real `fluxhook serve` processes, a real PostgreSQL and a real HTTP consumer,
// one fault per case. Every case ends with the same check (checkNoneLost): every event was
// delivered (2xx at the consumer, settled as delivered) or dead-lettered with a reason, none
// was lost, and only the events in flight at the fault were delivered twice.
//
// Each case is bounded (its waits have deadlines) and sized to run in about 5–15 s on a
// 2-core machine with -race (the suite in about a minute). The backlog case drains 50,000 rows
// by default (about 30 s with -race, 12 s without); its three instances are built without the
// race detector, which would slow them several times over. `task test` (the README's test
// command, and CI) runs it once more at the reliability issue's size, without -race:
// FLUXHOOK_FAULT_BACKLOG=1000000 (measured: 1,000,000 rows inserted in 11 s and drained in
// 3 min 43 s, about 4,500 events/s, on a 2-core machine; 4 min 20 s in all).
//
// Redis stopped and restarted under load is a case of its own, in fault_redis_test.go
// (TestFaultRedisRestartUnderLoad); so is SIGKILL under a fan-out to managed endpoints routed
// in memory, in fault_fanout_test.go (TestFaultSIGKILLUnderLoadFanOut).

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// The steady load of the cases that strike under load: 200 single-row transactions a second.
const faultRate = 200

// faultWait bounds each wait of a case: far beyond the few seconds they usually take, because
// the cases run two at a time (the backlog case with three dispatchers among them) on a small
// machine that may be busy with other work, where a producer's synchronous commits alone can
// slow to tens a second.
const faultWait = 90 * time.Second

func loadEvent(i int) outbox.Event {
	return outbox.Event{EventType: "test.load", Payload: map[string]any{"n": i}}
}

// TestFaultSIGKILLUnderLoad kills one of two instances with SIGKILL while a producer inserts
// at a steady rate: the survivor delivers everything, the killed instance's leased rows after
// their lease, and only those may be delivered twice.
func TestFaultSIGKILLUnderLoad(t *testing.T) {
	t.Parallel()
	const events = 4 * faultRate // 4 s of load
	db := sqltest.NewMigrated(t)
	c := newHookConsumer(t, respondAfter(100*time.Millisecond)) // ~20 requests in flight
	victim := startServe(t, "victim serve", killableEnv(t, db.URL, c.URL(), "fluxhook-victim"))
	survivor := startServe(t, "survivor serve", killableEnv(t, db.URL, c.URL(), "fluxhook-survivor"))
	victimID, survivorID := victim.instanceID(), survivor.instanceID()
	both := []*serveProc{victim, survivor}

	prod := startProducer(t, db.Pool, events, faultRate, loadEvent)
	settledBy := func(instance string) int {
		return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE processed AND leased_by = $1`, instance)
	}
	waitAll(t, faultWait, "both instances to deliver under load, the victim with rows in flight", both, func() bool {
		return settledBy(victimID) >= 20 && settledBy(survivorID) >= 20 &&
			queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE NOT processed AND leased_by = $1
				AND lease_until > now() + interval '1 second'`, victimID) >= 5
	})
	if n := prod.produced(); n >= events {
		t.Fatalf("the producer had finished (%d events) before the kill; the kill must strike under load", n)
	}
	_, inFlightAtKill, _ := c.counts()
	killInstance(t, db, victim, "fluxhook-victim")
	inFlight := idSet(queryStrings(t, db, `SELECT DISTINCT delivery_id::text FROM webhook_deliveries
		WHERE NOT processed AND leased_by = $1`, victimID))
	producedAtKill := prod.produced()
	if len(inFlight) == 0 {
		t.Errorf("the killed instance had no row in flight: the kill struck no work")
	}

	ids := prod.wait(t, faultWait)
	waitSettled(t, db, faultWait, []*serveProc{survivor}, []*hookConsumer{c}, len(ids))
	tally := checkNoneLost(t, db, ids, []*hookConsumer{c}, faultExpect{InFlight: inFlight})
	t.Logf("killed after %d of %d events were enqueued, with %d requests at the consumer; %s",
		producedAtKill, events, inFlightAtKill, tally)
}

// TestFaultPostgresRestart restarts PostgreSQL (a cluster the test owns) under load. The same
// fluxhook process carries on: its pool reconnects, and its listener reconnects so that
// NOTIFY wakes it again.
func TestFaultPostgresRestart(t *testing.T) {
	t.Parallel()
	const events = 5 * faultRate // 5 s of load
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster, db := migratedCluster(t, ctx, nil)
	pool := db.Pool

	c := newHookConsumer(t, respondAfter(20*time.Millisecond))
	env := faultEnv(cluster.URL(), c.URL())
	// A poll that never fires within the test: an idle dispatcher can only be woken by a
	// NOTIFY (or the due timer, which has nothing to wait for once everything is settled).
	env["WEBHOOK_POLL_INTERVAL_MS"] = "3600000"
	env["METRICS_ADDR"] = "127.0.0.1:0"
	env["WEBHOOK_TIMEOUT_MS"] = "2000"
	// Longer than the restart, so that the rows the restart left in flight are still leased
	// when the test lists them.
	env["WEBHOOK_LEASE_MS"] = "8000"
	p := startServe(t, "serve", env)
	instance, addr := p.instanceID(), p.metricsAddr()
	pid := p.cmd.Process.Pid

	prod := startProducer(t, pool, events, faultRate, loadEvent)
	p.waitFor(faultWait, "deliveries under load", func() bool {
		_, _, ok := c.counts()
		return ok >= 150
	})
	if n := prod.produced(); n >= events {
		t.Fatalf("the producer had finished (%d events) before the restart; it must strike under load", n)
	}
	producedAtRestart := prod.produced()
	start := time.Now()
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restartTook := time.Since(start)
	pool.Reset() // the test's own connections died with the server too
	// Rows in flight at the restart whose settle it cut off keep their lease: they are among
	// the leased, unprocessed rows now (with rows claimed since, which only loosens the bound).
	var inFlight map[string]bool
	pollUntil(t, faultWait, "the restarted server to answer the test", func() bool {
		rows, err := pool.Query(ctx, `SELECT DISTINCT delivery_id::text FROM webhook_deliveries
			WHERE NOT processed AND lease_until IS NOT NULL`)
		if err != nil {
			return false
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return false
		}
		inFlight = idSet(ids)
		return true
	})

	ids := prod.wait(t, faultWait)
	waitSettled(t, db, faultWait, []*serveProc{p}, []*hookConsumer{c}, len(ids))
	tally := checkNoneLost(t, db, ids, []*hookConsumer{c}, faultExpect{InFlight: inFlight})
	t.Logf("restarted PostgreSQL (%s) after %d of %d events were enqueued; %s",
		restartTook.Round(time.Millisecond), producedAtRestart, events, tally)

	// The same process, never restarted, and its listener reconnected by itself.
	if p.exited() || p.cmd.Process.Pid != pid {
		t.Fatalf("serve did not survive the restart: %s", p.cmd.ProcessState)
	}
	p.waitLog(10*time.Second, `"msg":"listener reconnected"`)
	if n := scrapeMetric(t, addr, "fluxora_webhook_listener_reconnects_total"); n < 1 {
		t.Errorf("fluxora_webhook_listener_reconnects_total = %v, want ≥ 1", n)
	}
	pollUntil(t, faultWait, "/readyz to answer 200", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// NOTIFY works again. Once the idle dispatcher is armed, an insert makes the trigger
	// notify; with the poll an hour away, the event arriving at all (within the deadline)
	// shows the listener heard it, and the notify wake-up counter says so.
	p.waitFor(faultWait, "the idle dispatcher to arm itself", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_dispatcher WHERE instance_id = $1 AND armed`, instance) == 1
	})
	notifies := scrapeMetric(t, addr, `fluxora_webhook_wakeups_total{source="notify"}`)
	probe := enqueueOne(t, db, outbox.Event{EventType: "test.after-restart"})
	p.waitFor(20*time.Second, "an event inserted after the restart to be delivered", func() bool {
		for _, r := range c.requests() {
			if r.DeliveryID == probe && r.Status == http.StatusOK {
				return true
			}
		}
		return false
	})
	if n := scrapeMetric(t, addr, `fluxora_webhook_wakeups_total{source="notify"}`); n <= notifies {
		t.Errorf("notify wake-ups %v before the post-restart insert and %v after: the event was not delivered through NOTIFY", notifies, n)
	}
}

// TestFaultConsumerNeverAnswers points some events at a consumer that accepts connections
// and never answers: their attempts time out and, the schedule exhausted, they are
// dead-lettered; no attempt overruns its lease (never two requests for one event at once,
// with the shortest lease allowed); and events for a healthy endpoint flow meanwhile.
func TestFaultConsumerNeverAnswers(t *testing.T) {
	t.Parallel()
	const hanging, healthyEvents = 40, 200
	db := sqltest.NewMigrated(t)
	healthy := newHookConsumer(t, nil)
	stuck := newHookConsumer(t, func(ctx context.Context, _ *hookRequest) int {
		<-ctx.Done() // never answers; the dispatcher's timeout closes the connection
		return 0
	})
	env := faultEnv(db.URL, healthy.URL())
	env["WEBHOOK_TIMEOUT_MS"] = "500"
	// Timeout + 3.5 s. The shortest allowed (timeout + 1 s) overran on a loaded CI machine
	// under -race: a claimed row waited over a second for CPU before its request started, and
	// another instance took it. Operators get 2×timeout + 30 s by default.
	env["WEBHOOK_LEASE_MS"] = "4000"
	env["WEBHOOK_RETRY_SCHEDULE"] = "300ms"
	env["WEBHOOK_ENDPOINT_CONCURRENCY"] = "4"
	procs := []*serveProc{startServe(t, "serve 1", env), startServe(t, "serve 2", env)}
	for _, p := range procs {
		p.instanceID() // started
	}

	// The stuck endpoint's events first, so that they are claimed first: 2 attempts × 40
	// events / (4 slots × 2 instances) × 500 ms keeps it busy for seconds.
	evs := make([]outbox.Event, 0, hanging+healthyEvents)
	for i := range hanging {
		evs = append(evs, outbox.Event{EventType: "test.stuck", EndpointURL: stuck.URL(), Payload: map[string]any{"n": i}})
	}
	for i := range healthyEvents {
		ev := outbox.Event{EventType: "test.healthy", Payload: map[string]any{"n": i}}
		if i%2 == 0 {
			ev.EndpointURL = healthy.URL() // half named per row, half through WEBHOOK_URL
		}
		evs = append(evs, ev)
	}
	if n, err := outbox.EnqueueMany(context.Background(), db.Pool, evs); err != nil || n != int64(len(evs)) {
		t.Fatalf("EnqueueMany = %d, %v", n, err)
	}
	stuckIDs := idSet(queryStrings(t, db, `SELECT delivery_id::text FROM webhook_deliveries WHERE endpoint_url = $1`, stuck.URL()))

	waitAll(t, faultWait, "every healthy event to be delivered", procs, func() bool {
		_, _, ok := healthy.counts()
		return ok >= healthyEvents
	})
	stuckLeft := hanging - queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter`)
	if stuckLeft == 0 {
		t.Errorf("the stuck endpoint's events were all given up before the healthy ones were delivered: they held the healthy endpoint back")
	}

	waitSettled(t, db, faultWait, procs, []*hookConsumer{healthy}, healthyEvents)
	// A healthy event may be delivered twice only when its first answer came after the 500 ms
	// timeout (a machine loaded by the race detector and the rest of the suite): the attempt
	// counted as failed and was retried, as at-least-once delivery must. Its retry row says so.
	late := idSet(queryStrings(t, db, `SELECT DISTINCT delivery_id::text FROM webhook_deliveries WHERE event_type = 'test.healthy' AND attempt > 1`))
	if len(late) > 0 {
		t.Logf("%d healthy events were retried after their first answer came too late", len(late))
	}
	tally := checkNoneLost(t, db, nil, []*hookConsumer{healthy, stuck}, faultExpect{DeadLettered: stuckIDs, MayDuplicate: late})
	for _, reason := range queryStrings(t, db, `SELECT reason || ' / ' || coalesce(last_error, '') FROM webhook_dead_letter`) {
		if !strings.Contains(reason, "attempts exhausted") || !strings.Contains(reason, "timeout") {
			t.Errorf("dead letter reason %q: want attempts exhausted after timeouts", reason)
			break
		}
	}
	perEvent := map[string]int{}
	for _, r := range stuck.requests() {
		perEvent[r.DeliveryID]++
	}
	for id, n := range perEvent {
		if n > 2 {
			t.Errorf("%s: the stuck consumer got %d requests; the schedule allows 2 attempts", id, n)
		}
	}
	t.Logf("%d stuck events still pending when the %d healthy ones were all delivered; %d requests to the stuck consumer; %s",
		stuckLeft, healthyEvents, len(stuck.requests()), tally)
}

// TestFaultIdleInTransaction keeps a session idle in a transaction for the whole run (it has
// read the outbox and holds its snapshot and transaction id, so vacuum can remove nothing):
// delivery keeps going. It logs the dead tuples the outbox accumulated.
func TestFaultIdleInTransaction(t *testing.T) {
	t.Parallel()
	const backlog, events = 5000, 4 * faultRate
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	idle, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idle.Close(context.Background()) })
	if _, err := idle.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	var seen int
	var xid string
	if err := idle.QueryRow(ctx, `SELECT count(*), pg_current_xact_id()::text FROM webhook_deliveries`).Scan(&seen, &xid); err != nil {
		t.Fatal(err)
	}
	idlePID := idle.PgConn().PID()

	c := newHookConsumer(t, nil)
	env := faultEnv(db.URL, c.URL())
	env["METRICS_ADDR"] = "127.0.0.1:0"
	p := startServe(t, "serve", env)
	addr := p.metricsAddr()
	enqueueBacklog(t, db, backlog)
	prod := startProducer(t, db.Pool, events, faultRate, loadEvent)
	ids := prod.wait(t, faultWait)
	waitSettled(t, db, faultWait, []*serveProc{p}, []*hookConsumer{c}, backlog+events)
	tally := checkNoneLost(t, db, ids, []*hookConsumer{c}, faultExpect{})
	if tally.Events != backlog+events {
		t.Errorf("%d events, want %d", tally.Events, backlog+events)
	}

	var state string
	if err := db.Pool.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = $1`, idlePID).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != "idle in transaction" {
		t.Errorf("the idle session is %q at the end, want idle in transaction for the whole run", state)
	}
	var dead, live, hot, upd int64
	if err := db.Pool.QueryRow(ctx, `SELECT n_dead_tup, n_live_tup, n_tup_hot_upd, n_tup_upd
		FROM pg_stat_user_tables WHERE relname = 'webhook_outbox'`).Scan(&dead, &live, &hot, &upd); err != nil {
		t.Fatal(err)
	}
	// Each event costs two updates (claim, settle); rows claimed beyond the endpoint's
	// concurrency and released unattempted cost two more per round.
	released := scrapeMetric(t, addr, "fluxora_webhook_released_total")
	t.Logf("%s; webhook_outbox with a transaction (xid %s) idle throughout: n_dead_tup=%d n_live_tup=%d (updates %d, HOT %d, rows released unattempted %.0f; statistics lag by up to a second)",
		tally, xid, dead, live, upd, hot, released)
}

// TestFaultSettleFails revokes UPDATE and DELETE on the outbox from the role fluxhook connects
// as, under load: settling fails (and so does claiming) until they are granted again; the rows
// in flight are re-delivered after their lease, and nothing is lost. (DELETE too: a batch of
// deliveries alone settles with a statement that deletes and updates nothing else.)
func TestFaultSettleFails(t *testing.T) {
	t.Parallel()
	const events = 4 * faultRate
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	role := createFluxhookRole(t, db, true)

	c := newHookConsumer(t, respondAfter(200*time.Millisecond)) // ~40 requests in flight at any time
	env := faultEnv(withUser(t, db.URL, role), c.URL())
	// Far above the consumer's 200 ms even on a loaded machine: an answer that came after the
	// timeout would be retried and count as a duplicate this case does not expect (the full
	// suite under -race once stretched 33 answers past a 1 s timeout).
	env["WEBHOOK_TIMEOUT_MS"] = "3000"
	env["WEBHOOK_LEASE_MS"] = "5000"
	env["METRICS_ADDR"] = "127.0.0.1:0"
	p := startServe(t, "serve", env)
	addr := p.metricsAddr()

	prod := startProducer(t, db.Pool, events, faultRate, loadEvent)
	p.waitFor(faultWait, "deliveries under load", func() bool {
		_, _, ok := c.counts()
		return ok >= 100
	})
	if _, err := db.Pool.Exec(ctx, `REVOKE UPDATE, DELETE ON webhook_outbox FROM `+role); err != nil {
		t.Fatal(err)
	}
	p.waitLog(faultWait, `"msg":"settle failed; rows will be delivered again after their lease"`)
	p.waitLog(faultWait, `"msg":"claim failed"`)
	if n := prod.produced(); n >= events {
		t.Fatalf("the producer had finished (%d events) while settling failed; the fault must strike under load", n)
	}
	// Grant again only once no settle is running (in_flight counts rows until their settle
	// returns, failed or not, and nothing can be claimed meanwhile). A GRANT landing between a
	// row's failed settle and the fallback statement that dead-letters it would dead-letter an
	// event the consumer accepted: settle's one-by-one fallback takes every statement error,
	// even a transient one, for a fault of the row (reported as a bug, not tested here).
	p.waitFor(faultWait, "every claimed row's settle to have failed", func() bool {
		return scrapeMetric(t, addr, "fluxora_webhook_in_flight") == 0
	})
	// Nothing can be claimed while UPDATE is revoked, so the rows leased now are exactly
	// those claimed before the revoke and not settled: the ones that may come twice.
	inFlight := idSet(queryStrings(t, db, `SELECT DISTINCT delivery_id::text FROM webhook_deliveries
		WHERE NOT processed AND lease_until IS NOT NULL`))
	if _, err := db.Pool.Exec(ctx, `GRANT UPDATE, DELETE ON webhook_outbox TO `+role); err != nil {
		t.Fatal(err)
	}

	ids := prod.wait(t, faultWait)
	waitSettled(t, db, faultWait, []*serveProc{p}, []*hookConsumer{c}, len(ids))
	tally := checkNoneLost(t, db, ids, []*hookConsumer{c}, faultExpect{InFlight: inFlight})
	if tally.Duplicated == 0 {
		t.Errorf("no event was delivered twice: the rows whose settle failed were not re-delivered after their lease (or the fault missed them)")
	}
	t.Logf("%s", tally)
}

// createFluxhookRole creates a LOGIN role with exactly the grants docs/install.md gives
// dispatchers (read from the page, so that the page is what is tested), and drops it when the
// test ends. Roles are cluster-wide, so its name is random. Without optional, the grant the page
// calls optional (USAGE on the outbox's id sequence) is left out.
func createFluxhookRole(t *testing.T, db *sqltest.DB, optional bool) string {
	t.Helper()
	role := sqltest.NewRole(t, db)
	for _, stmt := range documentedDispatcherGrants(t) {
		if !optional && strings.Contains(stmt, "webhook_outbox_id_seq") {
			continue
		}
		stmt = strings.TrimSuffix(stmt, " TO fluxhook") + " TO " + role
		if _, err := db.Pool.Exec(context.Background(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return role
}

// documentedDispatcherGrants returns the GRANT statements of docs/install.md's block for
// dispatchers (the first sql block after "**Dispatchers**"), each ending in "TO fluxhook".
func documentedDispatcherGrants(t *testing.T) []string {
	t.Helper()
	return documentedGrants(t, "**Dispatchers**", "fluxhook")
}

// documentedGrants returns the GRANT statements of docs/install.md's first sql block after
// the paragraph that starts with para, each ending in "TO " + role.
func documentedGrants(t *testing.T, para, role string) []string {
	t.Helper()
	md := readDoc(t, repoRoot(t), "docs/install.md")
	_, rest, ok := strings.Cut(md, para)
	if !ok {
		t.Fatalf(`docs/install.md has no %q paragraph`, para)
	}
	_, rest, ok = strings.Cut(rest, "```sql\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatalf("docs/install.md's %s paragraph has no sql block", para)
	}
	var grants []string
	for _, stmt := range strings.Split(block, ";") {
		stmt = strings.Join(strings.Fields(stmt), " ")
		if stmt == "" {
			continue
		}
		if !strings.HasPrefix(stmt, "GRANT ") || !strings.HasSuffix(stmt, " TO "+role) {
			t.Fatalf("docs/install.md's %s block holds %q; want only GRANT ... TO %s statements", para, stmt, role)
		}
		grants = append(grants, stmt)
	}
	if len(grants) < 3 {
		t.Fatalf("docs/install.md's %s block has %d grants", para, len(grants))
	}
	return grants
}

// TestFaultConsumer500ThenRecovers has the consumer fail with 500 for a while, then recover.
// The circuit breaker opens after WEBHOOK_CIRCUIT_BREAKER_THRESHOLD failures, holds the rows
// back (no attempt used), lets a probe through after the reset (it fails: open again), and
// closes on the first probe after the recovery. Retries follow the schedule (never sooner
// than its step less the jitter; deferrals only lengthen the wait), and everything is
// delivered after the recovery, nothing dead-lettered.
func TestFaultConsumer500ThenRecovers(t *testing.T) {
	t.Parallel()
	// The breaker opens in the third wave of attempts: the first two show the schedule's
	// pacing, the third the breaker holding rows back.
	const events, threshold = 50, 2*50 + 10
	schedule := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond,
		1600 * time.Millisecond, 3200 * time.Millisecond}
	db := sqltest.NewMigrated(t)
	var recovered atomic.Bool
	c := newHookConsumer(t, func(context.Context, *hookRequest) int {
		if recovered.Load() {
			return http.StatusOK
		}
		return http.StatusInternalServerError
	})
	env := faultEnv(db.URL, c.URL())
	env["WEBHOOK_RETRY_SCHEDULE"] = "200ms,400ms,800ms,1600ms,3200ms"
	env["WEBHOOK_CIRCUIT_BREAKER_THRESHOLD"] = strconv.Itoa(threshold)
	env["WEBHOOK_CIRCUIT_BREAKER_RESET_MS"] = "1000"
	env["METRICS_ADDR"] = "127.0.0.1:0"
	p := startServe(t, "serve", env)
	addr := p.metricsAddr()
	transitions := func(from, to string) float64 {
		return scrapeMetric(t, addr, `fluxora_webhook_circuit_breaker_transitions_total{from_state="`+from+`",to_state="`+to+`"}`)
	}

	evs := make([]outbox.Event, events)
	for i := range evs {
		evs[i] = outbox.Event{EventType: "test.flaky", Payload: map[string]any{"n": i}}
	}
	if n, err := outbox.EnqueueMany(context.Background(), db.Pool, evs); err != nil || n != events {
		t.Fatalf("EnqueueMany = %d, %v", n, err)
	}
	// "A while": until the breaker has opened, and a half-open probe has failed and opened it
	// again.
	p.waitFor(faultWait, "the breaker to open, then a probe to fail and reopen it", func() bool {
		return transitions("closed", "open") >= 1 && transitions("half_open", "open") >= 1
	})
	recovered.Store(true)
	failed := 0
	for _, r := range c.requests() {
		if r.Status == http.StatusInternalServerError {
			failed++
		}
	}

	waitSettled(t, db, faultWait, []*serveProc{p}, []*hookConsumer{c}, events)
	tally := checkNoneLost(t, db, nil, []*hookConsumer{c}, faultExpect{})
	if failed < threshold {
		t.Errorf("%d failed requests before the recovery; the breaker cannot have opened before %d", failed, threshold)
	}
	for _, tr := range []struct {
		from, to string
		least    float64
	}{
		{"closed", "open", 1},
		{"open", "half_open", 2}, // the failed probe and the successful one
		{"half_open", "open", 1},
		{"half_open", "closed", 1},
	} {
		if n := transitions(tr.from, tr.to); n < tr.least {
			t.Errorf("breaker transitions %s → %s: %v, want ≥ %v", tr.from, tr.to, n, tr.least)
		}
	}

	// Pacing: attempt n+1 arrives no sooner than step n of the schedule, less the 20% jitter,
	// after attempt n arrived (the wait starts when attempt n is settled, later still, and a
	// deferral by the breaker only adds to it).
	const jitter, slack = 0.2, 10 * time.Millisecond
	byID := map[string][]*hookRequest{}
	for _, r := range c.requests() {
		byID[r.DeliveryID] = append(byID[r.DeliveryID], r)
	}
	retried, retriedTwice := 0, 0
	for id, reqs := range byID {
		slices.SortFunc(reqs, func(a, b *hookRequest) int { return a.At.Compare(b.At) })
		if len(reqs) > 1 {
			retried++
		}
		if len(reqs) > 2 {
			retriedTwice++
		}
		for i, r := range reqs {
			if r.Attempt != strconv.Itoa(i+1) {
				t.Errorf("%s: request %d carries attempt %q, want %d", id, i+1, r.Attempt, i+1)
				break
			}
			if i == 0 {
				continue
			}
			step := schedule[i-1]
			if gap, least := r.At.Sub(reqs[i-1].At), time.Duration(float64(step)*(1-jitter))-slack; gap < least {
				t.Errorf("%s: attempt %d came %s after attempt %d; the schedule's step is %s (at least %s with jitter)",
					id, i+1, gap, i, step, least)
			}
		}
	}
	if retriedTwice == 0 {
		t.Errorf("no event was retried twice: the schedule's pacing was not exercised")
	}
	t.Logf("%d requests failed before the recovery; %d events retried, %d of them twice or more; %s",
		failed, retried, retriedTwice, tally)
}

// TestFaultBacklogThreeInstances drains a backlog with three instances at once: each event
// delivered exactly once, never two requests for one event at once. 50,000 rows by default
// (CI); FLUXHOOK_FAULT_BACKLOG=1000000 runs the full million (see the file comment
// for the timings).
func TestFaultBacklogThreeInstances(t *testing.T) {
	t.Parallel()
	n := 50_000
	if s := os.Getenv("FLUXHOOK_FAULT_BACKLOG"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("FLUXHOOK_FAULT_BACKLOG=%q: want a positive number of rows", s)
		}
		n = v
	}
	db := sqltest.NewMigrated(t)
	c := newHookConsumer(t, nil)
	insertStart := time.Now()
	enqueueBacklog(t, db, n)
	inserted := time.Since(insertStart)

	start := time.Now()
	bin := fluxhookBinaryNoRace(t)
	procs := []*serveProc{
		startServeBinary(t, bin, "serve 1", faultEnv(db.URL, c.URL())),
		startServeBinary(t, bin, "serve 2", faultEnv(db.URL, c.URL())),
		startServeBinary(t, bin, "serve 3", faultEnv(db.URL, c.URL())),
	}
	// A deadline far beyond the usual drain (about 2,000 events/s with -race, 5,000 without,
	// on an idle 2-core machine), for a machine busy with other work.
	timeout := max(2*time.Minute, time.Duration(n/500)*time.Second)
	waitSettled(t, db, timeout, procs, []*hookConsumer{c}, n)
	drained := time.Since(start)
	tally := checkNoneLost(t, db, nil, []*hookConsumer{c}, faultExpect{})
	if tally.Events != n {
		t.Errorf("%d events in the outbox, want %d", tally.Events, n)
	}
	shares := map[string]int{}
	for _, p := range procs {
		id := p.instanceID()
		shares[p.name] = queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE processed AND leased_by = $1`, id)
		if shares[p.name] == 0 {
			t.Errorf("%s delivered nothing: the backlog was not drained by three instances", p.name)
		}
	}
	t.Logf("backlog of %d rows inserted in %s, drained by three instances in %s (%.0f events/s, race detector %v); per instance %v; %s",
		n, inserted.Round(time.Millisecond), drained.Round(time.Millisecond), float64(n)/drained.Seconds(), raceEnabled(), shares, tally)
}

// TestFaultStaleSettleAfterLeaseLoss: instance A sends an event and is then frozen (SIGSTOP:
// a VM pause, a stalled host) for longer than its lease; instance B claims the row and sends
// it too. The consumer answers A's request with 410 Gone and A resumes and settles first,
// while B's request is still open; then B gets its 200. A's outcome, whichever it reads (the
// 410, or its own timeout as a retry), is stale: refused, counted and logged. The event is
// delivered (B's outcome is written), never dead-lettered, and has no retry row. Before the
// fence, whichever settled first won: A's 410 dead-lettered an event B delivered.
func TestFaultStaleSettleAfterLeaseLoss(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	firstArrived, secondArrived := make(chan struct{}), make(chan struct{})
	answerFirst, answerSecond := make(chan struct{}), make(chan struct{})
	var first, second sync.Once
	c := newHookConsumer(t, func(ctx context.Context, req *hookRequest) int {
		arrived, answer, status := secondArrived, answerSecond, http.StatusOK
		once := &second
		if req.N == 1 {
			arrived, answer, status, once = firstArrived, answerFirst, http.StatusGone, &first
		}
		once.Do(func() { close(arrived) })
		select {
		case <-answer:
			return status
		case <-ctx.Done():
			return 0
		}
	})
	env := faultEnv(db.URL, c.URL())
	env["WEBHOOK_TIMEOUT_MS"] = "5000"
	env["WEBHOOK_LEASE_MS"] = "7000" // the shortest allowed: timeout + 2 s
	env["METRICS_ADDR"] = "127.0.0.1:0"
	a := startServe(t, "serve A", env)
	a.instanceID()
	addrA := a.metricsAddr()
	ev, err := outbox.Enqueue(context.Background(), db.Pool, outbox.Event{EventType: "test.race", Payload: map[string]int{"n": 1}})
	if err != nil {
		t.Fatal(err)
	}
	id := ev.DeliveryID
	wait := func(ch chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(faultWait):
			t.Fatal(what)
		}
	}
	wait(firstArrived, "instance A never sent the event")
	a.signal(syscall.SIGSTOP)
	resumed := false
	defer func() {
		if !resumed {
			a.signal(syscall.SIGCONT) // let cleanup stop it
		}
	}()
	b := startServe(t, "serve B", env)
	b.instanceID()
	wait(secondArrived, "instance B never sent the event after A's lease ran out")
	close(answerFirst) // A's request gets its 410 while A is still frozen
	a.signal(syscall.SIGCONT)
	resumed = true
	refused := a.logField(faultWait, "stale settle refused: the lease ran out and another claim holds the row", "delivery_id")
	if refused != id {
		t.Fatalf("A refused a stale settle of %q, want %q", refused, id)
	}
	close(answerSecond)
	pollUntil(t, faultWait, "instance B to settle the event as delivered", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed AND status_code = 200`, id) == 1
	})
	if n := scrapeMetric(t, addrA, "fluxora_webhook_stale_settles_total"); n != 1 {
		t.Errorf("A's fluxora_webhook_stale_settles_total = %v, want 1", n)
	}
	for _, outcome := range []string{"dead_letter", "retry", "delivered"} {
		if n := scrapeMetric(t, addrA, `fluxora_webhook_deliveries_total{outcome="`+outcome+`"}`); n != 0 {
			t.Errorf("A counted its stale outcome as %s (%v)", outcome, n)
		}
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters: a stale 410 dead-lettered an event B delivered", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1`, id); n != 1 {
		t.Errorf("%d outbox rows for the event, want its one row (no retry row from A's stale outcome)", n)
	}
	a.stopCleanly()
	b.stopCleanly()
}
