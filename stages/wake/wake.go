// Package wake tells the claiming loop when there may be work: a NOTIFY from the insert
// trigger (sent only while a dispatcher is armed), a timer set to the next row's due time (so
// retries fire on time without waiting for the poll; the dispatcher's looks after arming use
// the same timer), and a slow jittered poll as a backstop for anything missed while the
// listener was reconnecting.
//
// All of them feed one coalescing signal: a burst of wake-ups causes one claim.
package wake

import (
	"context"
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

// Config configures a Waker.
type Config struct {
	// Connect opens the listener's own connection (not from the pool: LISTEN holds it).
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// PollInterval is the backstop poll's period; each tick is jittered by ±10%.
	PollInterval time.Duration
	// ReconnectDelay is how long the listener waits after losing its connection; the
	// default is 500 ms, so a lost connection costs at most about a second of NOTIFYs.
	ReconnectDelay time.Duration
	// OnWake, if set, is called for every wake-up (before coalescing), for metrics.
	OnWake func(Source)
	// OnError, if set, is called with listener errors (connection lost, reconnect failed).
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

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool
}

// New returns a Waker; nothing runs until Start.
func New(cfg Config) *Waker {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 10 * time.Second
	}
	if cfg.ReconnectDelay <= 0 {
		cfg.ReconnectDelay = 500 * time.Millisecond
	}
	return &Waker{cfg: cfg, signal: pipeline.NewSignal(), due: make(chan dueAt, 1)}
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

// Connected reports whether the listener is currently listening.
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

type handler struct{ w *Waker }

func (h handler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	// The payload is the producer's transaction id (schema 3); anything else still wakes.
	xid, err := strconv.ParseUint(n.Payload, 10, 64)
	h.w.wake(Notify, xid, err == nil)
	return nil
}

// HandleBacklog runs after every (re)connect, once LISTEN is in place: anything inserted
// while the listener was away is claimed now rather than at the next poll.
func (h handler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.w.connected.Store(true)
	if h.w.cfg.OnConnect != nil {
		h.w.cfg.OnConnect()
	}
	h.w.Wake(Backlog)
	return nil
}

func (w *Waker) listen(ctx context.Context) {
	l := &pgxlisten.Listener{
		Connect: w.cfg.Connect,
		LogError: func(_ context.Context, err error) {
			w.connected.Store(false)
			if ctx.Err() == nil && w.cfg.OnError != nil {
				w.cfg.OnError(err)
			}
		},
		ReconnectDelay: w.cfg.ReconnectDelay,
	}
	l.Handle(Channel, handler{w})
	_ = l.Listen(ctx) // returns only when ctx ends
	w.connected.Store(false)
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
