// Package wake tells the claiming loop when there may be work: a NOTIFY from the insert
// trigger (sent only while a dispatcher is armed), a timer set to the next row's due time (so
// retries fire on time without waiting for the poll; the dispatcher's looks after arming use
// the same timer), and a slow jittered poll as a backstop for anything missed while the
// listener was reconnecting.
//
// The listener (pgxlisten) checks its connection whenever it has heard nothing for a while,
// by sending a NOTIFY to itself over another connection and waiting for it to come back: a
// connection that died silently (packets dropped, the server gone without a FIN) would
// otherwise look connected, to /readyz too, while only the poll delivered.
//
// All of them feed one coalescing signal: a burst of wake-ups causes one claim.
package wake

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"

	"github.com/fluxora/fluxhook/pipeline"
)

// Channel is the NOTIFY channel the insert trigger uses.
const Channel = "webhook_outbox"

// PingChannel is the channel of the listener's liveness check: a Waker sends its pings there
// (through Config.Ping) and listens on it besides Channel. A ping is never a wake-up. Every
// dispatcher's listener hears every dispatcher's pings, and each one proves the connection
// that carried it alive as well as an own ping does.
const PingChannel = "webhook_outbox_ping"

// Source names why the claiming loop woke up (for metrics and logs).
type Source string

// The wake-up sources.
const (
	Notify  Source = "notify"
	Poll    Source = "poll"
	Timer   Source = "timer"
	Backlog Source = "backlog" // the listener (re)connected and may have missed NOTIFYs
	// Watch is a look the dispatcher takes after arming (WatchIn): one 100 ms after every
	// arming, then more for as long as a transaction that may have missed the NOTIFY switch
	// is still in progress. Counted apart from Timer so that an operator can tell a long
	// transaction elsewhere on the server (which keeps these coming, once a second for at most
	// a minute) from rows coming due.
	Watch Source = "watch"
)

// dueAt is one request for a timed wake-up: after wait, with src as its source.
type dueAt struct {
	wait time.Duration
	src  Source
}

// The defaults New puts in place of zero (or negative) durations in Config; why each is what
// it is is said on the field.
const (
	defaultPollInterval   = 10 * time.Second
	defaultReconnectDelay = 500 * time.Millisecond
	defaultConnectTimeout = 10 * time.Second
	defaultPingInterval   = 5 * time.Second
	defaultPingTimeout    = 2 * time.Second
)

// Config configures a Waker.
type Config struct {
	// Connect opens the listener's own connection (not from the pool: LISTEN holds it).
	// Forcing a reconnect cancels the context the listener waits under; pgconn's default
	// handling of a cancelled context (a deadline on the socket) ends that wait at once, even
	// on a dead network, so a connection should keep it.
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// ConnectTimeout bounds connecting and LISTEN together (default 10 s): on a network that
	// drops packets an attempt could otherwise hang for as long as TCP keeps retrying. An
	// attempt that runs out is reported to OnError and retried after ReconnectDelay.
	ConnectTimeout time.Duration
	// Ping sends a NOTIFY on channel with payload over a connection other than the
	// listener's (the dispatcher's pool: SELECT pg_notify($1, $2)). The listener uses it to
	// check, end to end, that notifications still reach it. Nil disables the check: a
	// connection that dies silently then counts as connected until TCP gives up on it.
	Ping func(ctx context.Context, channel, payload string) error
	// PingInterval is how long the listener may hear nothing, on either channel, before it
	// pings itself (default 5 s). Any notification proves the connection alive, so a busy
	// listener never pings.
	PingInterval time.Duration
	// PingTimeout bounds the Ping call, and then how long the ping may take to come back
	// (default 2 s; counted from the call's return, so that a slow pool does not pass for a
	// dead listener). A ping that was sent but did not come back means the listening
	// connection is dead: it is reported to OnError, Connected turns false at once, and the listener
	// reconnects at once (the Backlog wake-up that follows claims what it missed). A ping that
	// could not be sent (the database down, which the listener will see by itself) is only
	// reported, and tried again PingInterval later.
	PingTimeout time.Duration
	// PollInterval is the backstop poll's period (default 10 s); each tick is jittered by ±10%.
	PollInterval time.Duration
	// ReconnectDelay is how long the listener waits after losing its connection; the
	// default is 500 ms, so a lost connection costs at most about a second of NOTIFYs.
	ReconnectDelay time.Duration
	// OnWake, if set, is called for every wake-up (before coalescing), for metrics.
	OnWake func(Source)
	// OnError, if set, is called with listener errors (connection lost, reconnect failed,
	// a ping not sent or not come back).
	OnError func(error)
	// OnConnect, if set, is called each time the listener has (re)connected and is listening.
	OnConnect func()
}

