package bench

// The fanout workload: managed endpoints (schema 5). Every event goes to --fanout-endpoints
// endpoints, each a path of the bench's consumer with a secret of its own; the dispatcher
// routes each claimed batch of events in memory (or, when it cannot, in one statement:
// stages/claim/route.sql) and signs each (event, endpoint) delivery with that endpoint's
// secret, which the consumer verifies per path.

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/fluxora/fluxhook/sql/endpoints"
)

// fanoutEventType is the type of the fanout workload's events (the endpoints take every type).
const fanoutEventType = "bench.fanout"

type fanoutResult struct {
	Endpoints int `json:"endpoints"`
	Events    int `json:"events"`
	// Deliveries is what should arrive: one per (event, endpoint), events × endpoints.
	Deliveries int `json:"deliveries"`
	// Received counts the distinct (event, endpoint) deliveries that arrived on their
	// endpoint's path, verified with that endpoint's secret.
	Received   int `json:"received"`
	Lost       int `json:"lost"`
	Duplicates int `json:"duplicates"`
	// Rejected counts requests that failed verification: signed with another secret than
	// their path's endpoint's, or malformed.
	Rejected int `json:"rejected"`
	// Unexpected counts verified arrivals that are no expected delivery: on /hook (the
	// dispatcher runs without WEBHOOK_URL here), or for an event that was not enqueued.
	Unexpected                int           `json:"unexpected"`
	Seconds                   float64       `json:"seconds"`
	DeliveriesPerSecond       float64       `json:"deliveries_per_sec"`
	StartupMS                 float64       `json:"startup_ms"`
	SteadyDeliveriesPerSecond float64       `json:"deliveries_per_sec_after_first"`
	Routing                   fanoutRouting `json:"routing"`
	// Cost is per delivery.
	Cost *costReport       `json:"cost"`
	Idle *fanoutIdleResult `json:"idle"`
}

// fanoutRouting is how the prefilled events were routed.
type fanoutRouting struct {
	// From the event rows after the run: the claims that took events (their distinct lease
	// tokens), the routing transactions that fanned them out (their distinct routed_at) and
	// the events routed.
	BatchesWithEvents   int64 `json:"claimed_batches_with_events"`
	RoutingTransactions int64 `json:"routing_transactions"`
	EventsRouted        int64 `json:"events_routed"`
	// From pg_stat_statements over the dispatcher's life (null without it): calls of the claim
	// statement (empty claims included) and of the routing statement, and the latter per
	// claimed batch with events (the budget: at most 1; 0 when every event was routed in
	// memory, its fan-out written by the settles).
	ClaimStatements         *int64   `json:"claim_statements"`
	RouteStatements         *int64   `json:"route_statements"`
	RouteStatementsPerBatch *float64 `json:"route_statements_per_batch_with_events"`
	// Unavailable says why the pg_stat_statements numbers are null.
	Unavailable string `json:"unavailable,omitempty"`
}

// fanoutIdleResult is the latency of single events, well apart, fanned out: from each insert's
// start to each of its deliveries' arrival.
type fanoutIdleResult struct {
	Events     int     `json:"events"`
	Deliveries int     `json:"deliveries"`
	IntervalMS float64 `json:"interval_ms"`
	// PerDelivery is insert start → arrival of each (event, endpoint) delivery (the budget's
	// p50); LastDelivery insert start → the event's last endpoint's arrival (events whose every
	// delivery arrived); FromCommit commit → each delivery's arrival.
	PerDelivery  percentiles `json:"latency_per_delivery_from_insert_start"`
	LastDelivery percentiles `json:"latency_to_last_endpoint_from_insert_start"`
	FromCommit   percentiles `json:"latency_per_delivery_from_commit"`
	Insert       percentiles `json:"insert"`
	Lost         int         `json:"lost"`
	Duplicates   int         `json:"duplicates"`
	Rejected     int         `json:"rejected"`
	Unexpected   int         `json:"unexpected"`
	// Cost is per delivery.
	Cost *costReport `json:"cost"`
}

