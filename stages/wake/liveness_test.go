package wake_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/wake"
)

// pinger is a Config.Ping that sends straight to the server (not through the proxy a
// listener may be behind), as the dispatcher's pool does, counting the pings it sent.
type pinger struct {
	db   *sqltest.DB
	sent atomic.Int64
}

func (p *pinger) ping(ctx context.Context, channel, payload string) error {
	if _, err := p.db.Pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, payload); err != nil {
		return err
	}
	p.sent.Add(1)
	return nil
}

// errorLog collects the errors a Waker reports.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) add(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *errorLog) all() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

func (l *errorLog) len() int { return len(l.all()) }

// waitForPings waits until p has sent n more pings than it had when called.
func waitForPings(t *testing.T, p *pinger, n int64, what string) {
	t.Helper()
	from := p.sent.Load()
	waitUntil(t, 5*time.Second, what, func() bool { return p.sent.Load() >= from+n })
}

// TestListenerReplacesASilentlyDeadConnection: a connection that stops carrying bytes without
// being closed (a network dropping packets, a server gone without a FIN) must not keep the
// listener reporting itself connected, which /readyz believes, while only the poll delivers.
// The liveness check (a ping sent over another connection that does not come back) finds it
// out, the listener reconnects once the network is back, claims what it may have missed, and
// hears NOTIFYs again.
func TestListenerReplacesASilentlyDeadConnection(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	pcfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newBlackholeProxy(t, net.JoinHostPort(pcfg.Host, strconv.Itoa(int(pcfg.Port))))
	pcfg.Host, pcfg.Port = proxy.host, proxy.port
	for _, f := range pcfg.Fallbacks { // or a fallback (sslmode=prefer) would go around the proxy
		f.Host, f.Port = proxy.host, proxy.port
	}

	rec := &recorder{}
	errs := &errorLog{}
	p := &pinger{db: db}
	var attempts, connects atomic.Int64
	w := wake.New(wake.Config{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			attempts.Add(1)
			return pgx.ConnectConfig(ctx, pcfg)
		},
		Ping: p.ping,
		// The poll is an hour away, so every wake-up below comes from the listener.
		PollInterval:   time.Hour,
		ReconnectDelay: 50 * time.Millisecond,
		// Small enough to keep the test short, large enough that a healthy ping on a loaded
		// machine under -race comes back in time.
		PingInterval:   300 * time.Millisecond,
		PingTimeout:    500 * time.Millisecond,
		ConnectTimeout: time.Second,
		OnWake:         rec.add,
		OnError:        errs.add,
		OnConnect:      func() { connects.Add(1) },
	})
	w.Start(context.Background())
	t.Cleanup(w.Stop)

	waitUntil(t, 5*time.Second, "the listener connects", w.Connected)
	waitForWake(t, rec, 5*time.Second, "the first connection claims the backlog", wake.Backlog)
	sendNotify(t, db)
	waitForWake(t, rec, 5*time.Second, "a NOTIFY before the network fails", wake.Notify)
	// An idle healthy connection is pinged and kept. A ping goes out only once the one before
	// came back (or the connection would have been replaced), so three pings sent without an
	// error or a second connect mean the first two came back.
	waitForPings(t, p, 3, "the listener pings its idle connection")
	if e, c := errs.all(), connects.Load(); len(e) != 0 || c != 1 {
		t.Fatalf("after three pings on a healthy connection: errors %v, %d connects; want none and 1", e, c)
	}

	proxy.blackhole(true)
	// Connected turns false a moment before OnError reports why: wait for both.
	waitUntil(t, 5*time.Second, "the listener notices its connection is dead and says why", func() bool {
		return !w.Connected() && len(errs.all()) > 0
	})
	if e := errs.all(); len(e) == 0 || !strings.Contains(e[0].Error(), "did not come back") {
		t.Fatalf("errors %v: want the first to report the ping that did not come back", e)
	}
	// The second error is a reconnect attempt that timed out on the dead network: attempts
	// must give up and retry, not hang until TCP does.
	waitUntil(t, 5*time.Second, "a reconnect attempt times out", func() bool { return attempts.Load() >= 2 && errs.len() >= 2 })
	if w.Connected() {
		t.Fatal("the listener reports itself connected with the network still dead")
	}
	rec.take() // the Backlog waited for below must be the reconnect's

	proxy.blackhole(false)
	waitUntil(t, 5*time.Second, "the listener reconnects", func() bool { return w.Connected() && connects.Load() >= 2 })
	waitForWake(t, rec, 5*time.Second, "the reconnect claims what the dead connection missed", wake.Backlog)
	sendNotify(t, db)
	waitForWake(t, rec, 5*time.Second, "a NOTIFY through the new connection", wake.Notify)
}

