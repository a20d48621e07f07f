package bench

// The ordered workload: ordered delivery per stream (schema 6, WEBHOOK_ORDERING=stream) against
// the same work unordered, on the same run. --ordered-streams × --ordered-events-per-stream
// events with stream_ids, prefilled interleaved (every stream's first event, then every
// stream's second, ...), are drained once with ordering off and once with
// WEBHOOK_ORDERING=stream; each drain's arrivals are checked against its streams' id order.
// Then single events with stream_ids, --idle-interval apart, show what ordering adds to an idle
// dispatcher's latency, again once off and once on.

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
)

// orderedEventType is the type of the ordered workload's prefilled events.
const orderedEventType = "bench.ordered"

// orderedIdleStreams is how many stream_ids the ordered workload's idle events go to in turn.
const orderedIdleStreams = 100

// benchStreamInsert is the producer's statement for an event with a stream_id ($3).
const benchStreamInsert = benchMark + `INSERT INTO webhook_outbox (event_type, payload, stream_id) VALUES ($1, $2::jsonb, $3) RETURNING delivery_id`

// producerInsert is a producer's statement and its arguments for event seq: benchInsert, or
// with streams > 0 benchStreamInsert with stream_id number seq mod streams.
func (b *bench) producerInsert(eventType string, seq, streams int) (string, []any) {
	if streams <= 0 {
		return benchInsert, []any{eventType, b.payload(seq)}
	}
	return benchStreamInsert, []any{eventType, b.payload(seq), benchStreamID((seq%streams + streams) % streams)}
}

// benchStreamID names stream i.
func benchStreamID(i int) string { return "stream-" + strconv.Itoa(i) }

// orderingOverrides is the dispatcher's configuration for a run with ordering on or off
// (whatever WEBHOOK_ORDERING the environment passed on).
func orderingOverrides(on bool) map[string]string {
	if on {
		return map[string]string{"WEBHOOK_ORDERING": "stream"}
	}
	return map[string]string{"WEBHOOK_ORDERING": "none"}
}

type orderedResult struct {
	Streams         int `json:"streams"`
	EventsPerStream int `json:"events_per_stream"`
	Events          int `json:"events"`
	// Unordered and Ordered are the two drains of the same prefill, ordering off (the
	// default) and WEBHOOK_ORDERING=stream.
	Unordered *orderedDrain `json:"unordered"`
	Ordered   *orderedDrain `json:"ordered"`
	// RatePercent is the ordered drain's events/s as a share of the unordered drain's, in
	// percent (the budget: ≥ 50); 0 when either drain had no arrival.
	RatePercent float64 `json:"ordered_rate_percent_of_unordered"`
	// The idle runs: --idle-events single events --idle-interval apart, each with one of
	// IdleStreams stream_ids in turn, ordering off and on.
	IdleStreams   int            `json:"idle_streams"`
	IdleUnordered *latencyResult `json:"idle_unordered"`
	IdleOrdered   *latencyResult `json:"idle_ordered"`
	// IdleP50DeltaMS is the ordered idle run's insert start → arrival p50 minus the unordered
	// one's (the budget: ≤ 1 ms).
	IdleP50DeltaMS float64 `json:"idle_p50_delta_ms"`
}

// orderedDrain is one drain of the ordered workload, with how well its streams kept their
// order.
type orderedDrain struct {
	drainResult
	// Violations counts the events whose first arrival came before the first arrival of an
	// earlier (smaller id) event of their stream; StreamsOutOfOrder the streams with any.
	// Judged on the ordered drain (0); the unordered drain's show what the check catches.
	Violations        int `json:"order_violations"`
	StreamsOutOfOrder int `json:"streams_out_of_order"`
}