// fanout: add the endpoints, prefill --fanout-events events and drain them as the drain
// workload does, then measure single events' latency per delivery; remove the endpoints.
func (b *bench) fanout(ctx context.Context) (_ *fanoutResult, err error) {
	if err := b.resetTables(ctx); err != nil {
		return nil, err
	}
	key, err := b.addFanoutEndpoints(ctx)
	defer func() {
		// The workloads after this one deliver to WEBHOOK_URL alone.
		if rmErr := b.db.exec(context.WithoutCancel(ctx), `DELETE FROM webhook_endpoints`); rmErr != nil && err == nil {
			err = rmErr
		}
	}()
	if err != nil {
		return nil, err
	}
	// Without WEBHOOK_URL, an event goes to its endpoints only (with it, an event without a
	// tenant is also kept for WEBHOOK_URL: one more delivery). The secrets are sealed at rest,
	// as a deployment with WEBHOOK_ENCRYPTION_KEY has them; the dispatcher opens them once per
	// load of its endpoint cache.
	overrides := map[string]string{"WEBHOOK_URL": "", "WEBHOOK_SECRET": "", "WEBHOOK_ENCRYPTION_KEY": key}
	r, err := b.fanoutDrain(ctx, overrides)
	if err != nil {
		return nil, err
	}
	if r.Idle, err = b.fanoutIdle(ctx, overrides); err != nil {
		return nil, fmt.Errorf("idle: %w", err)
	}
	return r, nil
}

