package dispatcher_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"go.uber.org/zap/zaptest/observer"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/dispatcher"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/sign"
)

func TestDeliversSignedExactBody(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// 204 with no Content-Type and no body is a success (the original regressed on it).
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) })
	b.start(b.config(c.URL()))

	payload := json.RawMessage(`{"event": "stream.updated", "nested": {"b": [1, 2], "a": "x"}}`)
	id := b.enqueue(outbox.Event{EventType: "stream.updated", Payload: payload, StreamID: "s-1"})
	b.waitSettled(10 * time.Second)

	got := c.arrivals()
	if len(got) != 1 {
		t.Fatalf("consumer got %d requests, want 1", len(got))
	}
	a := got[0]
	if a.VerifyErr != nil {
		t.Fatalf("signature does not verify: %v", a.VerifyErr)
	}
	if a.DeliveryID != id || a.Event != "stream.updated" || a.Attempt != "1" {
		t.Fatalf("headers: delivery id %q (want %q), event %q, attempt %q", a.DeliveryID, id, a.Event, a.Attempt)
	}
	if ct := a.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q", ct)
	}
	// The body is the stored jsonb, compacted once (as the original's JSON.stringify did);
	// jsonb orders keys by length, then bytes.
	want := `{"event":"stream.updated","nested":{"a":"x","b":[1,2]}}`
	if string(a.Body) != want {
		t.Fatalf("body = %s, want %s", a.Body, want)
	}
	ts := a.Header.Get("x-fluxora-timestamp")
	if sig := sign.FluxoraSignature([]byte(testSecret), ts, a.Body); a.Header.Get("x-fluxora-signature") != sig {
		t.Fatalf("signature header %q, want %q", a.Header.Get("x-fluxora-signature"), sig)
	}
	var status, attempt int
	if err := b.pool.QueryRow(context.Background(),
		`SELECT status_code, attempt FROM webhook_deliveries WHERE delivery_id = $1`, id).Scan(&status, &attempt); err != nil {
		t.Fatal(err)
	}
	if status != 204 || attempt != 1 {
		t.Fatalf("settled row: status %d attempt %d", status, attempt)
	}
}

