package main

// Helpers for the fault suite (fault_test.go), on top of the process helpers in
// process_test.go: a producer inserting at a steady rate, a bulk backlog, the scraping of a
// child's /metrics, and checkNoneLost, the one check every fault case ends with.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/fluxhooktest"
	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/pgtemp"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// faultEnv is serveEnv for the fault suite: info logs (a debug line per delivery would bury
// the interesting lines of a failed run) and a retry rate limit high enough never to be what
// a case measures.
func faultEnv(databaseURL, hookURL string) map[string]string {
	env := serveEnv(databaseURL, hookURL)
	env["LOG_LEVEL"] = "info"
	env["WEBHOOK_RETRY_RPS"] = "100000"
	return env
}

// killableEnv is faultEnv for an instance a case may kill: its sessions carry app as their
// application_name, so that the case can tell when the killed one's sessions are gone, and
// its rows come back 4 s after their claim (a 2 s request timeout within that lease).
func killableEnv(t *testing.T, databaseURL, hookURL, app string) map[string]string {
	t.Helper()
	e := faultEnv(withURLParam(t, databaseURL, "application_name", app), hookURL)
	e["WEBHOOK_TIMEOUT_MS"] = "2000"
	e["WEBHOOK_LEASE_MS"] = "4000"
	return e
}

// killInstance kills p (started with killableEnv's app) with SIGKILL, checks that it died by
// the signal, and waits until its sessions are gone: a statement the killed process had sent
// may still be finishing on the server, and only then are its leases exactly the rows it left
// in flight.
func killInstance(t *testing.T, db *sqltest.DB, p *serveProc, app string) {
	t.Helper()
	p.kill()
	if code := p.waitExit(5 * time.Second); code != -1 {
		t.Fatalf("%s exited with %d after SIGKILL, want death by signal", p.name, code)
	}
	pollUntil(t, 15*time.Second, "the killed instance's sessions to end", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, app) == 0
	})
}

// withURLParam returns the connection URL raw with the query parameter key set to value
// (application_name, to tell instances' sessions apart in pg_stat_activity).
func withURLParam(t *testing.T, raw, key, value string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("parsing database URL: %v", err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// withUser returns the connection URL raw connecting as user (no password: the test server
// trusts local connections).
func withUser(t *testing.T, raw, user string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("parsing database URL: %v", err)
	}
	u.User = url.User(user)
	return u.String()
}

// logField waits until p has logged a JSON line whose msg is msg and returns that line's
// string field.
func (p *serveProc) logField(timeout time.Duration, msg, field string) string {
	p.t.Helper()
	var value string
	p.waitFor(timeout, fmt.Sprintf("%s to log %q", p.name, msg), func() bool {
		for _, line := range strings.Split(p.stderr.String(), "\n") {
			var entry map[string]any
			if json.Unmarshal([]byte(line), &entry) != nil || entry["msg"] != msg {
				continue
			}
			value, _ = entry[field].(string)
			return true
		}
		return false
	})
	if value == "" {
		p.t.Fatalf("%s logged %q without a %s", p.name, msg, field)
	}
	return value
}

// instanceID is the dispatcher instance id p logged at start (what it writes to leased_by).
func (p *serveProc) instanceID() string {
	p.t.Helper()
	return p.logField(15*time.Second, "dispatcher started", "instance_id")
}

// metricsAddr is the address p serves /metrics on (METRICS_ADDR=127.0.0.1:0 picks a free port).
func (p *serveProc) metricsAddr() string {
	p.t.Helper()
	return p.logField(15*time.Second, "serving /metrics, /livez and /readyz", "addr")
}

// scrapeMetric returns the value of one series (name and labels exactly as exposed, e.g.
// `fluxora_webhook_wakeups_total{source="notify"}`) from addr's /metrics, 0 when absent.
func scrapeMetric(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping /metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("/metrics: %s has value %q", series, rest)
			}
			return v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading /metrics: %v", err)
	}
	return 0
}

// fluxhookBinaryNoRace is fluxhookBinary built without the race detector, for a case whose
// size the race detector would make too slow for CI (it slows a dispatcher several times
// over). Without -race it is the same binary as fluxhookBinary.
func fluxhookBinaryNoRace(t *testing.T) string { return fluxhooktest.BinaryNoRace(t) }

