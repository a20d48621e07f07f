package bench

// The idle and steady workloads: producer inserts on a schedule, latency to the consumer.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/bench/produce"
)

// sentEvent is one producer insert (package produce times every producer the same way).
type sentEvent = produce.Event

// producerModes maps --producer-mode to how pgx sends a query: the one list the flag is
// checked against and the connections are configured from.
var producerModes = map[string]pgx.QueryExecMode{
	"prepared": pgx.QueryExecModeCacheStatement, // pgx's default
	"exec":     pgx.QueryExecModeExec,
	"simple":   pgx.QueryExecModeSimpleProtocol,
}

func validProducerMode(mode string) bool {
	_, ok := producerModes[mode]
	return ok
}

// producerConns opens n producer connections as an application would have them. In mode
// "prepared", pgx's defaults (prepared statements), the insert prepared up front so that the
// first event does not pay for it; "exec" and "simple" send every insert to be planned afresh,
// as drivers without a statement cache do (the producers workload's --producer-mode: the
// trigger's share of an insert's cost differs between them).
func (b *bench) producerConns(ctx context.Context, n int, mode string) ([]*pgx.Conn, func(), error) {
	var conns []*pgx.Conn
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close(context.Background())
		}
	}
	cfg, err := pgx.ParseConfig(b.db.url)
	if err != nil {
		return nil, nil, err
	}
	cfg.RuntimeParams["application_name"] = "fluxhook-bench-producer"
	cfg.DefaultQueryExecMode = producerModes[mode]
	for range n {
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("connecting a producer: %w", err)
		}
		b.db.conns.Add(1)
		conns = append(conns, c)
		if mode != "prepared" {
			continue
		}
		b.db.stmts.Add(1) // preparing runs in a transaction of its own
		if _, err := c.Prepare(ctx, benchInsert, benchInsert); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("preparing the producer's insert: %w", err)
		}
	}
	return conns, closeAll, nil
}

// produceAtRate inserts total events with fluxhook's insert, one per period from a common
// schedule, from all conns (see produce.AtRate). With streams > 0 each event has a stream_id,
// one of streams in turn (see producerInsert).
func (b *bench) produceAtRate(ctx context.Context, conns []*pgx.Conn, period time.Duration, total int, eventType string, streams int) ([]sentEvent, error) {
	sent, attempted, err := produce.AtRate(ctx, conns, period, total, b.outboxInsert(eventType, streams))
	b.db.stmts.Add(int64(attempted))
	return sent, err
}

// outboxInsert is fluxhook's producer insert: one row of webhook_outbox, its own transaction.
func (b *bench) outboxInsert(eventType string, streams int) produce.Insert {
	return func(ctx context.Context, conn *pgx.Conn, seq int) ([16]byte, error) {
		var id pgtype.UUID
		insert, args := b.producerInsert(eventType, seq, streams)
		err := conn.QueryRow(ctx, insert, args...).Scan(&id)
		return id.Bytes, err
	}
}

// latencies measures each sent event against its first arrival.
func latencies(sent []sentEvent, arr []arrivalRecord) (fromScheduled, fromStart, fromCommit []time.Duration, lost, dups int) {
	first, _ := firstArrivals(arr)
	mine := make(map[[16]byte]struct{}, len(sent))
	for _, ev := range sent {
		if !ev.OK {
			continue
		}
		mine[ev.ID] = struct{}{}
		at, ok := first[ev.ID]
		if !ok {
			lost++
			continue
		}
		fromScheduled = append(fromScheduled, time.Duration(at-ev.Scheduled))
		fromStart = append(fromStart, time.Duration(at-ev.Start))
		fromCommit = append(fromCommit, time.Duration(at-ev.Commit))
	}
	seen := map[[16]byte]int{}
	for _, a := range arr {
		if _, ok := mine[a.id]; ok {
			seen[a.id]++
		}
	}
	for _, n := range seen {
		dups += n - 1
	}
	return fromScheduled, fromStart, fromCommit, lost, dups
}