// Waker is a service: Start it once, Stop it once (Stop is safe before Start and twice).
type Waker struct {
	cfg       Config
	signal    *pipeline.Signal
	due       chan dueAt
	connected atomic.Bool

	// pendingMu guards what the pending wake-up is made of: the transaction ids of NOTIFYs
	// received since the claiming loop last cleared it, and whether anything else (a timer,
	// the poll, a NOTIFY without an id) is part of it. DropSeen needs both.
	pendingMu    sync.Mutex
	pendingXids  []uint64
	pendingOther bool

	// live is what the listener's watchdog knows of the current connection; kick tells the
	// watchdog that it changed in a way that needs a new look (a connection opened or
	// listening).
	live struct {
		sync.Mutex
		listening int       // channels LISTENed on the current connection
		setupBy   time.Time // nonzero while a connection is open but not yet listening: its deadline
		heard     time.Time // the last proof of life: listening, or any notification since
		pingAt    time.Time // when the last ping on this connection was sent or tried
		awaiting  bool      // the ping sent at pingAt succeeded and has not been answered
		echoBy    time.Time // while awaiting: when the connection is presumed dead
		pings     uint64    // pings sent, to tell them apart
	}
	kick      chan struct{}
	pingToken string // this Waker's part of its pings' payloads

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool
}

// New returns a Waker; nothing runs until Start.
func New(cfg Config) *Waker {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = defaultPollInterval
	}
	if cfg.ReconnectDelay <= 0 {
		cfg.ReconnectDelay = defaultReconnectDelay
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = defaultConnectTimeout
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = defaultPingInterval
	}
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = defaultPingTimeout
	}
	return &Waker{
		cfg:       cfg,
		signal:    pipeline.NewSignal(),
		due:       make(chan dueAt, 1),
		kick:      make(chan struct{}, 1),
		pingToken: strconv.FormatUint(rand.Uint64(), 36),
	}
}

// C delivers coalesced wake-ups.
func (w *Waker) C() <-chan struct{} { return w.signal.C() }

// Clear drops a pending wake-up. The claiming loop calls it just before each claim: every
// wake-up is a request to claim after the moment it was sent, which a claim starting now
// satisfies. A NOTIFY reaches the listener only once its transaction is committed and
// visible, so the claim sees that row; without Clear, the NOTIFY of a row that the previous
// claim already took would cost one more, empty, claim.
func (w *Waker) Clear() {
	w.pendingMu.Lock()
	defer w.pendingMu.Unlock()
	w.pendingXids = w.pendingXids[:0]
	w.pendingOther = false
	w.signal.Clear()
}

// maxPendingXids bounds the ids kept for DropSeen; beyond it a wake-up is simply kept.
const maxPendingXids = 256

// DropSeen drops the pending wake-up if it consists only of NOTIFYs from transactions that
// seen reports as already seen: the claiming loop passes the snapshot of a claim that took
// every row it could see. Such NOTIFYs arrive during the claim, a little after their
// transaction committed, and without this each cost one more, empty, claim (measured: about
// one claim in ten under the bench's steady 1,000 events/s).
func (w *Waker) DropSeen(seen func(xid uint64) bool) {
	w.pendingMu.Lock()
	defer w.pendingMu.Unlock()
	w.pendingXids = slices.DeleteFunc(w.pendingXids, seen)
	if len(w.pendingXids) == 0 && !w.pendingOther {
		w.signal.Clear()
	}
}

