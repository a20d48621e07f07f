package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
)

// Ordered delivery per stream (schema 6). The database decides which rows may go: a claim
// takes an ordered row only when it is its stream's head and within the hold-back horizon
// (claim.sql). The dispatcher's part is small: it tells each claim whether anything is
// ordered and where the horizon is, it keeps the horizon from the claims' readings, it marks
// the rows it sends with their order key (so that a retry keeps the stream's place) and their
// consumer's failure mode, and it claims again as soon as a stream can move on: when this
// instance settles an ordered row, or the horizon moves.

// orderingState is the claiming loop's: only it touches it.
type orderingState struct {
	horizon claim.Horizon
	set     claim.Ordering // what the claimer was last told
	wait    time.Duration  // the look again while the horizon waits for a producer to end
}

// holdbackLook bounds how soon and how late the claiming loop looks again while an older
// producer transaction holds the horizon back: at first soon (most producer transactions
// last a few milliseconds), then doubling.
const (
	minHoldbackLook = 2 * time.Millisecond
	maxHoldbackLook = 500 * time.Millisecond
)

// orders reports whether some consumer orders its streams: WEBHOOK_ORDERING=stream, or a
// managed endpoint with ordering 'stream'.
func (d *Dispatcher) orders() bool {
	return d.cfg.Ordering || d.endpoints.anyOrdered()
}

// beforeClaim tells the claimer what the next claim needs to know about ordering.
func (d *Dispatcher) beforeClaim(s *orderingState) {
	o := claim.Ordering{Default: d.cfg.Ordering, Routed: d.endpoints.any(), Confirmed: d.endpoints.confirmedAt()}
	// A cache not confirmed (after a change, until every transaction that could have made it
	// has ended: a long one can make that last) cannot say that nothing orders: such claims
	// take ordered rows with the head check, rather than leave them to others.
	if o.Active = d.orders() || o.Confirmed < 0; o.Active {
		o.Horizon = s.horizon.Safe()
	}
	if o != s.set {
		s.set = o
		d.claimer.SetOrdering(o)
	}
}

// afterClaim takes the claim's hold-back reading and sets the timer for the next look: at once
// when the horizon moved (rows it held back may go now), soon while a producer transaction
// that could still commit an older event is open. A claim whose own reading just before it
// found nothing open (claim.Result.HorizonNow) and that left no ordered row waiting calls for
// no other: it could send every ordered row it saw, and the rows it could not see arrive with
// their own wake-ups. That is the claim an event alone goes with.
func (d *Dispatcher) afterClaim(s *orderingState, res claim.Result) {
	if res.Horizon == "" {
		return
	}
	// Stored before streamMoved is read, as settle sets streamMoved before it reads this: a
	// head settled while this claim ran is seen by one side or the other (see settle).
	d.orderedWaiting.Store(res.OrderedWaiting)
	if res.OrderedWaiting && d.streamMoved.Load() {
		d.waker.DueIn(0)
	}
	moved, err := s.horizon.Observe(res.Horizon)
	if err != nil {
		d.log.Warn("ordered delivery: unreadable hold-back reading; ordered rows wait", zap.Error(err))
		return
	}
	if moved {
		s.wait = 0
	}
	switch {
	case moved && (res.OrderedWaiting || res.HorizonNow == 0):
		d.waker.DueIn(0)
	case s.horizon.Waiting():
		s.wait = min(max(2*s.wait, minHoldbackLook), maxHoldbackLook)
		d.waker.DueIn(s.wait)
	default:
		s.wait = 0
	}
}

// markOrdered sets the order key and failure mode of a row about to be sent or settled. A
// managed endpoint's ordered delivery has its key from routing; a row of WEBHOOK_URL or an
// endpoint_url under WEBHOOK_ORDERING=stream is ordered by its own id, which its retries then
// carry.
func (d *Dispatcher) markOrdered(del *delivery.Delivery) {
	switch {
	case del.EndpointID != "":
		if del.OrderKey != 0 {
			if m := d.endpoints.lookup(del.EndpointID); m != nil {
				del.StopStream = m.ep.OrderingFailure == "stop"
			}
		}
	case d.cfg.Ordering && del.StreamID != "": // (called after routing: no event is left to route)
		if del.OrderKey == 0 {
			del.OrderKey = del.ID
		}
		del.StopStream = d.cfg.OrderingStop
	}
}