// ordered: the same interleaved backlog drained unordered, then ordered; then the idle
// latency unordered, then ordered.
func (b *bench) ordered(ctx context.Context) (*orderedResult, error) {
	r := &orderedResult{Streams: b.opts.orderedStreams, EventsPerStream: b.opts.orderedPerStream, IdleStreams: orderedIdleStreams}
	r.Events = r.Streams * r.EventsPerStream
	var err error
	// The dispatcher with WEBHOOK_ORDERING=stream builds the stream index; the unordered runs,
	// and the workloads after this one, run without it, as an installation that orders
	// nothing does.
	dropIndex := func() error { return b.db.exec(ctx, `DROP INDEX IF EXISTS webhook_outbox_stream_idx`) }
	defer func() { _ = b.db.exec(context.WithoutCancel(ctx), `DROP INDEX IF EXISTS webhook_outbox_stream_idx`) }()
	if err := dropIndex(); err != nil {
		return nil, err
	}
	b.logf("  unordered drain")
	if r.Unordered, err = b.orderedDrain(ctx, false); err != nil {
		return nil, fmt.Errorf("unordered drain: %w", err)
	}
	b.logf("  ordered drain (WEBHOOK_ORDERING=stream)")
	if r.Ordered, err = b.orderedDrain(ctx, true); err != nil {
		return nil, fmt.Errorf("ordered drain: %w", err)
	}
	if u, o := r.Unordered.EventsPerSecond, r.Ordered.EventsPerSecond; u > 0 && o > 0 {
		r.RatePercent = 100 * o / u
	}
	idle := func(on bool) (*latencyResult, error) {
		return b.latencyRun(ctx, "ordered.idle", b.opts.idleEvents, b.opts.idleInterval, 1,
			latencyOptions{overrides: orderingOverrides(on), streams: orderedIdleStreams})
	}
	if err := dropIndex(); err != nil {
		return nil, err
	}
	b.logf("  idle, unordered")
	if r.IdleUnordered, err = idle(false); err != nil {
		return nil, fmt.Errorf("idle, unordered: %w", err)
	}
	b.logf("  idle, ordered (WEBHOOK_ORDERING=stream)")
	if r.IdleOrdered, err = idle(true); err != nil {
		return nil, fmt.Errorf("idle, ordered: %w", err)
	}
	r.IdleP50DeltaMS = r.IdleOrdered.FromStart.P50 - r.IdleUnordered.FromStart.P50
	b.logf("  ordered drain at %.0f%% of the unordered one's events/s; idle p50 %+.2f ms with ordering", r.RatePercent, r.IdleP50DeltaMS)
	return r, nil
}

// orderedDrain empties the tables, prefills the interleaved streams with the dispatcher
// stopped, starts it with ordering on or off, times until the consumer has every event, and
// checks the arrivals against each stream's order.
func (b *bench) orderedDrain(ctx context.Context, on bool) (*orderedDrain, error) {
	n := b.opts.orderedStreams * b.opts.orderedPerStream
	if err := b.resetTables(ctx); err != nil {
		return nil, err
	}
	if err := b.prefillStreams(ctx, b.opts.orderedStreams, b.opts.orderedPerStream); err != nil {
		return nil, err
	}
	s, err := b.startSession(ctx, orderingOverrides(on))
	if err != nil {
		return nil, err
	}
	defer s.stop()
	arr, st, err := b.collect(ctx, n, drainTimeout(n), s.disp, s)
	if err != nil {
		return nil, err
	}
	first, dups := firstArrivals(arr)
	times := sortedFirstTimes(arr)
	r := &orderedDrain{drainResult: drainResult{Events: n, Duplicates: dups, Rejected: st.Rejected}}
	r.Seconds, r.EventsPerSecond, r.StartupMS, r.SteadyEventsPerSecond = drainRates(s.disp.started.UnixNano(), times)
	if r.Cost, err = s.cost(ctx, len(times)); err != nil {
		return nil, err
	}
	// Read after the dispatcher stopped (cost stops it): every row is still in the outbox, as
	// a processed row.
	events, err := b.streamEvents(ctx)
	if err != nil {
		return nil, err
	}
	if len(events) != n {
		return nil, fmt.Errorf("%d events with a stream_id after the run, want %d", len(events), n)
	}
	for _, ev := range events {
		if _, ok := first[ev.id]; ok {
			r.Received++
		}
	}
	r.Lost = n - r.Received
	r.Violations, r.StreamsOutOfOrder = orderViolations(events, first)
	b.logf("  %d events in %.2f s: %.0f events/s; %d arrived before an earlier event of their stream (%d streams)",
		r.Received, r.Seconds, r.EventsPerSecond, r.Violations, r.StreamsOutOfOrder)
	return r, nil
}

// prefillStreams prefills streams × perStream events (see copyPrefill), interleaved: event 0
// of every stream, then event 1 of every stream, ...
func (b *bench) prefillStreams(ctx context.Context, streams, perStream int) error {
	ids := make([]string, streams)
	for i := range ids {
		ids[i] = benchStreamID(i)
	}
	payloads := make([][]byte, perStream)
	for seq := range payloads {
		payloads[seq] = b.payload(seq)
	}
	what := fmt.Sprintf(", %d streams × %d interleaved,", streams, perStream)
	return b.copyPrefill(ctx, streams*perStream, what, []string{"stream_id", "event_type", "payload"}, func(i int) []any {
		seq, stream := i/streams, i%streams
		return []any{ids[stream], orderedEventType, payloads[seq]}
	})
}