// NotifiesOnly reports whether the wake-up last received from C was made only of NOTIFYs that
// carried their transaction id (none of a timer, the poll, a reconnect or Wake), until the next
// Clear. A claiming loop that already claims on a clock of its own waits on through those:
// their rows are found by its next claim anyway, while the others may ask for a claim now.
func (w *Waker) NotifiesOnly() bool {
	w.pendingMu.Lock()
	defer w.pendingMu.Unlock()
	return !w.pendingOther && len(w.pendingXids) > 0
}

// Connected reports whether the listener is currently listening. With Config.Ping set, a
// connection that died silently still counts until the liveness check finds it out: within
// PingInterval plus PingTimeout after the last notification (plus however long the Ping call
// itself took, at most another PingTimeout).
func (w *Waker) Connected() bool { return w.connected.Load() }

// DueIn arms the timer to wake the claiming loop after wait, replacing any later timer. The
// claiming loop calls it with the database's answer to "when is the next row due".
func (w *Waker) DueIn(wait time.Duration) { w.timeIn(dueAt{wait, Timer}) }

// WatchIn is DueIn for the dispatcher's looks after arming: the same single timer (the
// earliest request wins), reported as source Watch when it is the one that fires.
func (w *Waker) WatchIn(wait time.Duration) { w.timeIn(dueAt{wait, Watch}) }

func (w *Waker) timeIn(d dueAt) {
	for {
		select {
		case w.due <- d:
			return
		default:
		}
		// A pending value that was not yet consumed: keep the earlier of the two.
		select {
		case old := <-w.due:
			if old.wait < d.wait {
				d = old
			}
		default:
		}
	}
}

// Wake signals the claiming loop directly (used in-process, e.g. when capacity frees up).
func (w *Waker) Wake(src Source) {
	w.wake(src, 0, false)
}

// wake records a wake-up; a NOTIFY's transaction id, when it has one, is kept for DropSeen.
func (w *Waker) wake(src Source, xid uint64, hasXid bool) {
	if w.cfg.OnWake != nil {
		w.cfg.OnWake(src)
	}
	w.pendingMu.Lock()
	defer w.pendingMu.Unlock()
	if hasXid && len(w.pendingXids) < maxPendingXids {
		w.pendingXids = append(w.pendingXids, xid)
	} else {
		w.pendingOther = true
	}
	w.signal.Notify()
}

// Start launches the listener and the timer/poll loop.
func (w *Waker) Start(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done != nil || w.stopped {
		return
	}
	ctx, w.cancel = context.WithCancel(ctx)
	w.done = make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { w.listen(ctx) })
	wg.Go(func() { w.timers(ctx) })
	go func() {
		wg.Wait()
		close(w.done)
	}()
}

