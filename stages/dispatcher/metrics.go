package dispatcher

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/wake"
)

// metrics are the dispatcher's Prometheus series, on a registry of their own so that
// embedding fluxhook in another program never collides with that program's metrics. Names
// use base units (seconds, bytes) and the fluxora_webhook_ prefix. No series is labelled by
// URL: an endpoint label, when enabled, is the URL's SHA-256, and it is off by default
// because one label value per tenant endpoint can overwhelm a Prometheus server.
type metrics struct {
	reg              *prometheus.Registry
	endpointLabel    bool
	deliveries       *prometheus.CounterVec
	attemptSeconds   *prometheus.HistogramVec
	endToEndSeconds  prometheus.Histogram
	retries          prometheus.Counter
	deadLetters      *prometheus.CounterVec
	deferrals        *prometheus.CounterVec
	released         prometheus.Counter
	failOpen         prometheus.Counter
	storeRoundTrips  *prometheus.CounterVec
	transitions      *prometheus.CounterVec
	reconnects       prometheus.Counter
	wakeups          *prometheus.CounterVec
	paced            prometheus.Counter // wakeups{source="pace"}, looked up once: one per paced claim
	claimRows        prometheus.Histogram
	settleRows       prometheus.Histogram
	settleErrors     prometheus.Counter
	claimErrors      prometheus.Counter
	staleSettles     prometheus.Counter
	unrouted         prometheus.Counter
	routed           *prometheus.CounterVec
	endpointChanges  *prometheus.CounterVec
	alreadyDelivered prometheus.Counter
	beyondSequence   prometheus.Gauge
}

const ns = "fluxora_webhook"