func TestRetryKeepsDeliveryIDAndBody(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int32
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	cfg := b.config(c.URL())
	cfg.RetrySchedule = []time.Duration{300 * time.Millisecond}
	b.start(cfg)
	id := b.enqueue(outbox.Event{Payload: map[string]any{"k": "v"}})
	b.waitSettled(10 * time.Second)

	got := c.byDelivery()[id]
	if len(got) != 2 {
		t.Fatalf("got %d attempts, want 2", len(got))
	}
	if !bytes.Equal(got[0].Body, got[1].Body) {
		t.Fatalf("bodies differ between attempts: %s vs %s", got[0].Body, got[1].Body)
	}
	if got[0].Attempt != "1" || got[1].Attempt != "2" {
		t.Fatalf("attempt headers %q, %q", got[0].Attempt, got[1].Attempt)
	}
	// The second attempt is a new row due per the schedule, by the database's clock.
	var gap time.Duration
	err := b.pool.QueryRow(context.Background(), `
		SELECT r.created_at - f.processed_at FROM webhook_deliveries f JOIN webhook_deliveries r USING (delivery_id)
		WHERE f.attempt = 1 AND r.attempt = 2 AND delivery_id = $1`, id).Scan(&gap)
	if err != nil {
		t.Fatal(err)
	}
	if gap < 250*time.Millisecond || gap > 350*time.Millisecond {
		t.Fatalf("retry due %s after the failure, want the schedule's 300ms", gap)
	}
	// It arrived although the poll interval is an hour: the due timer woke the dispatcher.
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND status_code = 500`, id); n != 1 {
		t.Fatalf("first attempt row with status 500: %d", n)
	}
}

func TestPermanentFailureIsDeadLetteredWithoutRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusGone) })
	b.start(b.config(c.URL()))
	id := b.enqueue(outbox.Event{})
	b.waitSettled(10 * time.Second)
	if n := len(c.arrivals()); n != 1 {
		t.Fatalf("410 was attempted %d times, want 1", n)
	}
	status, attempts, reason := b.deadLetter(id)
	if status != 410 || attempts != 1 || !strings.Contains(reason, "410") {
		t.Fatalf("dead letter: status %d attempts %d reason %q", status, attempts, reason)
	}
}

func TestExhaustedRetriesAreDeadLetteredWithLastStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	cfg := b.config(c.URL())
	cfg.RetrySchedule = []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}
	b.start(cfg)
	id := b.enqueue(outbox.Event{})
	b.waitSettled(10 * time.Second)
	if n := len(c.byDelivery()[id]); n != 3 {
		t.Fatalf("attempts = %d, want 3 (1 + 2 retries)", n)
	}
	status, attempts, reason := b.deadLetter(id)
	if status != 503 || attempts != 3 || !strings.Contains(reason, "exhausted") {
		t.Fatalf("dead letter: status %d attempts %d reason %q", status, attempts, reason)
	}
}

func TestTimeoutAndConnectionRefusedAreRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var calls atomic.Int32
	slow := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		if calls.Add(1) == 1 {
			hang(a, release) // the first attempt hangs past the timeout
		}
	})
	// A port with nothing listening: connection refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String() + "/hook"
	l.Close()

	cfg := b.config(slow.URL())
	// The timeout is generous for a loaded CI machine running -race: a healthy answer must
	// never look like a timeout, or the event would exhaust its retries and the test would
	// measure the machine rather than the classification.
	cfg.Timeout = time.Second
	cfg.Lease = 10 * time.Second
	cfg.RetrySchedule = []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond}
	b.start(cfg)
	timedOut := b.enqueue(outbox.Event{})
	refusedID := b.enqueue(outbox.Event{EndpointURL: refused})
	b.waitSettled(20 * time.Second)

	if n := len(slow.byDelivery()[timedOut]); n < 2 {
		t.Fatalf("timed-out event attempted %d times, want at least 2 (retried, then delivered)", n)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND attempt = 1 AND error ILIKE '%timeout%'`, timedOut); n != 1 {
		t.Fatalf("the first attempt is not recorded as a timeout")
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND status_code = 200`, timedOut); n != 1 {
		t.Fatalf("the timed-out event was not delivered by a retry")
	}
	want := 1 + len(cfg.RetrySchedule)
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1`, refusedID); n != want {
		t.Fatalf("refused event has %d rows, want %d (first attempt and its retries)", n, want)
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1 AND last_error ILIKE '%refused%'`, refusedID); n != 1 {
		t.Fatalf("refused event not dead-lettered with a connection-refused error after its retries")
	}
}

func TestInvalidRowIsDeadLetteredAndTheRestDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	b.start(b.config(c.URL()))
	ctx := context.Background()
	var bad []string
	// One batch: good rows around invalid ones (credentials, scheme, plain http to a public host).
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for i, u := range []string{"", "https://user:pw@example.com/x", "", "ftp://example.com/x", "http://example.com/x", ""} {
			// Plain SQL, as any producer may write: outbox.Enqueue refuses these URLs itself.
			var id string
			if err := tx.QueryRow(ctx, `INSERT INTO webhook_outbox (event_type, payload, endpoint_url)
				VALUES ('t', jsonb_build_object('i', $1::int), NULLIF($2, '')) RETURNING delivery_id::text`, i, u).Scan(&id); err != nil {
				return err
			}
			if u != "" {
				bad = append(bad, id)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b.waitSettled(10 * time.Second)
	if n := len(c.arrivals()); n != 3 {
		t.Fatalf("consumer got %d requests, want the 3 valid rows", n)
	}
	for _, id := range bad {
		var reason string
		if err := b.pool.QueryRow(ctx, `SELECT reason FROM webhook_dead_letter WHERE delivery_id = $1`, id).Scan(&reason); err != nil {
			t.Fatalf("invalid row %s not dead-lettered: %v", id, err)
		}
		if !strings.Contains(reason, "endpoint_url") {
			t.Fatalf("reason %q does not name endpoint_url", reason)
		}
		if strings.Contains(reason, "pw@") {
			t.Fatalf("reason %q leaks the URL's credentials", reason)
		}
	}
}

func TestSlowEndpointDoesNotDelayOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	slowEP := newConsumer(t, func(a arrival, w http.ResponseWriter) { hang(a, release) })
	fast := newConsumer(t, nil)
	cfg := b.config(fast.URL())
	cfg.Timeout = 30 * time.Second
	b.start(cfg)
	b.enqueue(outbox.Event{EndpointURL: slowEP.URL()})
	eventually(t, 10*time.Second, "the slow endpoint to receive its request", func() bool { return len(slowEP.arrivals()) == 1 })
	for range 20 {
		b.enqueue(outbox.Event{})
	}
	// The 20 events reach the fast consumer while the slow request is still hanging.
	eventually(t, 10*time.Second, "20 deliveries to the fast endpoint", func() bool { return len(fast.arrivals()) == 20 })
	eventually(t, 10*time.Second, "every row but the hanging one settled", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE NOT processed`) == 1
	})
}