// TestListenThatNeverCompletesIsAbandoned: ConnectTimeout bounds LISTEN as well as connecting.
// pgxlisten runs LISTEN under no deadline of its own, so a network that dies just after the
// connection opened would otherwise leave the listener waiting for LISTEN for as long as TCP
// keeps retrying, not connected and not reconnecting.
func TestListenThatNeverCompletesIsAbandoned(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	pcfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newBlackholeProxy(t, net.JoinHostPort(pcfg.Host, strconv.Itoa(int(pcfg.Port))))
	pcfg.Host, pcfg.Port = proxy.host, proxy.port
	for _, f := range pcfg.Fallbacks {
		f.Host, f.Port = proxy.host, proxy.port
	}

	rec := &recorder{}
	errs := &errorLog{}
	var attempts atomic.Int64
	w := wake.New(wake.Config{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			conn, err := pgx.ConnectConfig(ctx, pcfg)
			if attempts.Add(1) == 1 {
				proxy.blackhole(true) // the network dies between connecting and LISTEN
			}
			return conn, err
		},
		Ping:           (&pinger{db: db}).ping,
		PollInterval:   time.Hour,
		ReconnectDelay: 50 * time.Millisecond,
		ConnectTimeout: 500 * time.Millisecond,
		OnWake:         rec.add,
		OnError:        errs.add,
	})
	w.Start(context.Background())
	t.Cleanup(w.Stop)

	waitUntil(t, 5*time.Second, "the unfinished LISTEN is given up", func() bool {
		return slices.ContainsFunc(errs.all(), func(err error) bool { return strings.Contains(err.Error(), "not in place within") })
	})
	if w.Connected() {
		t.Fatal("the listener reports itself connected without LISTEN in place")
	}
	proxy.blackhole(false)
	waitUntil(t, 5*time.Second, "the listener connects once the network is back", w.Connected)
	waitForWake(t, rec, 5*time.Second, "the connection claims the backlog", wake.Backlog)
	sendNotify(t, db)
	waitForWake(t, rec, 5*time.Second, "a NOTIFY through the connection", wake.Notify)
}

// TestPingIsNotAWakeUp: the listener's pings, its own and any other dispatcher's, prove its
// connection alive but must not wake the claiming loop, or an idle dispatcher would claim
// every PingInterval for nothing.
func TestPingIsNotAWakeUp(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	rec := &recorder{}
	errs := &errorLog{}
	p := &pinger{db: db}
	var connects atomic.Int64
	w := wake.New(wake.Config{
		Connect:        func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, db.URL) },
		Ping:           p.ping,
		PollInterval:   time.Hour,
		PingInterval:   100 * time.Millisecond,
		PingTimeout:    2 * time.Second,
		ReconnectDelay: 50 * time.Millisecond,
		OnWake:         rec.add,
		OnError:        errs.add,
		OnConnect:      func() { connects.Add(1) },
	})
	w.Start(context.Background())
	t.Cleanup(w.Stop)

	waitUntil(t, 5*time.Second, "the listener connects", w.Connected)
	waitForWake(t, rec, 5*time.Second, "the connection claims the backlog", wake.Backlog)
	rec.take()
	w.Clear()

	// Another dispatcher's ping, then three of the waker's own: as above, the third is sent
	// only once the second came back.
	if _, err := db.Pool.Exec(t.Context(), `SELECT pg_notify($1, 'another-1')`, wake.PingChannel); err != nil {
		t.Fatal(err)
	}
	waitForPings(t, p, 3, "the listener pings its idle connection")
	if e, c := errs.all(), connects.Load(); len(e) != 0 || c != 1 {
		t.Fatalf("errors %v, %d connects; want none and 1", e, c)
	}
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("pings counted as wake-ups: %v", got)
	}
	select {
	case <-w.C():
		t.Fatal("a ping woke the claiming loop")
	default:
	}

	// While a NOTIFY on the outbox channel still does.
	sendNotify(t, db)
	waitForWake(t, rec, 5*time.Second, "a NOTIFY after the pings", wake.Notify)
}