// streamEvent is an event with a stream_id: its delivery id, its stream and its place there
// (the outbox id of its first attempt; a retry is a new row with the same delivery id).
type streamEvent struct {
	id     [16]byte
	stream string
	key    int64
}

// streamEvents reads the events with a stream_id from the outbox.
func (b *bench) streamEvents(ctx context.Context) ([]streamEvent, error) {
	conn, err := b.db.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	b.db.stmts.Add(1)
	rows, err := conn.Query(ctx, benchMark+`SELECT delivery_id::text, stream_id, min(id) FROM webhook_deliveries
		WHERE stream_id IS NOT NULL AND endpoint_id IS NULL GROUP BY delivery_id, stream_id`)
	if err != nil {
		return nil, fmt.Errorf("reading the events' streams: %w", err)
	}
	defer rows.Close()
	var events []streamEvent
	for rows.Next() {
		var text string
		var ev streamEvent
		if err := rows.Scan(&text, &ev.stream, &ev.key); err != nil {
			return nil, err
		}
		var ok bool
		if ev.id, ok = parseUUID(text); !ok {
			return nil, fmt.Errorf("event delivery id %q is not a UUID", text)
		}
		events = append(events, ev)
	}
	return events, rows.Err()
}

// orderViolations counts the events whose first arrival came before the first arrival of an
// earlier event of their stream, and the streams with any. Events that did not arrive count
// as lost, not here.
func orderViolations(events []streamEvent, first map[[16]byte]int64) (violations, streams int) {
	sorted := slices.Clone(events)
	slices.SortFunc(sorted, func(a, b streamEvent) int {
		return cmp.Or(cmp.Compare(a.stream, b.stream), cmp.Compare(a.key, b.key))
	})
	var latest int64 // the latest first arrival of the stream's events so far
	outOfOrder := false
	for k, ev := range sorted {
		if k == 0 || ev.stream != sorted[k-1].stream {
			latest, outOfOrder = math.MinInt64, false
		}
		at, ok := first[ev.id]
		if !ok {
			continue
		}
		if at < latest {
			violations++
			if !outOfOrder {
				streams++
				outOfOrder = true
			}
			continue
		}
		latest = at
	}
	return violations, streams
}

// The names of the ordered workload's checks.
const (
	orderedOrderCheck = "ordered drain: events before an earlier event of their stream"
	orderedLostCheck  = "lost (both drains and both idle runs)"
	orderedIdleCheck  = "idle: insert start → arrival p50, ordered − unordered"
	orderedRateBudget = 50
	orderedIdleBudget = 1.0
)

// perBatchCheckFunc checks a cost report's per-batch figures (see benchReport.check).
type perBatchCheckFunc func(workload string, c *costReport)

func (o *orderedResult) rateCheck() string {
	return fmt.Sprintf("%d streams × %d events drained ordered, events/s vs unordered", o.Streams, o.EventsPerStream)
}

func (o *orderedResult) check(add addCheckFunc, notComputed notComputedCheckFunc, perBatch perBatchCheckFunc) {
	u, d := o.Unordered, o.Ordered
	if u == nil || d == nil || u.Received == 0 || d.Received == 0 || u.Seconds <= 0 || d.Seconds <= 0 {
		notComputed("ordered", o.rateCheck(), nil, "%", "≥ 50", "no event arrived in one of the drains")
	} else {
		add("ordered", o.rateCheck(), o.RatePercent, "%", "≥ 50", o.RatePercent >= orderedRateBudget)
	}
	switch {
	case d == nil || d.Received == 0:
		notComputed("ordered", orderedOrderCheck, nil, "", "0", "no event arrived in the ordered drain")
	default:
		add("ordered", orderedOrderCheck, float64(d.Violations), "", "0", d.Violations == 0)
	}
	lost, rejected := 0, 0
	for _, r := range []*orderedDrain{u, d} {
		if r != nil {
			lost, rejected = lost+r.Lost, rejected+r.Rejected
		}
	}
	for _, r := range []*latencyResult{o.IdleUnordered, o.IdleOrdered} {
		if r != nil {
			lost, rejected = lost+r.Lost, rejected+r.Rejected
		}
	}
	add("ordered", orderedLostCheck, float64(lost), "", "0", lost == 0 && rejected == 0)
	switch off, on := o.IdleUnordered, o.IdleOrdered; {
	case off == nil || on == nil || off.FromStart.N == 0 || on.FromStart.N == 0:
		notComputed("ordered", orderedIdleCheck, nil, "ms", "≤ 1", "no event arrived in one of the idle runs")
	default:
		add("ordered", orderedIdleCheck, o.IdleP50DeltaMS, "ms", "≤ 1", o.IdleP50DeltaMS <= orderedIdleBudget)
	}
	var cost *costReport
	if d != nil {
		cost = d.Cost
	}
	perBatch("ordered", cost)
}