// runFluxhook runs a fluxhook subcommand (the test binary's build) to completion with exactly
// env as its environment, failing the test if it does not exit 0.
func runFluxhook(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, fluxhookBinary(t), args...)
	cmd.Env = []string{"GORACE=atexit_sleep_ms=0"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("fluxhook %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// respondAfter is a consumer that answers 200 after latency, so that a steady load always has
// requests in flight when a fault strikes (0 if the dispatcher gives up first).
func respondAfter(latency time.Duration) func(ctx context.Context, req *hookRequest) int {
	return func(ctx context.Context, _ *hookRequest) int {
		if !sleepCtx(ctx, latency) {
			return 0
		}
		return http.StatusOK
	}
}

// sleepCtx sleeps for d (not at all when d is not positive) and reports whether it did, false
// when ctx ended first: a consumer's latency, or a paced producer's wait for its next event's
// time, cut short when the request or the test ends.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// producer is an application enqueuing events at a steady rate, one transaction per event, as
// a web request handler would. It survives a database outage by retrying each insert until it
// commits, so that the load continues through the fault.
type producer struct {
	total, rate int
	cancel      context.CancelFunc
	done        chan struct{}

	mu       sync.Mutex
	ids      []string
	errs     int
	lastErr  error
	start    time.Time
	finished time.Time
}

// startProducer enqueues total events made by event(i) at rate events per second through
// pool, in a goroutine; wait collects them. It stops at cleanup if still running.
func startProducer(t *testing.T, pool *pgxpool.Pool, total, rate int, event func(i int) outbox.Event) *producer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &producer{total: total, rate: rate, cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() {
		cancel()
		<-p.done
	})
	interval := time.Second / time.Duration(rate)
	go func() {
		defer close(p.done)
		start := time.Now()
		p.mu.Lock()
		p.start = start
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.finished = time.Now()
			p.mu.Unlock()
		}()
		for i := range total {
			// Pacing, not waiting for async work: event i is due at start + i×interval.
			if !sleepCtx(ctx, time.Until(start.Add(time.Duration(i)*interval))) {
				return
			}
			ev := event(i)
			for {
				insertCtx, cancelInsert := context.WithTimeout(ctx, 5*time.Second)
				e, err := outbox.Enqueue(insertCtx, pool, ev)
				cancelInsert()
				if err == nil {
					p.mu.Lock()
					p.ids = append(p.ids, e.DeliveryID)
					p.mu.Unlock()
					break
				}
				if ctx.Err() != nil {
					return
				}
				// The database is down (the fault): retry this event once it is back. An insert
				// whose commit was cut off may have committed anyway; checkNoneLost reads the
				// outbox, so such an event is still expected at the consumer.
				p.mu.Lock()
				p.errs++
				p.lastErr = err
				p.mu.Unlock()
				retry := time.NewTimer(50 * time.Millisecond)
				select {
				case <-retry.C:
				case <-ctx.Done():
					retry.Stop()
					return
				}
			}
		}
	}()
	return p
}

// produced is how many events have been committed so far.
func (p *producer) produced() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ids)
}

// wait waits for the producer to enqueue every event and returns their delivery ids.
func (p *producer) wait(t *testing.T, timeout time.Duration) []string {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.cancel()
		<-p.done
		t.Fatalf("the producer enqueued %d of %d events in %s (paced for %s)", p.produced(), p.total, timeout,
			time.Duration(p.total)*time.Second/time.Duration(p.rate))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ids) != p.total {
		t.Fatalf("the producer enqueued %d of %d events (last error: %v)", len(p.ids), p.total, p.lastErr)
	}
	took := p.finished.Sub(p.start)
	if p.errs > 0 {
		t.Logf("producer: %d events in %s (paced for %s); %d inserts failed and were retried (last: %v)",
			p.total, took.Round(time.Millisecond), time.Duration(p.total)*time.Second/time.Duration(p.rate), p.errs, p.lastErr)
	} else {
		t.Logf("producer: %d events in %s (paced for %s)",
			p.total, took.Round(time.Millisecond), time.Duration(p.total)*time.Second/time.Duration(p.rate))
	}
	return slices.Clone(p.ids)
}