// TestPingThatCannotBeSentIsOnlyReported: a ping that could not be sent says nothing about
// the listening connection (the database is down, which the listener sees by itself, or the
// pool is busy): it is reported and tried again, and the connection is kept.
func TestPingThatCannotBeSentIsOnlyReported(t *testing.T) {
	t.Parallel()
	db := sqltest.New(t)
	var tries, connects atomic.Int64
	errs := &errorLog{}
	w := wake.New(wake.Config{
		Connect: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, db.URL) },
		Ping: func(context.Context, string, string) error {
			tries.Add(1)
			return errors.New("pool exhausted")
		},
		PollInterval: time.Hour,
		PingInterval: 100 * time.Millisecond,
		PingTimeout:  100 * time.Millisecond,
		OnError:      errs.add,
		OnConnect:    func() { connects.Add(1) },
	})
	w.Start(context.Background())
	t.Cleanup(w.Stop)

	waitUntil(t, 5*time.Second, "the listener connects", w.Connected)
	waitUntil(t, 5*time.Second, "three pings tried", func() bool { return tries.Load() >= 3 })
	for _, err := range errs.all() {
		if !strings.Contains(err.Error(), "sending a ping") || !strings.Contains(err.Error(), "pool exhausted") {
			t.Fatalf("error %q: want only failed pings reported", err)
		}
	}
	if !w.Connected() || connects.Load() != 1 {
		t.Fatalf("connected %t after %d connects: a ping that was not sent must not replace the connection", w.Connected(), connects.Load())
	}
}

// sendNotify sends a NOTIFY on the waker's channel from a connection of its own, as the
// insert trigger does.
func sendNotify(t *testing.T, db *sqltest.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := db.Pool.Exec(ctx, `SELECT pg_notify($1, '42')`, wake.Channel); err != nil {
		t.Fatal(err)
	}
}

// waitUntil polls cond until it holds, failing the test if it does not within d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitForWake waits for a wake-up from src among those rec collects, dropping the others.
func waitForWake(t *testing.T, rec *recorder, d time.Duration, what string, src wake.Source) {
	t.Helper()
	waitUntil(t, d, what, func() bool { return slices.Contains(rec.take(), src) })
}

// blackholeProxy forwards TCP connections to a target and can stop forwarding bytes in both
// directions without closing anything, as a network that drops every packet does: neither
// end gets an error, a FIN or a reset, only silence.
type blackholeProxy struct {
	ln     net.Listener
	target string
	host   string
	port   uint16
	done   chan struct{}
	wg     sync.WaitGroup

	mu    sync.Mutex
	open  chan struct{} // closed while bytes flow; replaced by an open channel while they do not
	conns map[net.Conn]struct{}
}

func newBlackholeProxy(t *testing.T, target string) *blackholeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	p := &blackholeProxy{
		ln: ln, target: target, host: addr.IP.String(), port: uint16(addr.Port),
		done: make(chan struct{}), open: make(chan struct{}), conns: map[net.Conn]struct{}{},
	}
	close(p.open)
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// blackhole stops (on) or resumes (off) forwarding. Bytes read while it is on are held and
// forwarded on resuming, as TCP retransmits them once the network is back.
func (p *blackholeProxy) blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		if on {
			p.open = make(chan struct{})
		}
	default:
		if !on {
			close(p.open)
		}
	}
}

// pass waits until bytes may flow; false when the proxy is closing.
func (p *blackholeProxy) pass() bool {
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	select {
	case <-open:
		return true
	case <-p.done:
		return false
	}
}

// track registers c for close; false (and c closed) when the proxy is already closing.
func (p *blackholeProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		c.Close()
		return false
	default:
		p.conns[c] = struct{}{}
		return true
	}
}

func (p *blackholeProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			return
		}
		p.wg.Go(func() {
			server, err := net.Dial("tcp", p.target)
			if err != nil {
				client.Close()
				return
			}
			if !p.track(server) {
				client.Close()
				return
			}
			var pair sync.WaitGroup
			pair.Go(func() { p.pipe(server, client) })
			pair.Go(func() { p.pipe(client, server) })
			pair.Wait()
		})
	}
}

// pipe copies src to dst, passing on an end of stream only when bytes flow too: a FIN is a
// packet that a dead network drops like any other.
func (p *blackholeProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.pass() {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *blackholeProxy) close() {
	p.mu.Lock()
	close(p.done)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