// waitArmed waits until the dispatcher has gone idle and armed itself for a NOTIFY.
func (b *bench) waitArmed(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := b.db.queryInt64(ctx, `SELECT count(*) FROM webhook_dispatcher WHERE armed`)
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the dispatcher did not arm itself within 10 s")
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// idle: single events well apart, the dispatcher idle and armed between them.
func (b *bench) idle(ctx context.Context) (*latencyResult, error) {
	return b.latencyRun(ctx, "idle", b.opts.idleEvents, b.opts.idleInterval, 1, latencyOptions{})
}

// steady: a fixed rate from several connections for a while.
func (b *bench) steady(ctx context.Context, rate int) (*latencyResult, error) {
	return b.steadyRun(ctx, rate, latencyOptions{})
}

// steadyRun is steady at rate with opt (the River baseline's: opt.river).
func (b *bench) steadyRun(ctx context.Context, rate int, opt latencyOptions) (*latencyResult, error) {
	total := int(float64(rate) * b.opts.duration.Seconds())
	period := time.Duration(float64(time.Second) / float64(rate))
	return b.latencyRun(ctx, "steady", max(total, 1), period, b.opts.connections, opt)
}

// latencyOptions vary a latency run (the ordered workload's idle runs, the api workload's
// steady runs): the dispatcher's configuration overrides (see startSession), and streams > 0
// gives every event a stream_id, one of streams in turn (see producerInsert); the zero value
// is the idle and steady runs'.
type latencyOptions struct {
	overrides map[string]string
	streams   int
	// keepLog empties only the queue before the run (resetQueue), not the delivery log and
	// the dead letters (resetTables): the api workload's filled log stays.
	keepLog bool
	// ready, when set, runs once the dispatcher is ready, before the warm-up: the api
	// workload waits there for the API and warms it up.
	ready func(ctx context.Context, s *session) error
	// alongside, when set, starts with production, on a context cancelled if the run fails;
	// the function it returns is called when production has ended and waits for it. The api
	// workload's API clients run there.
	alongside func(ctx context.Context) (wait func() error)
	// river runs the River baseline (--baseline river) instead of fluxhook: its dispatcher
	// and its producer, in processes of their own; overrides, streams, keepLog and ready
	// do not apply.
	river bool
}

// latencyProducer is a latency run's producer: fluxhook's in this process, or a baseline's in
// its own. Both time their inserts with package produce.
type latencyProducer interface {
	// warmUp delivers one unmeasured event per connection through s and returns how many.
	warmUp(ctx context.Context, s *session) (int, error)
	// produce inserts total events of eventType, one per period.
	produce(ctx context.Context, period time.Duration, total int, eventType string) ([]sentEvent, error)
	// close ends the producer (its connections); safe to call twice.
	close()
}

// outboxProducer is fluxhook's producer: connections of the bench's own, inserting into
// webhook_outbox.
type outboxProducer struct {
	b          *bench
	conns      []*pgx.Conn
	closeConns func()
	streams    int
}

func (p *outboxProducer) warmUp(ctx context.Context, s *session) (int, error) {
	return p.b.warmUp(ctx, p.conns, s, p.streams)
}

func (p *outboxProducer) produce(ctx context.Context, period time.Duration, total int, eventType string) ([]sentEvent, error) {
	return p.b.produceAtRate(ctx, p.conns, period, total, eventType, p.streams)
}

func (p *outboxProducer) close() { p.closeConns() }

func (b *bench) latencyRun(ctx context.Context, name string, total int, period time.Duration, nconns int, opt latencyOptions) (*latencyResult, error) {
	reset := b.resetTables
	if opt.keepLog && !opt.river {
		reset = b.resetQueue
	}
	if err := reset(ctx); err != nil {
		return nil, err
	}
	var s *session
	var err error
	if opt.river {
		s, err = b.startRiverSession(ctx)
	} else {
		s, err = b.startSession(ctx, opt.overrides)
	}
	if err != nil {
		return nil, err
	}
	defer s.stop()
	if !opt.river {
		if err := b.waitArmed(ctx); err != nil {
			return nil, err
		}
	}
	if opt.ready != nil {
		if err := opt.ready(ctx, s); err != nil {
			return nil, err
		}
	}
	var p latencyProducer
	if opt.river {
		p, err = b.startRiverProducer(ctx, nconns, total, period, "bench."+name)
	} else {
		var conns []*pgx.Conn
		var closeConns func()
		conns, closeConns, err = b.producerConns(ctx, nconns, "prepared")
		p = &outboxProducer{b: b, conns: conns, closeConns: closeConns, streams: opt.streams}
	}
	if err != nil {
		return nil, err
	}
	defer p.close()
	warm, err := p.warmUp(ctx, s)
	if err != nil {
		return nil, err
	}
	s.startClock()
	started := time.Now()
	var waitAlongside func() error
	if opt.alongside != nil {
		alongsideCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		waitAlongside = opt.alongside(alongsideCtx)
	}
	sent, err := p.produce(ctx, period, total, "bench."+name)
	if err != nil {
		return nil, err
	}
	produced := time.Now()
	if waitAlongside != nil {
		if err := waitAlongside(); err != nil {
			return nil, err
		}
	}
	p.close()
	arr, st, err := b.collect(ctx, warm+total, 30*time.Second, s.disp, s)
	if err != nil {
		return nil, err
	}
	r := &latencyResult{
		Events: total, Connections: nconns, Rejected: st.Rejected,
		RatePerSecond: float64(time.Second) / float64(period),
		Seconds:       produced.Sub(started).Seconds(),
	}
	fromSched, fromStart, fromCommit, lost, dups := latencies(sent, arr)
	r.Lost, r.Duplicates = lost, dups
	r.FromScheduled, r.fromScheduled = summarize(fromSched), fromSched
	r.FromStart = summarize(fromStart)
	r.FromCommit, r.fromCommit = summarize(fromCommit), fromCommit
	var insert, late []time.Duration
	for _, ev := range sent {
		if ev.OK {
			insert = append(insert, time.Duration(ev.Commit-ev.Start))
			late = append(late, time.Duration(max(ev.Start-ev.Scheduled, 0)))
		}
	}
	r.Insert, r.Lateness = summarize(insert), summarize(late)
	r.BacklogAtEnd, r.BacklogMax = backlogOverTime(sent, arr)
	if r.Cost, err = s.cost(ctx, total-lost); err != nil {
		return nil, err
	}
	b.logf("  p50 %.2f ms, p99 %.2f ms from the scheduled insert start (%.2f, %.2f from the actual start); lost %d",
		r.FromScheduled.P50, r.FromScheduled.P99, r.FromStart.P50, r.FromStart.P99, lost)
	return r, nil
}

// warmUp delivers one event from each producer connection, unmeasured, and returns how many
// it sent. Without it the first events of a run paid for every process's first time through
// the path: the producers' backends loading the table and compiling the trigger, the
// dispatcher's pool opening connections and planning, the HTTP connections to the consumer;
// the first few dozen events of a steady run arrived 10–23 ms after their commit, a third of
// its p99. A deployment's connections are warm; the workloads measure that state. With
// streams > 0 the warm-up events have stream_ids as the measured ones do (see producerInsert).
func (b *bench) warmUp(ctx context.Context, conns []*pgx.Conn, s *session, streams int) (int, error) {
	for i, c := range conns {
		var id pgtype.UUID
		insert, args := b.producerInsert("bench.warmup", -1-i, streams)
		if err := c.QueryRow(ctx, insert, args...).Scan(&id); err != nil {
			return 0, fmt.Errorf("warming up a producer: %w", err)
		}
	}
	b.db.stmts.Add(int64(len(conns)))
	if _, err := b.consumer.waitReceived(ctx, len(conns), 10*time.Second, s.disp); err != nil {
		return 0, fmt.Errorf("warming up: %w", err)
	}
	// Measure from the idle, armed state, as the workloads are meant to start.
	if err := b.waitArmed(ctx); err != nil {
		return 0, err
	}
	return len(conns), nil
}

// backlogOverTime counts committed-but-not-yet-arrived events when production ended, and the
// most at any commit or arrival during the run.
func backlogOverTime(sent []sentEvent, arr []arrivalRecord) (atEnd, maxSeen int) {
	first, _ := firstArrivals(arr)
	type edge struct {
		t     int64
		delta int
	}
	var edges []edge
	var endOfProduction int64
	for _, ev := range sent {
		if !ev.OK {
			continue
		}
		endOfProduction = max(endOfProduction, ev.Commit)
		edges = append(edges, edge{ev.Commit, +1})
		if at, ok := first[ev.ID]; ok {
			edges = append(edges, edge{max(at, ev.Commit), -1})
		}
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if a.t != b.t {
			return int(a.t - b.t)
		}
		return a.delta - b.delta // arrivals first at the same instant
	})
	n := 0
	for _, e := range edges {
		n += e.delta
		maxSeen = max(maxSeen, n)
		if e.t <= endOfProduction {
			atEnd = n
		}
	}
	return atEnd, maxSeen
}