// enqueueBacklog inserts n events with one INSERT ... SELECT generate_series, the fastest way
// to build a large backlog (the trigger fires once).
func enqueueBacklog(t *testing.T, db *sqltest.DB, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tag, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload)
		SELECT 'test.backlog', jsonb_build_object('n', g) FROM generate_series(1, $1::int) g`, n)
	if err != nil {
		t.Fatalf("inserting the backlog: %v", err)
	}
	if tag.RowsAffected() != int64(n) {
		t.Fatalf("backlog: inserted %d rows, want %d", tag.RowsAffected(), n)
	}
}

// waitAll is pollUntil that also fails at once if any of procs exits while waiting.
func waitAll(t *testing.T, timeout time.Duration, what string, procs []*serveProc, cond func() bool) {
	t.Helper()
	pollUntil(t, timeout, what, func() bool {
		if cond() {
			return true
		}
		for _, p := range procs {
			if p.exited() {
				t.Fatalf("%s exited (%s) while waiting for %s", p.name, p.cmd.ProcessState, what)
			}
		}
		return false
	})
}

// waitSettled waits until the consumers have answered at least wantOK requests with a 2xx
// (cheap to check, so the database is not polled through the whole drain of a large backlog)
// and then until the outbox has no unprocessed row left: every event delivered or
// dead-lettered as far as the database is concerned, no retry pending. On timeout it reports
// an error and returns, so that checkNoneLost can still say which events are missing; it
// stops the test at once if one of procs exits.
func waitSettled(t *testing.T, db *sqltest.DB, timeout time.Duration, procs []*serveProc, consumers []*hookConsumer, wantOK int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, p := range procs {
			if p.exited() {
				t.Fatalf("%s exited (%s) while the events were being delivered", p.name, p.cmd.ProcessState)
			}
		}
		ok := 0
		for _, c := range consumers {
			_, _, n := c.counts()
			ok += n
		}
		left := -1
		if ok >= wantOK {
			if left = unprocessed(t, db); left == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			if left < 0 {
				left = unprocessed(t, db)
			}
			t.Errorf("timed out after %s waiting for every event to be settled: %d 2xx answers of the %d expected, %d outbox rows unprocessed",
				timeout, ok, wantOK, left)
			return
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline, as pollUntil does
	}
}

// faultExpect is what a fault case allows besides the rule that no event is lost.
type faultExpect struct {
	// InFlight are the events in flight at the fault: the only ones that may reach a
	// consumer with a 2xx more than once, or be sent twice in the same attempt.
	InFlight map[string]bool
	// MayDuplicate are events that may reach a consumer with a 2xx more than once in
	// different attempts (a 2xx that came after the timeout, so the attempt failed and was
	// retried); unlike InFlight, the same attempt must still not be sent twice.
	MayDuplicate map[string]bool
	// DeadLettered are the events that must end in webhook_dead_letter with a reason rather
	// than be delivered. Every other event must be delivered and must not be dead-lettered.
	DeadLettered map[string]bool
}

// faultTally sums up a case for its log line.
type faultTally struct {
	Events, Requests, Delivered, DeadLettered, Duplicated, InFlight int
}

func (f faultTally) String() string {
	return fmt.Sprintf("%d events, %d requests, %d delivered, %d dead-lettered, %d delivered more than once (%d in flight at the fault)",
		f.Events, f.Requests, f.Delivered, f.DeadLettered, f.Duplicated, f.InFlight)
}

// checkNoneLost is the check every fault case ends with, once waitSettled returned:
//   - every event, those the test enqueued and any other row in the outbox (an insert whose
//     commit the fault cut off may have committed), was answered 2xx by a consumer and settled
//     as delivered, or is in webhook_dead_letter with a reason, as want says;
//   - only events in flight at the fault were delivered more than once, or had the same
//     attempt sent twice; none was ever in flight twice at once at a consumer;
//   - every request carried a valid signature and the same body bytes for the same event.
func checkNoneLost(t *testing.T, db *sqltest.DB, enqueued []string, consumers []*hookConsumer, want faultExpect) faultTally {
	t.Helper()
	var tally faultTally
	tally.InFlight = len(want.InFlight)
	if n := unprocessed(t, db); n != 0 {
		t.Errorf("%d outbox rows are still unprocessed", n)
	}

	events := map[string]bool{}
	for _, id := range queryStrings(t, db, `SELECT DISTINCT delivery_id::text FROM webhook_deliveries`) {
		events[id] = true
	}
	var missing []string
	for _, id := range enqueued {
		if !events[id] {
			missing = append(missing, id)
			events[id] = true
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d committed events are not in the outbox at all: %s", len(missing), sample(missing))
	}
	tally.Events = len(events)

	dead := map[string]string{}
	rows, err := db.Pool.Query(context.Background(), `SELECT delivery_id::text, reason FROM webhook_dead_letter`)
	if err != nil {
		t.Fatalf("reading dead letters: %v", err)
	}
	for rows.Next() {
		var id, reason string
		if err := rows.Scan(&id, &reason); err != nil {
			t.Fatalf("reading dead letters: %v", err)
		}
		if strings.TrimSpace(reason) == "" {
			t.Errorf("dead letter %s has no reason", id)
		}
		dead[id] = reason
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatalf("reading dead letters: %v", err)
	}
	settledOK := map[string]bool{}
	for _, id := range queryStrings(t, db, `SELECT DISTINCT delivery_id::text FROM webhook_deliveries
		WHERE processed AND status_code BETWEEN 200 AND 299`) {
		settledOK[id] = true
	}

	type attemptKey struct{ id, attempt string }
	oks := map[string]int{}
	sent := map[attemptKey]int{}
	bodies := map[string][]byte{}
	var badSig, changed, overlapping []string
	for _, c := range consumers {
		for _, r := range c.requests() {
			tally.Requests++
			if r.VerifyErr != nil {
				badSig = append(badSig, fmt.Sprintf("%s: %v", r.DeliveryID, r.VerifyErr))
			}
			if prev, ok := bodies[r.DeliveryID]; ok && !bytes.Equal(prev, r.Body) {
				changed = append(changed, fmt.Sprintf("%s: %s then %s", r.DeliveryID, prev, r.Body))
			}
			bodies[r.DeliveryID] = r.Body
			sent[attemptKey{r.DeliveryID, r.Attempt}]++
			if r.Status >= 200 && r.Status <= 299 {
				oks[r.DeliveryID]++
			}
		}
		overlapping = append(overlapping, c.overlapping()...)
	}
	if len(badSig) > 0 {
		t.Errorf("%d requests with a signature that does not verify: %s", len(badSig), sample(badSig))
	}
	if len(changed) > 0 {
		t.Errorf("%d events whose body changed between requests: %s", len(changed), sample(changed))
	}
	if len(overlapping) > 0 {
		t.Errorf("%d events were in flight twice at once at a consumer: %s", len(overlapping), sample(overlapping))
	}
	var resent []string
	for k, n := range sent {
		if n > 1 && !want.InFlight[k.id] {
			resent = append(resent, fmt.Sprintf("%s attempt %s sent %d times", k.id, k.attempt, n))
		}
	}
	if len(resent) > 0 {
		t.Errorf("%d attempts of events not in flight at the fault were sent more than once (a lease overrun): %s", len(resent), sample(resent))
	}

	var lost, notDead, unexpectedDead, unsettled, duplicated []string
	for id := range events {
		reason, isDead := dead[id]
		if isDead {
			tally.DeadLettered++
		}
		if oks[id] > 0 {
			tally.Delivered++
		}
		if oks[id] > 1 {
			tally.Duplicated++
			if !want.InFlight[id] && !want.MayDuplicate[id] {
				duplicated = append(duplicated, fmt.Sprintf("%s (%d times)", id, oks[id]))
			}
		}
		switch {
		case want.DeadLettered[id]:
			if !isDead {
				notDead = append(notDead, id)
			}
		case isDead:
			unexpectedDead = append(unexpectedDead, fmt.Sprintf("%s: %s", id, reason))
		case oks[id] == 0:
			lost = append(lost, id)
		case !settledOK[id]:
			unsettled = append(unsettled, id)
		}
	}
	if len(lost) > 0 {
		t.Errorf("LOST: %d of %d events were never answered 2xx and are not dead-lettered: %s", len(lost), len(events), sample(lost))
	}
	if len(notDead) > 0 {
		t.Errorf("%d events that cannot be delivered are not in webhook_dead_letter: %s", len(notDead), sample(notDead))
	}
	if len(unexpectedDead) > 0 {
		t.Errorf("%d events were dead-lettered although their consumer accepts them: %s", len(unexpectedDead), sample(unexpectedDead))
	}
	if len(unsettled) > 0 {
		t.Errorf("%d events reached the consumer but no row records the delivery: %s", len(unsettled), sample(unsettled))
	}
	if len(duplicated) > 0 {
		t.Errorf("%d events not in flight at the fault were delivered more than once: %s", len(duplicated), sample(duplicated))
	}
	return tally
}

// sample is the first few items of a list, for error messages about thousands of events.
func sample(items []string) string {
	slices.Sort(items)
	const n = 5
	if len(items) <= n {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:n], "; ") + fmt.Sprintf("; ... (%d more)", len(items)-n)
}

// idSet turns ids into a set.
func idSet(ids []string) map[string]bool {
	set := make(map[string]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return set
}

// migratedCluster starts a throwaway PostgreSQL cluster with settings (for the cases that
// restart the server or need settings the shared test server lacks), installs the schema with
// `fluxhook migrate`, and returns it with a pool on it; both end with the test. It skips the
// test when no server binaries can be found or installed.
func migratedCluster(t *testing.T, ctx context.Context, settings map[string]string) (*pgtemp.Cluster, *sqltest.DB) {
	t.Helper()
	if _, err := pgtemp.FindBinaries(); err != nil && os.Geteuid() != 0 {
		t.Skipf("no PostgreSQL server binaries and not root to install them: %v", err)
	}
	cluster, err := pgtemp.Start(ctx, pgtemp.Options{Settings: settings})
	if err != nil {
		t.Fatalf("starting a PostgreSQL cluster: %v", err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })
	runFluxhook(t, map[string]string{"DATABASE_URL": cluster.URL()}, "migrate")
	pool, err := pgxpool.New(ctx, cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return cluster, &sqltest.DB{Name: "postgres", URL: cluster.URL(), Pool: pool}
}