func TestSaturatedEndpointIsClaimedAround(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	slowEP := newConsumer(t, func(a arrival, w http.ResponseWriter) { hang(a, release) })
	fast := newConsumer(t, nil)
	cfg := b.config(fast.URL())
	cfg.EndpointConcurrency = 2
	cfg.MaxInFlight = 8
	cfg.Timeout = 60 * time.Second // the hanging requests must not time out during the test
	b.start(cfg)
	for range 10 {
		b.enqueue(outbox.Event{EndpointURL: slowEP.URL()})
	}
	eventually(t, 10*time.Second, "two requests hanging at the slow endpoint", func() bool { return len(slowEP.arrivals()) == 2 })
	for range 30 {
		b.enqueue(outbox.Event{})
	}
	// The slow endpoint's backlog does not hold the pipeline's capacity (8) hostage.
	eventually(t, 10*time.Second, "30 deliveries to the fast endpoint", func() bool { return len(fast.arrivals()) == 30 })
	if n := len(slowEP.arrivals()); n != 2 {
		t.Fatalf("slow endpoint got %d concurrent requests, limit is 2", n)
	}
	close(release)
	b.waitSettled(20 * time.Second)
	if n := len(slowEP.byDelivery()); n != 10 {
		t.Fatalf("slow endpoint eventually got %d distinct events, want 10", n)
	}
}

func TestRolledBackProducerDeliversNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	b.start(b.config(c.URL()))
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ghost, err := outbox.Enqueue(ctx, tx, outbox.Event{EventType: "ghost", Payload: map[string]int{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	real := b.enqueue(outbox.Event{EventType: "real"})
	b.waitSettled(10 * time.Second)
	got := c.byDelivery()
	if len(got[real]) != 1 || len(got[ghost.DeliveryID]) != 0 || len(got) != 1 {
		t.Fatalf("deliveries: %v; want only the committed event", keys(got))
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestTwoInstancesDeliverEveryEventNeverConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	const n = 2000
	ctx := context.Background()
	// Prefill, then start both instances at once so they race for the same rows.
	_, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload)
		SELECT 'bulk', jsonb_build_object('i', i) FROM generate_series(1, $1) i`, n)
	if err != nil {
		t.Fatal(err)
	}
	cfg := b.config(c.URL())
	cfg.BatchSize = 50
	b.start(cfg)
	b.start(cfg)
	b.waitSettled(60 * time.Second)
	got := c.byDelivery()
	if len(got) != n {
		t.Fatalf("distinct deliveries = %d, want %d", len(got), n)
	}
	c.mu.Lock()
	concurrent := len(c.concurrent)
	c.mu.Unlock()
	if concurrent != 0 {
		t.Fatalf("%d delivery ids were received twice at the same time", concurrent)
	}
	if dups := len(c.arrivals()) - n; dups != 0 {
		t.Fatalf("%d duplicate deliveries with both instances healthy", dups)
	}
}

func TestListenerReconnectsAfterBackendKilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	cfg := b.config(c.URL())
	// The poll is an hour away: every delivery below comes through the listener, by the
	// backlog claim it makes on reconnecting or by a NOTIFY to the new connection.
	cfg.PollInterval = time.Hour
	d := b.start(cfg)
	ctx := context.Background()
	listenerPID := func() int {
		var pid int
		err := b.pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'fluxhook-listener'`).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	eventually(t, 10*time.Second, "listener connected", func() bool { return d.ListenerConnected() && listenerPID() != 0 })
	if n := counterValue(t, d, "fluxora_webhook_listener_reconnects_total", "", ""); n != 0 {
		t.Fatalf("%v reconnects before the backend was killed", n)
	}
	old := listenerPID()
	if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, old); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		b.enqueue(outbox.Event{})
	}
	eventually(t, 10*time.Second, "deliveries to continue", func() bool { return len(c.arrivals()) == 5 })
	eventually(t, 10*time.Second, "a new listener backend", func() bool {
		pid := listenerPID()
		return pid != 0 && pid != old && d.ListenerConnected()
	})
	if n := counterValue(t, d, "fluxora_webhook_listener_reconnects_total", "", ""); n != 1 {
		t.Errorf("listener_reconnects_total = %v after one killed backend, want 1", n)
	}
	// And NOTIFY works again through the new connection: with the poll an hour away, a new
	// event arrives only by NOTIFY (or the due timer, which has nothing to wait for).
	b.waitSettled(10 * time.Second)
	b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "delivery after reconnect", func() bool { return len(c.arrivals()) == 6 })
	if n := counterValue(t, d, "fluxora_webhook_wakeups_total", "source", "poll"); n != 0 {
		t.Errorf("the poll woke the dispatcher %v times; the test no longer shows the listener delivering", n)
	}
	if n := counterValue(t, d, "fluxora_webhook_wakeups_total", "source", "backlog"); n < 2 {
		t.Errorf("%v backlog wake-ups, want one per connection (2)", n)
	}
}

func TestStopDrainsInFlightRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) { hang(a, release) })
	d, err := dispatcher.New(b.config(c.URL()))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "request in flight", func() bool { return len(c.arrivals()) == 1 })
	stopped := make(chan error, 1)
	go func() { stopped <- d.Stop(context.Background()) }()
	// Stop must not return while the request is in flight; let the consumer answer.
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) with a request in flight", err)
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed AND status_code = 200`, id); n != 1 {
		t.Fatalf("in-flight delivery was not settled before Stop returned")
	}
}

func TestStopTimeoutReleasesInFlightRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) { hang(a, release) })
	d, err := dispatcher.New(b.config(c.URL()))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(outbox.Event{})
	eventually(t, 10*time.Second, "request in flight", func() bool { return len(c.arrivals()) == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the drain deadline has already passed: a second signal
	if err := d.Stop(ctx); err == nil {
		t.Fatal("Stop with an expired drain reported a clean drain")
	}
	// The row is neither processed nor lost: it is released for prompt redelivery.
	var processed bool
	var leaseLeft time.Duration
	if err := b.pool.QueryRow(context.Background(), `SELECT processed, coalesce(lease_until - now(), '0') FROM webhook_deliveries WHERE delivery_id = $1`, id).
		Scan(&processed, &leaseLeft); err != nil {
		t.Fatal(err)
	}
	if processed || leaseLeft > time.Second {
		t.Fatalf("cancelled row: processed=%v lease left %s; want unprocessed and released", processed, leaseLeft)
	}
}

// TestStopLetsAClaimInFlightFinish: a claim statement already sent when Stop begins commits
// its lease on the server whether or not the client still reads the answer. Cancelling it
// lost the answer and left the row leased to a stopped instance for the whole lease (CI saw
// a 30 s stall in TestRestartedDispatcherSeesTheBreaker). The claim is held in flight by a
// lock on webhook_dispatcher, which every claim statement updates; Stop begins; the lock is
// released: the row must be delivered and settled before Stop returns.
func TestStopLetsAClaimInFlightFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(arrival, http.ResponseWriter) {})
	d := b.start(b.config(c.URL()))
	eventually(t, 10*time.Second, "the dispatcher to be ready", func() bool { return d.Ready(context.Background()) == nil })

	ctx := context.Background()
	var lock pgx.Tx
	var id string
	// The claim held must be one sent after the row committed: a claim sent earlier (the
	// dispatcher's confirming claim just after start) was seen to find nothing once the lock
	// let it run (in 6 of 40 runs under load), so its snapshot predates the wait. If the claim
	// waiting is such an earlier one, let it go, let the row be delivered, and try again.
	for try := 1; ; try++ {
		var err error
		if lock, err = b.pool.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = lock.Rollback(ctx) }()
		if _, err := lock.Exec(ctx, `LOCK TABLE webhook_dispatcher IN EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		// The producer's last statement before COMMIT reads the clock: a claim that started
		// later was sent after the row committed, give or take that statement's return (a
		// NOTIFY-woken claim always starts after the commit; reading the clock after the
		// commit came too late for one that the NOTIFY woke at once).
		producer, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e, err := outbox.Enqueue(ctx, producer, outbox.Event{EventType: "test.event", Payload: map[string]any{"n": try}})
		if err != nil {
			t.Fatal(err)
		}
		var committed time.Time
		if err := producer.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&committed); err != nil {
			t.Fatal(err)
		}
		if err := producer.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		id = e.DeliveryID
		waiting := `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '-- Lease up to%'` // the claim's opening comment
		eventually(t, 10*time.Second, "a claim to wait on the lock", func() bool { return b.count(waiting) == 1 })
		if b.count(waiting+` AND query_start > $1`, committed) == 1 {
			break
		}
		if try == 5 {
			t.Fatal("five times the claim waiting on the lock was one sent before the row committed")
		}
		if err := lock.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the row of the try to be delivered", func() bool {
			return b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed`, id) == 1
		})
	}

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stopped <- d.Stop(ctx)
	}()
	eventually(t, 10*time.Second, "Stop to begin", func() bool { return d.Ready(context.Background()) != nil })
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed AND status_code = 200`, id); n != 1 {
		t.Fatalf("the row claimed while Stop began was not delivered before Stop returned (%d arrivals); leased: %d",
			c.received(), b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND lease_until > now()`, id))
	}
}

// TestProducerThatMissedTheSwitchIsDeliveredOnCommit: a producer whose trigger ran before the
// dispatcher set the NOTIFY switch commits without a NOTIFY. When it commits long after the
// dispatcher armed (here: after the confirming claim and the follow-up look 100 ms later),
// only the looks the dispatcher keeps taking while a transaction in progress at arming is
// still in progress find its row; before them it waited for the backstop poll (an hour here;
// CI saw TestRetryKeepsDeliveryIDAndBody time out on a slow commit).
func TestProducerThatMissedTheSwitchIsDeliveredOnCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(arrival, http.ResponseWriter) {})
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	e, err := outbox.Enqueue(ctx, tx, outbox.Event{EventType: "test.event", Payload: map[string]any{"slow": true}})
	if err != nil {
		t.Fatal(err)
	}
	d := b.start(b.config(c.URL()))
	// Arming claim, confirming claim, the follow-up 100 ms later (and maybe a wake-up when
	// the listener connected): all before the producer commits, so none could see its row.
	eventually(t, 10*time.Second, "four claims", func() bool { return d.Stats().Claims.Load() >= 4 })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the slow producer's event delivered", func() bool {
		return len(c.byDelivery()[e.DeliveryID]) == 1
	})
	// Those looks are counted as a wake-up source of their own, not as rows coming due.
	if v, _ := metricValue(t, d.Registry(), "fluxora_webhook_wakeups_total", map[string]string{"source": "watch"}); v < 2 {
		t.Errorf(`wakeups_total{source="watch"} = %v, want at least 2 (the follow-up and a look after it)`, v)
	}
}

// hang blocks a consumer's answer until the test releases it or the dispatcher gives up.
func hang(a arrival, release <-chan struct{}) {
	select {
	case <-release:
	case <-a.Ctx.Done():
	}
}

// TestHostileRowsAreDeadLetteredWithAReason inserts rows a producer could write with plain
// SQL that can never be delivered: an empty event type and a payload over the size limit.
// Each is dead-lettered with a reason naming the problem; the good row is delivered.
func TestHostileRowsAreDeadLetteredWithAReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	cfg := b.config(c.URL())
	cfg.MaxPayloadBytes = 1024
	b.start(cfg)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES
		('', '{"x": 1}'),
		('big', jsonb_build_object('pad', repeat('x', 2000))),
		('fine', '{"ok": true}')`)
	if err != nil {
		t.Fatal(err)
	}
	b.waitSettled(10 * time.Second)
	if got := c.arrivals(); len(got) != 1 || got[0].Event != "fine" {
		t.Fatalf("consumer got %d requests; want only the valid row", len(got))
	}
	reasons := map[string]string{}
	rows, err := b.pool.Query(ctx, `SELECT event_type, reason FROM webhook_dead_letter`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var e, r string
		if err := rows.Scan(&e, &r); err != nil {
			t.Fatal(err)
		}
		reasons[e] = r
	}
	if !strings.Contains(reasons[""], "event_type is empty") {
		t.Errorf("empty event type: reason %q", reasons[""])
	}
	if !strings.Contains(reasons["big"], "WEBHOOK_MAX_PAYLOAD_BYTES") {
		t.Errorf("oversize payload: reason %q", reasons["big"])
	}
}