func newMetrics(d *Dispatcher) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), endpointLabel: d.cfg.MetricsEndpointLabel}
	outcomeLabels := []string{"outcome"}
	if m.endpointLabel {
		outcomeLabels = append(outcomeLabels, "endpoint")
	}
	latency := []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m.deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "deliveries_total",
		Help: "Settled outcomes of claimed rows: delivered, retry, dead_letter, deferred, released."}, outcomeLabels)
	m.attemptSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "attempt_duration_seconds",
		Help: "Duration of HTTP attempts, by outcome.", Buckets: latency}, []string{"outcome"})
	m.endToEndSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "end_to_end_latency_seconds",
		Help:    "From the event's first enqueue to its successful delivery (includes retries).",
		Buckets: append(latency, 60, 300, 1800, 3600, 21600, 86400, 172800)})
	m.retries = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "retries_scheduled_total",
		Help: "Retry rows inserted after a retryable failure."})
	m.deadLetters = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dead_letters_total",
		Help: "Events moved to webhook_dead_letter, by reason class: permanent, exhausted, invalid, settle_failed, endpoint_disabled, endpoint_invalid."}, []string{"reason"})
	m.deferrals = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "deferrals_total",
		Help: "Rows held back by the gate without an attempt, by reason: circuit_open, rate_limited, other."}, []string{"reason"})
	m.released = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "released_total",
		Help: "Claimed rows released without an attempt (endpoint saturated, shutdown)."})
	m.failOpen = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "gate_fail_open_total",
		Help: "Rows allowed because the gate's store (Redis) could not be reached."})
	m.storeRoundTrips = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "gate_store_round_trips_total",
		Help: "Round trips to the gate's Redis, by op: decide (one per claimed batch), record (one per settled batch), inspect, other. Stays 0 without REDIS_URL."}, []string{"op"})
	m.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "circuit_breaker_transitions_total",
		Help: "Real changes of a circuit breaker's state."}, []string{"from_state", "to_state"})
	m.reconnects = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "listener_reconnects_total",
		Help: "Times the NOTIFY listener connected after its first connection."})
	m.wakeups = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "wakeups_total",
		Help: "Wake-ups of the claiming loop by source: notify, poll, timer, backlog, watch (looks after arming), lapse (a renewal found the NOTIFY switch had run out), pace (a paced claim under steady traffic)."}, []string{"source"})
	m.claimRows = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "claim_batch_rows",
		Help: "Rows returned per claim statement.", Buckets: []float64{0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000}})
	m.settleRows = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "settle_batch_rows",
		Help: "Rows written per settle statement.", Buckets: []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000}})
	m.settleErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "settle_errors_total",
		Help: "Settle batches that could not be written, and rows the database refused to settle or dead-letter (both are redelivered after the lease)."})
	m.claimErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "claim_errors_total",
		Help: "Claim statements that failed."})
	m.alreadyDelivered = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "already_delivered_total",
		Help: "Deliveries settled delivered because the consumer answered 409 Conflict to a delivery id it already had (WEBHOOK_409_DELIVERED); also counted in deliveries_total{outcome=\"delivered\"}."})
	m.unrouted = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "unrouted_total",
		Help: "Events that matched no endpoint and had no default consumer (recorded in the delivery log as 'no endpoint matched')."})
	m.routed = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_routed_total",
		Help: "Events routed to managed endpoints, by how: memory (from the endpoint cache, no statement; the event's row holds its deliveries until their first settle) or statement (route.sql, a row per delivery)."}, []string{"by"})
	m.endpointChanges = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "endpoint_lifecycle_total",
		Help: "Managed endpoints' changes of state this instance observed, by change: disabled (a 410 Gone, failing for WEBHOOK_ENDPOINT_DISABLE_AFTER, or an operator), enabled."}, []string{"change"})
	m.beyondSequence = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "ordered_rows_beyond_sequence",
		Help: "Ordered rows keyed beyond the outbox's id sequence (an id a producer supplied itself): the hold-back holds them until the sequence reaches them. Checked once a minute while something is ordered."})
	m.staleSettles = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "stale_settles_total",
		Help: "Outcomes refused at settle because the row's lease had run out and another claim held it (the current holder's outcome is written instead)."})
	inFlight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "in_flight",
		Help: "Rows claimed by this instance and not yet settled."}, func() float64 { return float64(d.slots.InUse()) })
	capacity := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "capacity",
		Help: "The most rows this instance holds in flight (WEBHOOK_MAX_IN_FLIGHT)."}, func() float64 { return float64(d.slots.Size()) })
	m.reg.MustRegister(m.deliveries, m.attemptSeconds, m.endToEndSeconds, m.retries, m.deadLetters, m.deferrals,
		m.released, m.failOpen, m.storeRoundTrips, m.transitions, m.reconnects, m.wakeups, m.claimRows, m.settleRows, m.settleErrors,
		m.claimErrors, m.staleSettles, m.unrouted, m.routed, m.endpointChanges, m.alreadyDelivered, m.beyondSequence, inFlight, capacity, &backlogCollector{d: d},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.preinitialise()
	return m
}

// Label values known in advance. A labelled series is exported only once it has a value, and
// an alert such as increase(...{to_state="open"}[10m]) > 0 cannot fire on the first event of
// a series that did not exist before it: every known series starts at zero instead.
var (
	outcomes        = []string{"delivered", "retry", "dead_letter", "deferred", "released"}
	attemptOutcomes = []string{"delivered", "retry", "dead_letter"}
	deadLetterKinds = []string{"permanent", "exhausted", "invalid", "settle_failed", "endpoint_disabled", "endpoint_invalid"}
	deferralReasons = []string{"circuit_open", "rate_limited", "other"}
	breakerMoves    = [][2]gate.State{{gate.Closed, gate.Open}, {gate.Open, gate.HalfOpen}, {gate.HalfOpen, gate.Closed}, {gate.HalfOpen, gate.Open}}
	wakeSources     = []wake.Source{wake.Notify, wake.Poll, wake.Timer, wake.Backlog, wake.Watch}
)

