package dispatcher_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/dispatcher"
	"github.com/fluxora/fluxhook/stages/send"
	"github.com/fluxora/fluxhook/stages/sign"
)

const testSecret = "test-secret"

// arrival is one request the test consumer received.
type arrival struct {
	DeliveryID string
	Event      string
	Attempt    string
	Header     http.Header
	Body       []byte
	VerifyErr  error
	At         time.Time
	// Ctx ends when the dispatcher gives up on the request; handlers that hang select on it
	// so that a cancelled request never keeps the test server from closing.
	Ctx context.Context
}

// consumer is a real HTTP consumer that verifies every signature and records every request.
// respond decides the answer; it may block (slow consumers).
type consumer struct {
	t       testing.TB
	srv     *httptest.Server
	mu      sync.Mutex
	got     []arrival
	arrived chan struct{} // signalled (coalesced) on every arrival
	respond func(a arrival, w http.ResponseWriter)
	// inFlight tracks delivery ids being handled right now, to detect concurrent duplicates.
	inFlight   map[string]bool
	concurrent []string
}

func newConsumer(t testing.TB, respond func(a arrival, w http.ResponseWriter)) *consumer {
	c := &consumer{t: t, arrived: make(chan struct{}, 1), respond: respond, inFlight: map[string]bool{}}
	if c.respond == nil {
		c.respond = func(arrival, http.ResponseWriter) {}
	}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *consumer) URL() string { return c.srv.URL + "/hook" }

func (c *consumer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a := arrival{
		DeliveryID: r.Header.Get("x-fluxora-delivery-id"),
		Event:      r.Header.Get("x-fluxora-event"),
		Attempt:    r.Header.Get("x-fluxora-attempt"),
		Header:     r.Header.Clone(),
		Body:       body,
		VerifyErr:  sign.VerifyFluxora(r.Header, body, time.Now(), 300*time.Second, []byte(testSecret)),
		At:         time.Now(),
		Ctx:        r.Context(),
	}
	c.mu.Lock()
	if c.inFlight[a.DeliveryID] {
		c.concurrent = append(c.concurrent, a.DeliveryID)
	}
	c.inFlight[a.DeliveryID] = true
	c.got = append(c.got, a)
	c.mu.Unlock()
	select {
	case c.arrived <- struct{}{}:
	default:
	}
	c.respond(a, w)
	c.mu.Lock()
	delete(c.inFlight, a.DeliveryID)
	c.mu.Unlock()
}

func (c *consumer) arrivals() []arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]arrival(nil), c.got...)
}

// received is the number of requests so far (cheap enough to poll in benchmarks).
func (c *consumer) received() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

// byDelivery groups arrivals by delivery id.
func (c *consumer) byDelivery() map[string][]arrival {
	out := map[string][]arrival{}
	for _, a := range c.arrivals() {
		out[a.DeliveryID] = append(out[a.DeliveryID], a)
	}
	return out
}

// bundle is one test's world: its own database, a consumer, and helpers.
type bundle struct {
	t    testing.TB
	db   *sqltest.DB
	pool *pgxpool.Pool
}

func setup(t testing.TB) *bundle {
	t.Helper()
	db := sqltest.NewMigrated(t)
	return &bundle{t: t, db: db, pool: db.Pool}
}

// config returns a dispatcher config for tests: fast poll-independent timings, no jitter.
func (b *bundle) config(url string) dispatcher.Config {
	return dispatcher.Config{
		DatabaseURL:   b.db.URL,
		DefaultURL:    url,
		Secret:        testSecret,
		PollInterval:  time.Hour, // tests must not depend on the backstop poll unless they say so
		Timeout:       5 * time.Second,
		RetrySchedule: []time.Duration{200 * time.Millisecond, 200 * time.Millisecond},
		RetryJitter:   -1,
		Logger:        zaptest.NewLogger(b.t),
		// Tests' consumers listen on loopback, endpoint_url rows' too: allowed explicitly,
		// as an operator would (WEBHOOK_ROW_URL_NETWORKS=loopback).
		RowURLNetworks: loopbackNetworks,
	}
}

// loopbackNetworks is WEBHOOK_ROW_URL_NETWORKS=loopback.
var loopbackNetworks = func() []netip.Prefix {
	nets, err := send.ParseRowURLNetworks("loopback")
	if err != nil {
		panic(err)
	}
	return nets
}()

// observedConfig is config with the dispatcher's log lines at level and above kept for the
// test to read.
func (b *bundle) observedConfig(url string, level zapcore.Level) (dispatcher.Config, *observer.ObservedLogs) {
	core, logs := observer.New(level)
	cfg := b.config(url)
	cfg.Logger = zap.New(core)
	b.t.Cleanup(func() {
		if b.t.Failed() { // the dispatcher's own account of what it did, for the failure's reader
			for _, e := range logs.All() {
				b.t.Logf("log %s %s %s %v", e.Time.Format("15:04:05.000"), e.Level, e.Message, e.ContextMap())
			}
		}
	})
	return cfg, logs
}

// start runs a dispatcher and stops it (gracefully) at cleanup.
func (b *bundle) start(cfg dispatcher.Config) *dispatcher.Dispatcher {
	b.t.Helper()
	d, err := dispatcher.New(cfg)
	if err != nil {
		b.t.Fatalf("dispatcher.New: %v", err)
	}
	if err := d.Start(context.Background()); err != nil {
		b.t.Fatalf("dispatcher.Start: %v", err)
	}
	b.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	return d
}

// enqueue commits one event and returns its delivery id.
func (b *bundle) enqueue(ev outbox.Event) string {
	b.t.Helper()
	if ev.EventType == "" {
		ev.EventType = "test.event"
	}
	if ev.Payload == nil {
		ev.Payload = map[string]any{"n": 1}
	}
	e, err := outbox.Enqueue(context.Background(), b.pool, ev)
	if err != nil {
		b.t.Fatalf("enqueue: %v", err)
	}
	return e.DeliveryID
}

// eventually polls cond until it holds or the deadline passes (a condition with a deadline,
// never a bare sleep).
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// count runs a counting query.
func (b *bundle) count(query string, args ...any) int {
	b.t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		b.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// armedAndAnnounced reports whether the dispatcher's flag is set and the producers' NOTIFY
// switch reaches at least ahead past the database's clock.
func (b *bundle) armedAndAnnounced(ahead time.Duration) bool {
	return b.count(`SELECT count(*) FROM webhook_dispatcher WHERE armed`) == 1 &&
		b.count(`SELECT count(*) WHERE pg_sequence_last_value('webhook_outbox_notify_until') >
			(extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1`, ahead.Milliseconds()) == 1
}

// waitSettled waits until no unprocessed rows remain.
func (b *bundle) waitSettled(timeout time.Duration) {
	b.t.Helper()
	eventually(b.t, timeout, "every outbox row settled", func() bool {
		return b.count("SELECT count(*) FROM webhook_deliveries WHERE NOT processed") == 0
	})
}

// deadLetter returns the last status, attempts and reason of the event's dead letter, failing
// the test when there is none.
func (b *bundle) deadLetter(deliveryID string) (status, attempts int, reason string) {
	b.t.Helper()
	if err := b.pool.QueryRow(context.Background(),
		`SELECT coalesce(last_status, 0), attempts, reason FROM webhook_dead_letter WHERE delivery_id = $1`, deliveryID).
		Scan(&status, &attempts, &reason); err != nil {
		b.t.Fatalf("dead letter for %s: %v", deliveryID, err)
	}
	return status, attempts, reason
}