// writeRows prints the workload's rows of the results table.
func (o *orderedResult) writeRows(tw io.Writer, spacing time.Duration, verdict func(workload, what string) string) {
	u, d := o.Unordered, o.Ordered
	if u == nil || d == nil {
		return
	}
	fmt.Fprintf(tw, "ordered\t%s streams × %d events prefilled with COPY (interleaved), drained with WEBHOOK_ORDERING=stream\t%s events/s (%.2f s)\t\n",
		num(float64(o.Streams), 0), o.EventsPerStream, num(d.EventsPerSecond, 0), d.Seconds)
	fmt.Fprintf(tw, "\t  the same drained unordered (ordering off), this run\t%s events/s (%.2f s)\t\n", num(u.EventsPerSecond, 0), u.Seconds)
	fmt.Fprintf(tw, "\t  ordered events/s, share of the unordered drain's\t%s%%\t%s\n", num(o.RatePercent, 0), verdict("ordered", o.rateCheck()))
	fmt.Fprintf(tw, "\t  start → first arrival; rate after it: ordered; unordered\t%.0f ms, %s events/s; %.0f ms, %s events/s\t\n",
		d.StartupMS, num(d.SteadyEventsPerSecond, 0), u.StartupMS, num(u.SteadyEventsPerSecond, 0))
	fmt.Fprintf(tw, "\t  events before an earlier event of their stream (streams): ordered; unordered, not judged\t%s (%s); %s (%s)\t%s\n",
		num(float64(d.Violations), 0), num(float64(d.StreamsOutOfOrder), 0), num(float64(u.Violations), 0), num(float64(u.StreamsOutOfOrder), 0),
		verdict("ordered", orderedOrderCheck))
	idleOff, idleOn := o.IdleUnordered, o.IdleOrdered
	lost := fmt.Sprintf("%d, %d, %d; %d, %d, %d", d.Lost, d.Duplicates, d.Rejected, u.Lost, u.Duplicates, u.Rejected)
	if idleOff == nil || idleOn == nil {
		fmt.Fprintf(tw, "\t  lost, duplicates, rejected: ordered drain; unordered drain\t%s\t%s\n", lost, verdict("ordered", orderedLostCheck))
		return
	}
	fmt.Fprintf(tw, "\t  idle: %d events %s apart (%d streams), insert start → arrival p50: ordered; unordered\t%s; %s ms\t\n",
		idleOn.Events, spacing, o.IdleStreams, ms(idleOn.FromStart.P50), ms(idleOff.FromStart.P50))
	fmt.Fprintf(tw, "\t  idle: p50 ordered − unordered\t%s ms\t%s\n", ms(o.IdleP50DeltaMS), verdict("ordered", orderedIdleCheck))
	fmt.Fprintf(tw, "\t  idle: p99: ordered; unordered\t%s; %s ms\t\n", ms(idleOn.FromStart.P99), ms(idleOff.FromStart.P99))
	lost += fmt.Sprintf("; %d, %d, %d; %d, %d, %d", idleOn.Lost, idleOn.Duplicates, idleOn.Rejected, idleOff.Lost, idleOff.Duplicates, idleOff.Rejected)
	fmt.Fprintf(tw, "\t  lost, duplicates, rejected: ordered drain; unordered drain; ordered idle; unordered idle\t%s\t%s\n", lost, verdict("ordered", orderedLostCheck))
}

// namedCost is a row of the cost table.
type namedCost struct {
	name string
	cost *costReport
}

// costs are the workload's rows of the cost table: per event of each run.
func (o *orderedResult) costs() []namedCost {
	var rows []namedCost
	if o.Ordered != nil {
		rows = append(rows, namedCost{"ordered", o.Ordered.Cost})
	}
	if o.Unordered != nil {
		rows = append(rows, namedCost{"ordered: off", o.Unordered.Cost})
	}
	if o.IdleOrdered != nil {
		rows = append(rows, namedCost{"ordered idle", o.IdleOrdered.Cost})
	}
	if o.IdleUnordered != nil {
		rows = append(rows, namedCost{"ordered idle: off", o.IdleUnordered.Cost})
	}
	return rows
}