// preinitialise creates every series whose labels are known in advance at zero. The
// endpoint-labelled deliveries series are not: their label values are only known as rows
// arrive.
func (m *metrics) preinitialise() {
	if !m.endpointLabel {
		for _, o := range outcomes {
			m.deliveries.WithLabelValues(o)
		}
	}
	for _, o := range attemptOutcomes {
		m.attemptSeconds.WithLabelValues(o)
	}
	for _, r := range deadLetterKinds {
		m.deadLetters.WithLabelValues(r)
	}
	for _, r := range deferralReasons {
		m.deferrals.WithLabelValues(r)
	}
	for _, mv := range breakerMoves {
		m.transitions.WithLabelValues(string(mv[0]), string(mv[1]))
	}
	for _, s := range wakeSources {
		m.wakeups.WithLabelValues(string(s))
	}
	m.wakeups.WithLabelValues("lapse") // the claiming loop's own: a renewal found the switch lapsed
	m.paced = m.wakeups.WithLabelValues("pace")
	m.endpointChanges.WithLabelValues("disabled")
	m.endpointChanges.WithLabelValues("enabled")
	for _, op := range redisstore.Ops {
		m.storeRoundTrips.WithLabelValues(string(op))
	}
}

// countRoundTrips feeds fluxora_webhook_gate_store_round_trips_total from store's client. The
// counters are looked up once here: the hook runs on every Redis call, in the gate's path.
func (m *metrics) countRoundTrips(store *redisstore.Store) {
	byOp := make(map[redisstore.Op]prometheus.Counter, len(redisstore.Ops))
	for _, op := range redisstore.Ops {
		byOp[op] = m.storeRoundTrips.WithLabelValues(string(op))
	}
	store.CountRoundTrips(func(op redisstore.Op) {
		if c, ok := byOp[op]; ok {
			c.Inc()
		}
	})
}

// observe records one settled row.
func (m *metrics) observe(del *delivery.Delivery, now time.Time) {
	o := del.Outcome
	if o.Unsettled || o.Stale {
		return // counted as a settle error or a stale settle; no outcome was written
	}
	var outcome string
	switch o.Kind {
	case delivery.Delivered:
		outcome = "delivered"
		if o.AlreadyDelivered {
			m.alreadyDelivered.Inc()
		}
		if !del.EnqueuedAt.IsZero() {
			m.endToEndSeconds.Observe(now.Sub(del.EnqueuedAt).Seconds())
		}
	case delivery.Retry:
		outcome = "retry"
		m.retries.Inc()
	case delivery.Permanent:
		outcome = "dead_letter"
		m.deadLetters.WithLabelValues(deadLetterClass(o.Reason)).Inc()
	case delivery.Defer:
		outcome = "deferred"
		m.deferrals.WithLabelValues(deferralClass(o.Reason)).Inc()
	case delivery.Release:
		outcome = "released"
		m.released.Inc()
	default:
		return
	}
	labels := []string{outcome}
	if m.endpointLabel {
		// A managed endpoint by its id, which operators know it by; any other by its URL's
		// SHA-256. Either way one series per endpoint in use, and no URL.
		name := ""
		switch {
		case del.EndpointID != "":
			name = "ep:" + del.EndpointID
		case del.Endpoint != nil:
			name = del.Endpoint.Hash
		}
		labels = append(labels, name)
	}
	m.deliveries.WithLabelValues(labels...).Inc()
	if o.Duration > 0 || o.Status != 0 {
		m.attemptSeconds.WithLabelValues(outcome).Observe(o.Duration.Seconds())
	}
}

func deadLetterClass(reason string) string {
	switch {
	case strings.HasPrefix(reason, "attempts exhausted"):
		return "exhausted"
	case strings.HasPrefix(reason, "invalid"):
		return "invalid"
	case strings.HasPrefix(reason, "settle failed"):
		return "settle_failed"
	case strings.HasPrefix(reason, "endpoint disabled"), strings.HasSuffix(reason, "was removed"):
		return "endpoint_disabled"
	case misconfiguredReason(reason):
		return "endpoint_invalid"
	default:
		return "permanent"
	}
}