// A Start that fails (here: no schema) leaves nothing running, and Stop afterwards, as a
// caller's deferred clean-up would run it, returns at once instead of shutting down stages
// that never started.
func TestStopAfterAFailedStart(t *testing.T) {
	db := sqltest.New(t) // no migrations
	d, err := dispatcher.New(dispatcher.Config{
		DatabaseURL: db.URL,
		DefaultURL:  "http://127.0.0.1:1/hook",
		Secret:      testSecret,
		Logger:      zaptest.NewLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "fluxhook migrate") {
		t.Fatalf("Start on a database without the schema = %v, want an error saying to run fluxhook migrate", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Fatalf("Stop after a failed Start = %v, want nil", err)
	}
	// Stop closed the HTTP transport and any Redis client: a retried Start would deliver
	// through a gate that fails open on every row, so it is refused, even once the schema is
	// there.
	if _, err := fluxsql.Migrate(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err == nil || !strings.Contains(err.Error(), "Start after Stop") {
		t.Fatalf("Start after Stop = %v, want it refused", err)
	}
}

// A row the database refuses to mark processed, and then to dead-letter (here a trigger an
// operator added), is logged at Error with its delivery id and counted as a settle error,
// not reported as delivered; a row settled alongside it is unaffected.
func TestRowTheDatabaseRefusesToSettleIsLoggedByDeliveryID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	sqltest.RefuseSettles(t, b.db, `NEW.event_type = 'stuck'`)
	cfg, logs := b.observedConfig(c.URL(), zap.DebugLevel) // "delivered" is a debug line
	d := b.start(cfg)
	stuck := b.enqueue(outbox.Event{EventType: "stuck"})
	fine := b.enqueue(outbox.Event{EventType: "fine"})
	eventually(t, 10*time.Second, "the fine row settled and the stuck row reported", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed`, fine) == 1 &&
			logs.FilterMessageSnippet("could not be settled").Len() > 0
	})
	entries := logs.FilterMessageSnippet("could not be settled").All()
	fields := entries[0].ContextMap()
	if entries[0].Level != zap.ErrorLevel || fields["delivery_id"] != stuck || !strings.Contains(fmt.Sprint(fields["reason"]), "refused by the operator") {
		t.Errorf("log = %v %q %v, want an Error with the stuck row's delivery id and the database's reason", entries[0].Level, entries[0].Message, fields)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND NOT processed AND lease_until > now()`, stuck); n != 1 {
		t.Errorf("the stuck row is not left leased (%d rows)", n)
	}
	if v := counterValue(t, d, "fluxora_webhook_settle_errors_total", "", ""); v < 1 {
		t.Errorf("settle_errors_total = %v, want the refused row counted", v)
	}
	if logs.FilterMessage("delivered").FilterField(zap.String("delivery_id", fine)).Len() != 1 {
		t.Errorf("the fine row was not logged as delivered; the check below would not see a stuck one either")
	}
	if logs.FilterMessage("delivered").FilterField(zap.String("delivery_id", stuck)).Len() != 0 {
		t.Errorf("the stuck row was logged as delivered")
	}
	if v := counterValue(t, d, "fluxora_webhook_deliveries_total", "outcome", "delivered"); v != 1 {
		t.Errorf("deliveries_total{outcome=delivered} = %v, want 1 (the fine row only)", v)
	}
}

// TestInvalidURLDeadLetterLogFields: a row dead-lettered for its endpoint_url before any attempt
// is logged with that URL's origin (never the URL), without the URL's hash at info (a key for
// Redis, not a name for a person) and without an empty error field: the reason says what is
// wrong.
func TestInvalidURLDeadLetterLogFields(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	cfg, logs := b.observedConfig(c.URL(), zap.InfoLevel)
	b.start(cfg)
	const bad = "ftp://user:token@example.com/hook"
	var id string // plain SQL, as any producer may write: outbox.Enqueue refuses this URL itself
	if err := b.pool.QueryRow(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, endpoint_url)
		VALUES ('bad.url', '{}', $1) RETURNING delivery_id::text`, bad).Scan(&id); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the row dead-lettered and logged", func() bool {
		return logs.FilterMessage("delivery dead-lettered").FilterField(zap.String("delivery_id", id)).Len() == 1
	})
	fields := logs.FilterMessage("delivery dead-lettered").FilterField(zap.String("delivery_id", id)).All()[0].ContextMap()
	sum := sha256.Sum256([]byte(bad))
	for k, v := range fields {
		if v == hex.EncodeToString(sum[:]) {
			t.Errorf("field %s holds the URL's hash at info", k)
		}
	}
	if e, ok := fields["error"]; ok {
		t.Errorf("error field %q present, want it left out when there was no attempt", e)
	}
	if fields["origin"] != "ftp://example.com" {
		t.Errorf("origin field = %v, want ftp://example.com (the URL's scheme and host, without its credentials)", fields["origin"])
	}
	if fmt.Sprint(fields["reason"]) == "" || strings.Contains(fmt.Sprint(fields), "token") {
		t.Errorf("fields %v: want a reason and no part of the URL", fields)
	}
}

// TestDeliveryLinesNameTheConsumersOrigin: a failed attempt's line names the consumer by its
// URL's origin (scheme, host and port), so that an operator sees which consumer fails without
// hashing URLs, and never carries the URL's path or query, where tokens live.
func TestDeliveryLinesNameTheConsumersOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(_ arrival, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	cfg, logs := b.observedConfig(c.URL()+"/hooks/secret-path?token=secret-query", zap.InfoLevel)
	cfg.RetrySchedule = []time.Duration{time.Hour}
	b.start(cfg)
	id := b.enqueue(outbox.Event{})
	lines := func() *observer.ObservedLogs { return logs.FilterField(zap.String("delivery_id", id)) }
	eventually(t, 10*time.Second, "the failed attempt logged", func() bool { return lines().Len() > 0 })
	u, err := url.Parse(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range lines().All() {
		if got := e.ContextMap()["origin"]; got != "http://"+u.Host {
			t.Errorf("%q: origin = %v, want http://%s", e.Message, got, u.Host)
		}
	}
	for _, e := range logs.All() {
		if s := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(s, "secret-") {
			t.Errorf("a log line carries the URL's path or query: %s", s)
		}
	}
}

// stallingGate makes its first batch reach its requests past the batch's send-by time, as a
// dispatcher paused between claim and send would (a stop-the-world pause, SIGSTOP, a starved
// CPU), and allows everything.
type stallingGate struct {
	gate.AllowAll
	once sync.Once
}

func (g *stallingGate) Check(ctx context.Context, batch []*delivery.Delivery) {
	// The pause under test, without sleeping through the 500 ms left before the lease ends (a
	// loaded machine could let a claim take the row again first): the rows reach their
	// request past their send-by time.
	g.once.Do(func() {
		for _, del := range batch {
			del.SendBy = time.Now().Add(-time.Millisecond)
		}
	})
}

// TestHeldUpPastTheLeaseReleasesUnsent: a row that reaches its request when its lease has
// (nearly) run out is released without a request (another instance may already have claimed
// it), logged, and then claimed again and delivered once with the same attempt number.
func TestHeldUpPastTheLeaseReleasesUnsent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	cfg, logs := b.observedConfig(c.URL(), zap.InfoLevel)
	cfg.Timeout = time.Second
	cfg.Lease = cfg.Timeout + dispatcher.LeaseAllowance // may send until 2.5 s after the claim
	cfg.Gate = &stallingGate{}
	d := b.start(cfg)
	id := b.enqueue(outbox.Event{})
	eventually(t, 15*time.Second, "the row delivered", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE delivery_id = $1 AND processed AND status_code = 200`, id) == 1
	})
	released := logs.FilterMessageSnippet("released unsent").FilterField(zap.String("delivery_id", id))
	if released.Len() != 1 {
		t.Fatalf("%d 'released unsent' lines for the row, want 1; all lines: %v", released.Len(), logs.All())
	}
	if e := released.All()[0]; e.Level != zap.WarnLevel || e.ContextMap()["late_ms"].(int64) < 0 {
		t.Errorf("log = %v %v, want a Warn with how late the row was", e.Level, e.ContextMap())
	}
	if got := c.byDelivery()[id]; len(got) != 1 {
		t.Errorf("the consumer received the row %d times, want once", len(got))
	}
	if n := b.count(`SELECT max(attempt) FROM webhook_deliveries WHERE delivery_id = $1`, id); n != 1 {
		t.Errorf("the delivered row is attempt %d, want 1: a row released unsent used no attempt", n)
	}
	if n := d.Stats().Released.Load(); n < 1 {
		t.Errorf("Stats().Released = %d, want the released row counted", n)
	}
}