// streamMoved reports whether settling batch lets an ordered stream go on (a head delivered
// or skipped), so that the claiming loop should claim again now rather than at its next
// wake-up.
func streamMoved(batch []*delivery.Delivery) bool {
	for _, del := range batch {
		o := del.Outcome
		if del.OrderKey == 0 || o.Stale || o.Unsettled {
			continue
		}
		if o.Kind == delivery.Delivered || o.Kind == delivery.Permanent && !del.StopStream {
			return true
		}
	}
	return false
}

// ensureStreamIndex asks for the index ordered delivery's head check uses, once an endpoint
// orders its streams (WEBHOOK_ORDERING=stream builds it at start): the schema does not have
// it, since producers would pay for it with ordering off. indexer builds it.
func (d *Dispatcher) ensureStreamIndex() {
	if d.streamIndex.Load() {
		return
	}
	select {
	case d.wantIndex <- struct{}{}:
	default: // asked already
	}
}

// indexer builds the stream index when asked, apart from the pipeline (CONCURRENTLY on a
// large outbox takes a while, and deliveries go on meanwhile; until it exists the head check
// is correct but reads the table). A failure (say, a role that does not own the table) is
// logged, and tried again at the next ask.
func (d *Dispatcher) indexer(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.wantIndex:
		}
		if d.streamIndex.Load() {
			continue
		}
		built, err := fluxsql.EnsureStreamIndex(ctx, d.pool)
		switch {
		case errors.Is(err, fluxsql.ErrStreamIndexOutdated):
			d.log.Warn("ordered delivery: the stream index could not be brought up to date; ordered claims use it as it is", zap.Error(err))
			d.streamIndex.Store(true)
		case err != nil && ctx.Err() == nil:
			d.log.Error("ordered delivery: the stream index could not be created; ordered claims read the table until it is", zap.Error(err))
		case err != nil:
		case built:
			d.log.Info("created the stream index ordered delivery needs", zap.String("index", "webhook_outbox_stream_idx"))
			d.streamIndex.Store(true)
		default:
			d.streamIndex.Store(true)
		}
	}
}

// errSequenceCache is checkOrderingIDs' refusal, named so that the caller can tell it from a
// failed query.
type errSequenceCache struct{ cache int64 }

func (e errSequenceCache) Error() string {
	return fmt.Sprintf("webhook_outbox's id sequence has CACHE %d: ordered delivery needs ids drawn one at a time, "+
		"since a session with cached ids inserts them after later ones commit, and a stream would go backwards; "+
		"run ALTER SEQUENCE webhook_outbox_id_seq CACHE 1 (as the table's owner)", e.cache)
}

// checkOrderingIDs checks what the hold-back assumes of the outbox's ids while something is
// ordered: a sequence cache of 1 (an errSequenceCache otherwise), and no ordered row keyed
// beyond the sequence's last value (an id a producer supplied itself, which waits until the
// sequence reaches it). The second is counted in the metric ordered_rows_beyond_sequence and
// logged, since such a row is otherwise silently stuck.
func (d *Dispatcher) checkOrderingIDs(ctx context.Context) error {
	ids, err := fluxsql.CheckOutboxIDs(ctx, d.pool)
	if err != nil {
		return err
	}
	d.metrics.beyondSequence.Set(float64(ids.BeyondSequence))
	if beyond := ids.BeyondSequence; beyond > 0 {
		d.log.Warn("ordered rows wait beyond the outbox's id sequence: an id supplied by a producer passes the hold-back only once the sequence reaches it; let the sequence draw ordered events' ids",
			zap.Int64("rows", beyond))
	}
	if ids.SequenceCache > 1 {
		return errSequenceCache{ids.SequenceCache}
	}
	return nil
}
