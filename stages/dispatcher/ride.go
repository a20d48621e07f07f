package dispatcher

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/settle"
)

// Settles ride claims. Under live traffic every event costs a claim and a settle, each its
// own round trip and commit to PostgreSQL; the round trip, not the statement, is most of
// what either costs the dispatcher (a write, a read, the wake-ups in between). So a settle
// whose outcomes are ready waits up to rideWait for the next claim and is sent with it, in
// one round trip and one implicit transaction (settle first, so that the claim sees what it
// released or moved). When no claim comes (an idle dispatcher after its last event), the
// settle goes on its own after rideWait: at most that much later than alone, while its rows
// stay leased and counted in flight.
//
// A shared round trip that fails undoes both statements; the settle is then sent on its own,
// with its row-by-row fallback, and the claim again alone.

// rideWait is how long a settle waits for a claim to share its round trip with.
const rideWait = 5 * time.Millisecond

// ride is one settle waiting for a claim: the claiming loop takes it (riding), sends it with
// its claim, and closes done; res and err are then the settle's.
type ride struct {
	rows []*delivery.Delivery
	res  settle.Result
	err  error
	done chan struct{}
}

// errNotTaken is a ride's error when no claim took it within rideWait.
var errNotTaken = errors.New("no claim within rideWait")

// settleRiding settles batch, sharing the next claim's round trip when one comes within
// rideWait (see the comment above); timer is the sink's own, reused for every batch.
func (d *Dispatcher) settleRiding(ctx context.Context, batch []*delivery.Delivery, timer *time.Timer) {
	rows, done := d.settleAnchored(ctx, batch)
	if len(rows) > 0 && d.claiming.Load() {
		r := &ride{rows: rows, done: make(chan struct{})}
		d.riding.Store(r)
		timer.Reset(rideWait)
		select {
		case <-r.done:
		case <-timer.C:
			if d.riding.CompareAndSwap(r, nil) {
				r.err = errNotTaken
			} else {
				<-r.done // taken meanwhile: its round trip is under way
			}
		}
		timer.Stop()
		if r.err == nil {
			d.stats.SharedSettles.Add(1)
			d.settled(ctx, batch, rows, done, r.res, nil)
			return
		}
	}
	res, err := d.settler.Settle(ctx, rows)
	d.settled(ctx, batch, rows, done, res, err)
}

// declineRide sends the settle waiting to ride, if any, on its own at once: the claiming loop is
// about to wait for freed capacity, which that settle may be what frees. Later settles wait
// for a claim again (rideWait at most).
func (d *Dispatcher) declineRide() {
	if r := d.riding.Swap(nil); r != nil {
		r.err = errNotTaken
		close(r.done)
	}
}

// claim runs the claiming loop's claim, with the settle waiting to ride when there is one.
func (d *Dispatcher) claim(ctx context.Context, limit int, skip claim.Skip, arm bool, after claim.Cursor) (claim.Result, error) {
	r := d.riding.Load()
	if r == nil || !d.claimer.Shares(arm) || !d.riding.CompareAndSwap(r, nil) {
		return d.claimer.Claim(ctx, limit, skip, arm, after)
	}
	var b pgx.Batch
	var res claim.Result
	d.settler.Queue(&b, r.rows, &r.res)
	d.claimer.Queue(&b, limit, skip, arm, after, &res)
	err := d.pool.SendBatch(ctx, &b).Close()
	if err != nil {
		// Both were undone: the settle goes again on its own (settleRiding), the claim now.
		if ctx.Err() == nil {
			d.log.Warn("settle and claim failed together; each goes again alone", zap.Error(err), zap.Int("rows", len(r.rows)))
		}
		r.res, r.err = settle.Result{}, err
		close(r.done)
		return d.claimer.Claim(ctx, limit, skip, arm, after)
	}
	close(r.done)
	return res, nil
}
