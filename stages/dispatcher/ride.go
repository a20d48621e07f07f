package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/settle"
)

// Settles ride claims. Under live traffic every event costs a claim and a settle, each its
// own round trip to PostgreSQL; the round trip, not the statement, is most of what either
// costs the dispatcher (a write, a read, the wake-ups in between). So a settle whose outcomes
// are ready waits up to rideWait for the next claim and goes with it: both statements in one
// write, the claim first, each in a transaction of its own (a pipeline with a Sync after
// each). The claim's rows are handed on as soon as its own answer is read, without waiting
// for the settle, whose answer the settling stage reads; either may fail without undoing the
// other. When no claim comes (an idle dispatcher after its last event), the settle goes alone
// after rideWait: at most that much later than alone, while its rows stay leased and counted
// in flight.

// rideWait is how long a settle waits for a claim to share its round trip with. A variable
// only so that tests can lengthen it (SetRideWait in export_test.go).
var rideWait = 5 * time.Millisecond

// ride is one settle waiting for a claim: the claiming loop takes it (riding), sends it with
// its claim, and closes done; finish then reads the settle's answer (nil when it was not sent,
// with err saying why).
type ride struct {
	rows   []*delivery.Delivery
	finish func(ctx context.Context) (settle.Result, error)
	err    error
	done   chan struct{}
}

// errNotTaken is a ride's error when no claim took it within rideWait, or the claiming loop
// declined it.
var errNotTaken = errors.New("no claim to share a round trip with")