// Stop ends the listener and the timers and waits for them.
func (w *Waker) Stop() {
	w.mu.Lock()
	w.stopped = true
	cancel, done := w.cancel, w.done
	w.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// notified records a NOTIFY on Channel. Its payload is the producer's transaction id
// (schema 3); anything else still wakes.
func (w *Waker) notified(n *pgconn.Notification) {
	w.heard()
	xid, err := strconv.ParseUint(n.Payload, 10, 64)
	w.wake(Notify, xid, err == nil)
}

// outboxHandler hands NOTIFYs on Channel to the claiming loop.
type outboxHandler struct{ w *Waker }

func (h outboxHandler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	h.w.notified(n)
	return nil
}

func (h outboxHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.w.listeningOn()
	return nil
}

// pingHandler takes pings on PingChannel as proof of life, and as nothing else: a ping is not
// a wake-up.
type pingHandler struct{ w *Waker }

func (h pingHandler) HandleNotification(context.Context, *pgconn.Notification, *pgx.Conn) error {
	h.w.heard()
	return nil
}

func (h pingHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.w.listeningOn()
	return nil
}

// listenChannels is how many channels the listener LISTENs on: Channel and PingChannel.
const listenChannels = 2

// listen runs pgxlisten until ctx ends. pgxlisten reconnects by itself whenever its
// connection fails; the watchdog beside it finds the failures that nothing reports (a
// connection that stopped carrying anything, a LISTEN that never finishes) and forces the
// reconnect: Listen is cancelled, which makes it close its connection and return, and is
// started again at once.
func (w *Waker) listen(ctx context.Context) {
	l := &pgxlisten.Listener{
		Connect: w.connect,
		// Called with every error of a connection (connecting, LISTEN, waiting): the
		// handlers never fail, so each one means the connection is gone and pgxlisten will
		// reconnect after ReconnectDelay. lctx is the one Listen runs under: cancelled when
		// the Waker stops or the watchdog replaces the connection, which is no news.
		LogError: func(lctx context.Context, err error) {
			w.lost()
			if lctx.Err() == nil && w.cfg.OnError != nil {
				w.cfg.OnError(err)
			}
		},
		ReconnectDelay: w.cfg.ReconnectDelay,
	}
	l.Handle(Channel, outboxHandler{w})
	l.Handle(PingChannel, pingHandler{w})
	if w.cfg.Connect == nil { // w.connect would call it
		if w.cfg.OnError != nil {
			w.cfg.OnError(errors.New("listener: Config.Connect is nil: not listening"))
		}
		return
	}
	for {
		runCtx, cancel := context.WithCancel(ctx)
		var listenErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			listenErr = l.Listen(runCtx) // returns when runCtx ends, or at once if misconfigured
		}()
		replace := w.watch(runCtx, done)
		cancel()
		<-done
		w.lost()
		if ctx.Err() != nil {
			return
		}
		if !replace {
			// Listen gave up by itself, which pgxlisten does only when it cannot run at all:
			// retrying would not help.
			if w.cfg.OnError != nil {
				w.cfg.OnError(fmt.Errorf("listener: %w", listenErr))
			}
			return
		}
	}
}

// connect is pgxlisten's Connect: Config.Connect within ConnectTimeout. The LISTENs that
// follow are held to the same deadline by the watchdog.
func (w *Waker) connect(ctx context.Context) (*pgx.Conn, error) {
	setupBy := time.Now().Add(w.cfg.ConnectTimeout)
	ctx, cancel := context.WithDeadline(ctx, setupBy)
	defer cancel()
	conn, err := w.cfg.Connect(ctx)
	if err != nil {
		return nil, err
	}
	w.live.Lock()
	w.live.listening = 0
	w.live.setupBy = setupBy
	w.live.Unlock()
	w.poke()
	return conn, nil
}

// listeningOn runs once LISTEN is in place on one channel (pgxlisten calls HandleBacklog after
// each LISTEN). Once both are, the connection is listening: anything inserted while no
// connection was (before the first one, or while the last one was dead) sent its NOTIFY to
// nobody, so claim now rather than at the next poll.
func (w *Waker) listeningOn() {
	w.live.Lock()
	w.live.listening++
	if w.live.listening < listenChannels {
		w.live.Unlock()
		return
	}
	w.live.setupBy = time.Time{}
	w.live.heard = time.Now()
	w.live.pingAt = time.Time{}
	w.live.awaiting = false
	w.connected.Store(true)
	w.live.Unlock()
	w.poke()
	if w.cfg.OnConnect != nil {
		w.cfg.OnConnect()
	}
	w.Wake(Backlog)
}

// heard records a notification, on either channel: proof that the connection is alive, and
// the answer to a ping that awaits one (the watchdog then counts PingInterval from now).
func (w *Waker) heard() {
	w.live.Lock()
	w.live.heard = time.Now()
	answered := w.live.awaiting
	w.live.awaiting = false
	w.live.Unlock()
	if answered {
		w.poke()
	}
}

// lost records that the listener has no connection listening (anymore).
func (w *Waker) lost() {
	w.live.Lock()
	w.connected.Store(false)
	w.live.setupBy = time.Time{}
	w.live.awaiting = false
	w.live.Unlock()
}