func deferralClass(reason string) string {
	r := strings.ToLower(reason)
	switch {
	case strings.Contains(r, "circuit") || strings.Contains(r, "breaker") || strings.Contains(r, "probe"):
		return "circuit_open"
	case strings.Contains(r, "rate"):
		return "rate_limited"
	default:
		return "other"
	}
}

// backlogCollector reads the due backlog, the scheduled and deferred rows, and the ages of the
// oldest due row and of the oldest undelivered event at scrape time: the numbers operators
// page on. One query per scrape over the unprocessed rows (the due index's), bounded by a
// short timeout, so a slow database makes the scrape miss these series rather than hang.
type backlogCollector struct{ d *Dispatcher }

var (
	backlogDesc     = prometheus.NewDesc(ns+"_backlog", "Unprocessed rows that are due and not leased (all instances).", nil, nil)
	oldestDesc      = prometheus.NewDesc(ns+"_oldest_due_age_seconds", "Age of the oldest due, unprocessed, unleased row (0 when none).", nil, nil)
	scheduledDesc   = prometheus.NewDesc(ns+"_scheduled", "Unprocessed rows not yet due: retries waiting for their time, deferred and delayed rows (all instances).", nil, nil)
	deferredDesc    = prometheus.NewDesc(ns+"_deferred", "Scheduled rows the gate held back, by reason: circuit_open, probe_in_flight, rate_limited.", []string{"reason"}, nil)
	undeliveredDesc = prometheus.NewDesc(ns+"_oldest_undelivered_age_seconds", "Time since the first enqueue of the oldest event not yet delivered, scheduled retries and deferred rows included (0 when none): it grows through a consumer outage, when the backlog stays empty.", nil, nil)
)

// deferredLabels maps the reasons stored on deferred rows to the deferred gauge's labels.
var deferredLabels = []struct{ reason, label string }{
	{gate.DeferOpen.String(), "circuit_open"},
	{gate.DeferProbe.String(), "probe_in_flight"},
	{gate.DeferRateLimit.String(), "rate_limited"},
	// Ordered rows parked behind their stream's head (settle.sql, route.sql, park.sql).
	{"behind its stream", "behind_stream"},
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backlogDesc
	ch <- oldestDesc
	ch <- scheduledDesc
	ch <- deferredDesc
	ch <- undeliveredDesc
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	pool, _ := c.d.handles()
	if pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var n, scheduled, open, probe, limited, behind int64
	var age, undelivered float64
	err := pool.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE created_at <= now() AND (lease_until IS NULL OR lease_until < now())),
			coalesce(extract(epoch FROM now() - min(created_at) FILTER (
				WHERE created_at <= now() AND (lease_until IS NULL OR lease_until < now()))), 0),
			count(*) FILTER (WHERE created_at > now()),
			count(*) FILTER (WHERE created_at > now() AND deferred_reason = $1),
			count(*) FILTER (WHERE created_at > now() AND deferred_reason = $2),
			count(*) FILTER (WHERE created_at > now() AND deferred_reason = $3),
			count(*) FILTER (WHERE created_at > now() AND deferred_reason = $4),
			coalesce(extract(epoch FROM now() - min(enqueued_at)), 0)
		FROM webhook_outbox WHERE NOT processed`,
		deferredLabels[0].reason, deferredLabels[1].reason, deferredLabels[2].reason, deferredLabels[3].reason).
		Scan(&n, &age, &scheduled, &open, &probe, &limited, &behind, &undelivered)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(backlogDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, age)
	ch <- prometheus.MustNewConstMetric(scheduledDesc, prometheus.GaugeValue, float64(scheduled))
	for i, v := range []int64{open, probe, limited, behind} {
		ch <- prometheus.MustNewConstMetric(deferredDesc, prometheus.GaugeValue, float64(v), deferredLabels[i].label)
	}
	ch <- prometheus.MustNewConstMetric(undeliveredDesc, prometheus.GaugeValue, undelivered)
}