// addFanoutEndpoints adds one managed endpoint per consumer path, each with its own secret,
// sealed with a key made for the run, which it returns for the dispatcher.
func (b *bench) addFanoutEndpoints(ctx context.Context) (string, error) {
	key := endpoints.GenerateKey()
	cipher, err := endpoints.NewCipher(key, "")
	if err != nil {
		return "", err
	}
	conn, err := b.db.connect(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	for i, secret := range b.endpointSecrets {
		b.db.stmts.Add(1)
		if _, err := endpoints.Add(ctx, conn, cipher, endpoints.New{
			URL:         b.consumer.endpointURL(i),
			Description: fmt.Sprintf("fluxhook bench fan-out %d", i),
			Secret:      secret,
		}); err != nil {
			return "", fmt.Errorf("adding fan-out endpoint %d: %w", i, err)
		}
	}
	b.logf("  %d endpoints added, each its own consumer path and secret", len(b.endpointSecrets))
	return key, nil
}

// fanoutDrain prefills the events with the dispatcher stopped, starts it, and times until the
// consumer has every (event, endpoint) delivery.
func (b *bench) fanoutDrain(ctx context.Context, overrides map[string]string) (*fanoutResult, error) {
	n, eps := b.opts.fanoutEvents, len(b.endpointSecrets)
	r := &fanoutResult{Endpoints: eps, Events: n, Deliveries: n * eps}
	if err := b.prefillType(ctx, n, fanoutEventType); err != nil {
		return nil, err
	}
	s, err := b.startSession(ctx, overrides)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	arr, st, err := b.collect(ctx, r.Deliveries, drainTimeout(r.Deliveries), s.disp, s)
	if err != nil {
		return nil, err
	}
	r.Rejected = st.Rejected
	ids, err := b.eventIDs(ctx)
	if err != nil {
		return nil, err
	}
	if len(ids) != n {
		return nil, fmt.Errorf("%d event rows after the run, want %d", len(ids), n)
	}
	first, dups, unexpected := fanoutArrivals(arr, ids, eps)
	r.Received, r.Duplicates, r.Unexpected = len(first), dups, unexpected
	r.Lost = r.Deliveries - r.Received
	times := make([]int64, 0, len(first))
	for _, t := range first {
		times = append(times, t)
	}
	slices.Sort(times)
	r.Seconds, r.DeliveriesPerSecond, r.StartupMS, r.SteadyDeliveriesPerSecond = drainRates(s.disp.started.UnixNano(), times)
	if r.Cost, err = s.cost(ctx, len(times)); err != nil {
		return nil, err
	}
	// Read after the dispatcher stopped (cost stops it), with every counter final.
	if r.Routing, err = b.fanoutRouting(ctx, s); err != nil {
		return nil, err
	}
	b.logf("  %d deliveries (%d events × %d endpoints) in %.2f s: %.0f deliveries/s", r.Received, n, eps, r.Seconds, r.DeliveriesPerSecond)
	return r, nil
}

// eventIDs are the delivery ids of the event rows (not of their deliveries).
func (b *bench) eventIDs(ctx context.Context) ([][16]byte, error) {
	conn, err := b.db.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	b.db.stmts.Add(1)
	rows, err := conn.Query(ctx, benchMark+`SELECT delivery_id::text FROM webhook_deliveries WHERE endpoint_id IS NULL`)
	if err != nil {
		return nil, fmt.Errorf("reading the events' ids: %w", err)
	}
	defer rows.Close()
	var ids [][16]byte
	for rows.Next() {
		var text string
		if err := rows.Scan(&text); err != nil {
			return nil, err
		}
		id, ok := parseUUID(text)
		if !ok {
			return nil, fmt.Errorf("event delivery id %q is not a UUID", text)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// fanoutArrivals maps each expected delivery, (event, endpoint path 1..eps), to its first
// arrival, and counts the repeated arrivals of expected deliveries and the arrivals of
// anything else.
func fanoutArrivals(arr []arrivalRecord, events [][16]byte, eps int) (first map[arrivalKey]int64, dups, unexpected int) {
	want := make(map[[16]byte]bool, len(events))
	for _, id := range events {
		want[id] = true
	}
	first = make(map[arrivalKey]int64, len(events)*eps)
	for _, a := range arr {
		if !want[a.id] || a.ep < 1 || int(a.ep) > eps {
			unexpected++
			continue
		}
		k := a.key()
		if t, ok := first[k]; ok {
			dups++
			first[k] = min(t, a.ns)
			continue
		}
		first[k] = a.ns
	}
	return first, dups, unexpected
}

// fanoutRouting reads how the events were routed: from the event rows, and from
// pg_stat_statements over the session.
func (b *bench) fanoutRouting(ctx context.Context, s *session) (fanoutRouting, error) {
	var r fanoutRouting
	conn, err := b.db.connect(ctx)
	if err != nil {
		return r, err
	}
	defer conn.Close(context.Background())
	b.db.stmts.Add(1)
	// The route statement leaves the event row's lease token (its claim's) as it was and
	// stamps routed_at with its transaction's now().
	if err := conn.QueryRow(ctx, benchMark+`SELECT count(DISTINCT lease_token), count(DISTINCT routed_at), count(routed_at)
		FROM webhook_deliveries WHERE endpoint_id IS NULL AND routed_at IS NOT NULL`).
		Scan(&r.BatchesWithEvents, &r.RoutingTransactions, &r.EventsRouted); err != nil {
		return r, fmt.Errorf("reading the routing of the events: %w", err)
	}
	claims, ok := statementCalls(s.before, s.after, isClaimStatement)
	if !ok {
		r.Unavailable = b.db.info.StatementStats
		return r, nil
	}
	routes, _ := statementCalls(s.before, s.after, isRouteStatement)
	r.ClaimStatements, r.RouteStatements = &claims, &routes
	if r.BatchesWithEvents > 0 {
		v := float64(routes) / float64(r.BatchesWithEvents)
		r.RouteStatementsPerBatch = &v
	}
	return r, nil
}

// isClaimStatement tells the claim (stages/claim/claim.sql) in pg_stat_statements, whose text
// has its constants replaced but its structure kept.
func isClaimStatement(q string) bool {
	return strings.Contains(q, "SKIP LOCKED") && strings.Contains(q, "pg_current_snapshot()")
}

// isRouteStatement tells the routing statement (stages/claim/route.sql).
func isRouteStatement(q string) bool {
	return strings.Contains(q, "JOIN webhook_endpoints e") && strings.Contains(q, "INSERT INTO webhook_outbox")
}

// statementCalls sums the calls of the matching statements between two readings; false
// without pg_stat_statements.
func statementCalls(before, after pgCounters, match func(string) bool) (int64, bool) {
	if before.stmts == nil || after.stmts == nil {
		return 0, false
	}
	var calls int64
	for id, st := range after.stmts {
		if isBenchStatement(st.Query) || !match(st.Query) {
			continue
		}
		calls += max(st.Calls-before.stmts[id].Calls, 0)
	}
	return calls, true
}

// fanoutIdle: single events --idle-interval apart, the dispatcher idle and armed between
// them; the latency of each of their deliveries.
func (b *bench) fanoutIdle(ctx context.Context, overrides map[string]string) (*fanoutIdleResult, error) {
	eps, total, period := len(b.endpointSecrets), b.opts.fanoutIdleEvents, b.opts.idleInterval
	if err := b.resetTables(ctx); err != nil {
		return nil, err
	}
	s, err := b.startSession(ctx, overrides)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	if err := b.waitArmed(ctx); err != nil {
		return nil, err
	}
	conns, closeConns, err := b.producerConns(ctx, 1, "prepared")
	if err != nil {
		return nil, err
	}
	defer closeConns()
	// Warm-up, unmeasured (see warmUp): one event, to every endpoint.
	var warm pgtype.UUID
	if err := conns[0].QueryRow(ctx, benchInsert, fanoutEventType, b.payload(-1)).Scan(&warm); err != nil {
		return nil, fmt.Errorf("warming up a producer: %w", err)
	}
	b.db.stmts.Add(1)
	if _, err := b.consumer.waitReceived(ctx, eps, 10*time.Second, s.disp); err != nil {
		return nil, fmt.Errorf("warming up: %w", err)
	}
	if err := b.waitArmed(ctx); err != nil {
		return nil, err
	}
	s.startClock()
	sent, err := b.produceAtRate(ctx, conns, period, total, fanoutEventType, 0)
	if err != nil {
		return nil, err
	}
	closeConns()
	arr, st, err := b.collect(ctx, (1+total)*eps, 30*time.Second, s.disp, s)
	if err != nil {
		return nil, err
	}
	r := &fanoutIdleResult{Events: total, Deliveries: total * eps, IntervalMS: float64(period) / 1e6, Rejected: st.Rejected}
	ids := [][16]byte{warm.Bytes}
	for _, ev := range sent {
		if ev.OK {
			ids = append(ids, ev.ID)
		}
	}
	first, dups, unexpected := fanoutArrivals(arr, ids, eps)
	r.Duplicates, r.Unexpected = dups, unexpected
	var perDelivery, lastDelivery, fromCommit, insert []time.Duration
	for _, ev := range sent {
		if !ev.OK {
			r.Lost += eps
			continue
		}
		insert = append(insert, time.Duration(ev.Commit-ev.Start))
		var last int64
		all := true
		for ep := 1; ep <= eps; ep++ {
			at, ok := first[arrivalKey{ev.ID, uint16(ep)}]
			if !ok {
				r.Lost++
				all = false
				continue
			}
			perDelivery = append(perDelivery, time.Duration(at-ev.Start))
			fromCommit = append(fromCommit, time.Duration(at-ev.Commit))
			last = max(last, at)
		}
		if all {
			lastDelivery = append(lastDelivery, time.Duration(last-ev.Start))
		}
	}
	r.PerDelivery, r.LastDelivery = summarize(perDelivery), summarize(lastDelivery)
	r.FromCommit, r.Insert = summarize(fromCommit), summarize(insert)
	if r.Cost, err = s.cost(ctx, len(perDelivery)); err != nil {
		return nil, err
	}
	b.logf("  per delivery p50 %.2f ms, p99 %.2f ms from the insert start; last endpoint p50 %.2f ms; lost %d",
		r.PerDelivery.P50, r.PerDelivery.P99, r.LastDelivery.P50, r.Lost)
	return r, nil
}

// The budget's checks of the fanout workload (see benchReport.check).
type (
	addCheckFunc         func(workload, what string, value float64, unit, budget string, ok bool)
	notComputedCheckFunc func(workload, what string, value *float64, unit, budget, reason string)
	latencyCheckFunc     func(workload, what string, p percentiles, v float64, budget string, limit float64)
)

// The names of the fanout workload's checks.
const (
	fanoutRouteCheck  = "route statements per claimed batch with events"
	fanoutOnceCheck   = "deliveries not exactly once (lost + duplicates + rejected + unexpected)"
	fanoutIdleCheck   = "idle: insert start → arrival p50 per delivery"
	fanoutIdleOnce    = "idle: deliveries not exactly once"
	fanoutRateBudget  = 15000
	fanoutIdleBudget  = 2.5
	fanoutRouteBudget = "≤ 1"
)

func (f *fanoutResult) drainCheck() string {
	return fmt.Sprintf("%d events × %d endpoints drained", f.Events, f.Endpoints)
}

func (f *fanoutResult) check(add addCheckFunc, notComputed notComputedCheckFunc, latency latencyCheckFunc) {
	if f.Received == 0 || f.Seconds <= 0 {
		notComputed("fanout", f.drainCheck(), nil, "deliveries/s", "≥ 15,000", "no delivery arrived")
	} else {
		add("fanout", f.drainCheck(), f.DeliveriesPerSecond, "deliveries/s", "≥ 15,000", f.DeliveriesPerSecond >= fanoutRateBudget)
	}
	switch rt := f.Routing; {
	case rt.RouteStatementsPerBatch != nil:
		v := *rt.RouteStatementsPerBatch
		add("fanout", fanoutRouteCheck, v, "", fanoutRouteBudget, v <= 1.05)
	case rt.RouteStatements == nil:
		notComputed("fanout", fanoutRouteCheck, nil, "", fanoutRouteBudget, statementStatsMissing(rt.Unavailable))
	default:
		notComputed("fanout", fanoutRouteCheck, nil, "", fanoutRouteBudget, "no claimed batch had events")
	}
	bad := f.Lost + f.Duplicates + f.Rejected + f.Unexpected
	add("fanout", fanoutOnceCheck, float64(bad), "", "0", bad == 0)
	if i := f.Idle; i != nil {
		latency("fanout", fanoutIdleCheck, i.PerDelivery, i.PerDelivery.P50, "≤ 2.5", fanoutIdleBudget)
		bad := i.Lost + i.Duplicates + i.Rejected + i.Unexpected
		add("fanout", fanoutIdleOnce, float64(bad), "", "0", bad == 0)
	}
}

// writeRows prints the workload's rows of the results table.
func (f *fanoutResult) writeRows(tw io.Writer, spacing time.Duration, verdict func(workload, what string) string) {
	fmt.Fprintf(tw, "fanout\t%s events × %d managed endpoints prefilled with COPY, then the dispatcher started (no WEBHOOK_URL)\t%s deliveries/s (%.2f s)\t%s\n",
		num(float64(f.Events), 0), f.Endpoints, num(f.DeliveriesPerSecond, 0), f.Seconds, verdict("fanout", f.drainCheck()))
	fmt.Fprintf(tw, "\t  start → first arrival; rate after it\t%.0f ms; %s deliveries/s\t\n", f.StartupMS, num(f.SteadyDeliveriesPerSecond, 0))
	rt := f.Routing
	perBatch := "n/a"
	if rt.RouteStatementsPerBatch != nil {
		perBatch = fmt.Sprintf("%.2f", *rt.RouteStatementsPerBatch)
	}
	source := "pg_stat_statements: n/a"
	if rt.RouteStatements != nil {
		source = fmt.Sprintf("pg_stat_statements: %d route, %d claim statements", *rt.RouteStatements, *rt.ClaimStatements)
	}
	fmt.Fprintf(tw, "\t  route statements per claimed batch with events (%s; %d batches with events)\t%s\t%s\n",
		source, rt.BatchesWithEvents, perBatch, verdict("fanout", fanoutRouteCheck))
	if rt.RoutingTransactions > 0 {
		fmt.Fprintf(tw, "\t  routing transactions (from the event rows); events each\t%d; %.1f\t\n", rt.RoutingTransactions, float64(rt.EventsRouted)/float64(rt.RoutingTransactions))
	}
	fmt.Fprintf(tw, "\t  lost, duplicates, rejected, unexpected (each verified with its endpoint's secret)\t%d, %d, %d, %d\t%s\n",
		f.Lost, f.Duplicates, f.Rejected, f.Unexpected, verdict("fanout", fanoutOnceCheck))
	if i := f.Idle; i != nil {
		fmt.Fprintf(tw, "\t  idle: %d events %s apart × %d endpoints, insert start → arrival p50 per delivery\t%s ms\t%s\n",
			i.Events, spacing, f.Endpoints, ms(i.PerDelivery.P50), verdict("fanout", fanoutIdleCheck))
		fmt.Fprintf(tw, "\t  idle: per delivery p90, p99, max\t%s, %s, %s ms\t\n", ms(i.PerDelivery.P90), ms(i.PerDelivery.P99), ms(i.PerDelivery.Max))
		fmt.Fprintf(tw, "\t  idle: insert start → last endpoint's arrival p50, p99; commit → arrival p50\t%s, %s; %s ms\t\n",
			ms(i.LastDelivery.P50), ms(i.LastDelivery.P99), ms(i.FromCommit.P50))
		fmt.Fprintf(tw, "\t  idle: lost, duplicates, rejected, unexpected\t%d, %d, %d, %d\t%s\n", i.Lost, i.Duplicates, i.Rejected, i.Unexpected, verdict("fanout", fanoutIdleOnce))
	}
}