// poke wakes the watchdog to look at the connection's state again.
func (w *Waker) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// watch is the watchdog of one run of pgxlisten's Listen: it returns true when the connection
// must be replaced (after reporting why), false when ctx ends or Listen returns.
func (w *Waker) watch(ctx context.Context, done <-chan struct{}) bool {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait, err := w.check(ctx)
		if err != nil {
			if w.cfg.OnError != nil {
				w.cfg.OnError(err)
			}
			return true
		}
		if wait > 0 {
			timer.Reset(wait)
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			return false
		case <-done:
			return false
		case <-w.kick:
		case <-timer.C:
		}
	}
}

// check looks at the connection, sending a ping when it is due. It returns an error when the
// connection must be replaced; otherwise how long until the next look (0: until poked).
func (w *Waker) check(ctx context.Context) (time.Duration, error) {
	for {
		now := time.Now()
		w.live.Lock()
		if !w.connected.Load() {
			setupBy := w.live.setupBy
			w.live.Unlock()
			switch {
			case setupBy.IsZero():
				return 0, nil // connecting (within ConnectTimeout) or waiting to
			case now.Before(setupBy):
				return setupBy.Sub(now), nil
			default:
				return 0, fmt.Errorf("listen on %q and %q: not in place within %s of connecting", Channel, PingChannel, w.cfg.ConnectTimeout)
			}
		}
		if w.cfg.Ping == nil {
			w.live.Unlock()
			return 0, nil
		}
		if w.live.awaiting {
			if !w.live.heard.Before(w.live.pingAt) {
				w.live.awaiting = false
			} else if now.Before(w.live.echoBy) {
				w.live.Unlock()
				return w.live.echoBy.Sub(now), nil
			} else {
				// Not ready from this moment, not only once the connection is replaced.
				w.connected.Store(false)
				w.live.awaiting = false
				w.live.Unlock()
				return 0, fmt.Errorf("liveness check: a ping (sent after %s without a notification) did not come back within %s: the listening connection is presumed dead, reconnecting",
					w.cfg.PingInterval, w.cfg.PingTimeout)
			}
		}
		// The next ping is due PingInterval after the last proof of life, or after the last
		// ping that could not be sent.
		idleSince := w.live.heard
		if w.live.pingAt.After(idleSince) {
			idleSince = w.live.pingAt
		}
		if pingBy := idleSince.Add(w.cfg.PingInterval); now.Before(pingBy) {
			w.live.Unlock()
			return pingBy.Sub(now), nil
		}
		w.live.pings++
		payload := w.pingToken + "-" + strconv.FormatUint(w.live.pings, 10)
		w.live.pingAt = now
		w.live.Unlock()

		if err := w.ping(ctx, payload); err != nil {
			if ctx.Err() != nil {
				return 0, nil
			}
			if w.cfg.OnError != nil {
				w.cfg.OnError(err)
			}
			continue
		}
		w.live.Lock()
		// Unless the connection was replaced meanwhile (which reset pingAt): a new connection
		// needs no proof of life yet.
		if w.live.pingAt.Equal(now) {
			w.live.awaiting = true
			w.live.echoBy = time.Now().Add(w.cfg.PingTimeout)
		}
		w.live.Unlock()
	}
}

// ping sends one ping through Config.Ping within PingTimeout.
func (w *Waker) ping(ctx context.Context, payload string) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.PingTimeout)
	defer cancel()
	if err := w.cfg.Ping(ctx, PingChannel, payload); err != nil {
		return fmt.Errorf("liveness check: sending a ping: %w", err)
	}
	return nil
}

func (w *Waker) timers(ctx context.Context) {
	poll := time.NewTimer(jitter(w.cfg.PollInterval))
	defer poll.Stop()
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	var next time.Time
	var nextSrc Source
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			poll.Reset(jitter(w.cfg.PollInterval))
			w.Wake(Poll)
		case d := <-w.due:
			at := time.Now().Add(d.wait)
			if next.IsZero() || at.Before(next) {
				next, nextSrc = at, d.src
				due.Reset(d.wait)
			}
		case <-due.C:
			next = time.Time{}
			w.Wake(nextSrc)
		}
	}
}

// jitter spreads polls of several instances by ±10% so they do not claim in lockstep.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
}