// settleRiding settles batch, sharing the next claim's round trip when one comes within
// rideWait (see the comment above); timer is the sink's own, reused for every batch.
func (d *Dispatcher) settleRiding(ctx context.Context, batch []*delivery.Delivery, timer *time.Timer) {
	rows, done := d.settleAnchored(ctx, batch)
	// A settle that moves an ordered stream whose next row waits is what wakes the claim for
	// that row (settled): it would wait for a claim that waits for it.
	if len(rows) > 0 && d.claiming.Load() && !(d.orderedWaiting.Load() && streamMoved(rows)) {
		r := &ride{rows: rows, done: make(chan struct{})}
		d.riding.Store(r)
		if d.waitsForSettle.Load() && d.riding.CompareAndSwap(r, nil) {
			// The claiming loop waits for capacity this settle may free (waitForSettles).
			res, err := d.settler.Settle(ctx, rows)
			d.settled(ctx, batch, rows, done, res, err)
			return
		}
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
		if r.finish != nil {
			res, err := r.finish(ctx)
			if err == nil {
				d.stats.SharedSettles.Add(1)
				d.settled(ctx, batch, rows, done, res, nil)
				return
			}
			if ctx.Err() == nil {
				d.log.Warn("settle sent with a claim failed; it goes again alone", zap.Error(err), zap.Int("rows", len(rows)))
			}
			res, err = d.settler.SettleRefused(ctx, rows, err)
			d.settled(ctx, batch, rows, done, res, err)
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

// waitForSettles is declineRide for the claiming loop's waits for freed capacity: until done is
// called, settles go on their own at once (they would wait for a claim that waits for them).
// Set before the ride is declined, as settleRiding reads it after offering one.
func (d *Dispatcher) waitForSettles() (done func()) {
	d.waitsForSettle.Store(true)
	d.declineRide()
	return func() { d.waitsForSettle.Store(false) }
}

// claim runs the claiming loop's claim, with the settle waiting to ride when there is one.
func (d *Dispatcher) claim(ctx context.Context, limit int, skip claim.Skip, arm bool, after claim.Cursor) (claim.Result, error) {
	r := d.riding.Load()
	if r != nil && !d.claimer.Shares(arm) {
		d.declineRide() // it would wait out rideWait for this claim, which cannot take it
	}
	if r == nil || !d.claimer.Shares(arm) || !d.riding.CompareAndSwap(r, nil) {
		return d.claimer.Claim(ctx, limit, skip, arm, after)
	}
	claimSQL, claimArgs, readClaim := d.claimer.Statement(limit, skip, arm, after)
	settleSQL, settleArgs, readSettle := d.settler.Statement(r.rows)
	pctx, pcancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, pcancel)
	p, err := sendPipelined(pctx, d.pool, statement{claimSQL, claimArgs}, statement{settleSQL, settleArgs})
	if err != nil {
		stop()
		pcancel()
		// Not sent, or not all of it: the settle goes alone (settleRiding; rows a partial
		// write did settle are reported stale), the claim now.
		r.err = err
		close(r.done)
		return d.claimer.Claim(ctx, limit, skip, arm, after)
	}
	res, err := readNext(p, readClaim)
	stop() // the settle's answer is the sink's to read: the claim loop's end must not cut it
	if err != nil {
		err = fmt.Errorf("claim: %w", err)
	}
	r.finish = func(sinkCtx context.Context) (settle.Result, error) {
		defer context.AfterFunc(sinkCtx, pcancel)() // the settling stage's end (cut short) still cuts it
		defer pcancel()
		defer p.close()
		return readNext(p, readSettle)
	}
	close(r.done)
	return res, err
}

// statement is one statement of a pipeline: its SQL and arguments.
type statement struct {
	sql  string
	args []any
}

// pipelined is a pipeline sent on a connection of the pool, whose answers are read in the
// order of its statements (readNext) before close gives the connection back.
type pipelined struct {
	conn  *pgxpool.Conn
	p     *pgconn.Pipeline
	stmts []statement
	// refused is set when PostgreSQL refused a statement: close then deallocates them, so
	// that one prepared before a schema change is prepared afresh next time.
	refused bool
}

// sendPipelined sends stmts in one write on one connection, each in a transaction of its own
// (a Sync after each), so that a statement's failure undoes only itself. Each statement is
// prepared on the connection once (named by a digest of its text); the arguments are encoded
// as pgx encodes them for Query.
func sendPipelined(ctx context.Context, pool *pgxpool.Pool, stmts ...statement) (*pipelined, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	c := conn.Conn()
	sds := make([]*pgconn.StatementDescription, len(stmts))
	builders := make([]pgx.ExtendedQueryBuilder, len(stmts))
	for i, s := range stmts {
		if sds[i], err = c.Prepare(ctx, s.sql, s.sql); err == nil {
			err = builders[i].Build(c.TypeMap(), sds[i], s.args)
		}
		if err != nil {
			conn.Release()
			return nil, err
		}
	}
	p := c.PgConn().StartPipeline(ctx)
	for i := range stmts {
		p.SendQueryStatement(sds[i], builders[i].ParamValues, builders[i].ParamFormats, builders[i].ResultFormats)
		p.SendPipelineSync()
	}
	if err := p.Flush(); err != nil {
		_ = p.Close()
		conn.Release()
		return nil, err
	}
	return &pipelined{conn: conn, p: p, stmts: stmts}, nil
}

// readNext reads the answer of the pipeline's next statement with read, and the Sync after it.
func readNext[T any](p *pipelined, read func(pgx.Rows) (T, error)) (T, error) {
	var zero T
	results, err := p.p.GetResults()
	if err != nil {
		p.noteRefusal(err)
		_, _ = p.p.GetResults() // its Sync
		return zero, err
	}
	rr, ok := results.(*pgconn.ResultReader)
	if !ok {
		return zero, fmt.Errorf("pipeline: a statement's answer was %T", results)
	}
	v, err := read(pgx.RowsFromResultReader(p.conn.Conn().TypeMap(), rr))
	p.noteRefusal(err)
	if _, syncErr := p.p.GetResults(); syncErr != nil {
		p.noteRefusal(syncErr)
		var pgErr *pgconn.PgError
		if errors.As(syncErr, &pgErr) {
			// Refused at its commit: the ReadyForQuery of this Sync follows the error.
			_, _ = p.p.GetResults()
		}
		if err == nil {
			err = syncErr
		}
	}
	return v, err
}

// noteRefusal records an error that PostgreSQL answered (see refused).
func (p *pipelined) noteRefusal(err error) {
	var pgErr *pgconn.PgError
	p.refused = p.refused || errors.As(err, &pgErr)
}

// close ends the pipeline, reading what is left of it, and gives the connection back.
func (p *pipelined) close() {
	if err := p.p.Close(); err == nil && p.refused {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for _, s := range p.stmts {
			_ = p.conn.Conn().Deallocate(ctx, s.sql)
		}
		cancel()
	}
	p.conn.Release()
}
