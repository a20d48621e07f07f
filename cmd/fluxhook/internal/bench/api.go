package bench

// The api workload: the management API's main reads while a steady flow is delivered, on a
// delivery log of --api-log-rows rows (ten million by default) to --api-endpoints managed
// endpoints (10,000). The steady flow runs without the API and with it, interleaved, so that
// what serving the API costs the dispatchers is one ratio of the same report.
//
// The API is served as most users would run it: by the dispatcher itself, `fluxhook serve` with
// API_ADDR (one process, one configuration). Its CPU is then the dispatcher's: the "with"
// runs' CPU per event includes the API's requests. `fluxhook api`, a process of its own, is
// for those who scale or secure it apart (docs/api.md).
//
// The fill is laid out by row number r, in SQL (apiLogRows) and here alike, so that the API
// clients can name rows that exist without reading them back: rows come in blocks of 204 for
// 100 events, each event's routed row (endpoint_id NULL, as the dispatcher logs an event it
// fanned out), its first attempt, and for the 4 events of 100 whose first attempt failed (503
// or a timeout) a second attempt, which for one event in 1,000 fails for good (410) and has a
// dead letter. Event e's delivery id is md5('fluxhook-bench-delivery-' || e) as a uuid, its
// endpoint (e × 7919) mod --api-endpoints, whose tenant is one of --api-endpoints / 100. Row r
// was settled at start + r × window / rows: the log spans the default retention (7 days) in
// daily partitions, as the dispatcher makes them.

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/stages/claim"
)

const (
	// apiRetention is the api workload's WEBHOOK_RETENTION, the default: the fill spans it.
	apiRetention = 168 * time.Hour
	// apiBlockRows and apiBlockEvents are the fill's repeating block (see the file's comment).
	apiBlockRows   = 204
	apiBlockEvents = 100
	// apiEndpointStride spreads consecutive events over the endpoints (a prime: every endpoint
	// gets events unless --api-endpoints is a multiple of it).
	apiEndpointStride = 7919
	// apiWorkers is how many API clients send the scheduled requests: enough that a slow
	// answer never holds the next one back.
	apiWorkers = 16
	// apiBudgetMS is the budget of each read's p99.
	apiBudgetMS = 50
	// apiBudgetRatio bounds the steady workload's p99 and CPU per event with the API over
	// without.
	apiBudgetRatio = 1.10
)

// apiReads are the reads the clients make, in turn.
var apiReads = []struct{ name, route string }{
	{"delivery by id", "GET /v1/deliveries/{id}"},
	{"an endpoint's deliveries", "GET /v1/endpoints/{id}/deliveries"},
	{"dead letters", "GET /v1/dead-letters"},
}

// apiLogRows is the fill's row r for each r of generate_series($1, $2, $3), as the columns of
// webhook_delivery_log (the order of apiLogColumns): $4 the window's start, $5 its length in
// ms, $6 the rows in all, $7 the endpoints, $8 the tenants, $9 the payload's padding.
const apiLogRows = `SELECT r + 1, NULL::text, et, jsonb_build_object('event', e, 'type', et, 'pad', $9::text), enq,
       md5('fluxhook-bench-delivery-' || e)::uuid, CASE WHEN kind = 2 THEN 2 ELSE 1 END, enq, 'fluxhook-bench-fill', r,
       NULL::text, ts,
       CASE kind WHEN 0 THEN NULL
                 WHEN 1 THEN CASE WHEN e % 25 <> 7 THEN 200 WHEN e % 50 = 7 THEN 503 END
                 ELSE CASE WHEN dead THEN 410 ELSE 200 END END,
       CASE kind WHEN 0 THEN 'routed to 1 endpoint(s)'
                 WHEN 1 THEN CASE WHEN e % 25 <> 7 THEN NULL WHEN e % 50 = 7 THEN 'HTTP 503' ELSE 'timeout after 10s' END
                 ELSE CASE WHEN dead THEN 'HTTP 410' END END,
       CASE WHEN kind = 0 THEN NULL WHEN kind = 1 AND e % 50 = 32 THEN 10000 ELSE 20 + (e * 37) % 300 END,
       'tenant-' || (ep % $8::bigint), CASE WHEN kind > 0 THEN md5('fluxhook-bench-endpoint-' || ep)::uuid END,
       enq + interval '5 milliseconds', NULL::bigint
FROM generate_series($1::bigint, $2::bigint, $3::bigint) r,
LATERAL (SELECT r / 204 AS blk, r % 204 AS o) a,
LATERAL (SELECT CASE WHEN o < 100 THEN 0 WHEN o < 200 THEN 1 ELSE 2 END AS kind,
                CASE WHEN o < 100 THEN blk * 100 + o WHEN o < 200 THEN blk * 100 + o - 100 ELSE blk * 100 + (o - 200) * 25 + 7 END AS e,
                o = 203 AND blk % 10 = 0 AS dead) b,
LATERAL (SELECT (e * 7919) % $7::bigint AS ep,
                (ARRAY['invoice.paid', 'order.created', 'order.shipped', 'customer.updated', 'subscription.renewed'])[1 + e % 5] AS et,
                $4::timestamptz + ((r * $5::bigint) / $6::bigint) * interval '1 millisecond' AS ts,
                $4::timestamptz + ((((e / 100) * 204 + e % 100) * $5::bigint) / $6::bigint) * interval '1 millisecond'
                    - interval '5 milliseconds' AS enq) c`

// apiLogColumns are apiLogRows' columns.
const apiLogColumns = `id, stream_id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, leased_by, lease_token,
	endpoint_url, processed_at, status_code, error, duration_ms, tenant, endpoint_id, routed_at, order_key`

// apiEvents is how many events the first rows rows of the fill hold (each has its routed row).
func apiEvents(rows int64) int64 {
	return rows/apiBlockRows*apiBlockEvents + min(rows%apiBlockRows, apiBlockEvents)
}

// apiDeadLetters is how many of the first rows rows of the fill are dead-lettered attempts:
// rows 203, 203 + 2040, ...
func apiDeadLetters(rows int64) int64 {
	const first, every = apiBlockRows - 1, 10 * apiBlockRows
	if rows <= first {
		return 0
	}
	return (rows-first-1)/every + 1
}

// apiTenants is how many tenants the endpoints belong to: a hundred endpoints each.
func apiTenants(endpoints int) int { return max(1, endpoints/100) }

// apiEndpointOf is event e's endpoint.
func apiEndpointOf(e int64, endpoints int) int { return int(e * apiEndpointStride % int64(endpoints)) }

// apiDeliveryID is the delivery id the fill gives event e.
func apiDeliveryID(e int64) string {
	return md5UUID("fluxhook-bench-delivery-" + strconv.FormatInt(e, 10))
}

// apiEndpointID is the id the fill gives endpoint ep.
func apiEndpointID(ep int) string { return md5UUID("fluxhook-bench-endpoint-" + strconv.Itoa(ep)) }

// md5UUID is PostgreSQL's md5(s)::uuid.
func md5UUID(s string) string {
	sum := md5.Sum([]byte(s))
	h := hex.EncodeToString(sum[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// apiPartition is one partition of the fill: its bounds and the rows [from, to) it holds.
type apiPartition struct {
	lo, hi   time.Time
	from, to int64
}

// apiLayout splits rows rows settled from start over window into the log's partitions for
// apiRetention (aligned to their step in UTC, as webhook_delivery_log_maintain makes them):
// row r is at start + floor(r × window / rows) in ms, the same integer arithmetic as
// apiLogRows, so that every row falls inside its partition's bounds.
func apiLayout(start time.Time, window time.Duration, rows int64) []apiPartition {
	step := claim.LogPartitionStep(apiRetention)
	w := window.Milliseconds()
	firstRow := func(t time.Time) int64 { // the first row at or after t
		l := t.Sub(start).Milliseconds()
		if l <= 0 {
			return 0
		}
		return min((l*rows+w-1)/w, rows)
	}
	var parts []apiPartition
	for lo := start.UTC().Truncate(step); lo.Before(start.Add(window)); lo = lo.Add(step) {
		hi := lo.Add(step)
		parts = append(parts, apiPartition{lo: lo, hi: hi, from: firstRow(lo), to: firstRow(hi)})
	}
	return parts
}

// apiFill is what filling took.
type apiFill struct {
	Seconds float64 `json:"seconds"`
	// RowsSeconds is the INSERT ... SELECT into the partitions; VacuumSeconds their VACUUM
	// (FREEZE, ANALYZE), so that no autovacuum of them runs during the measured runs;
	// AttachSeconds attaching them, which builds the log's indexes on each (schema 19's two
	// and the BRIN) and checks its bounds.
	RowsSeconds   float64 `json:"rows_seconds"`
	VacuumSeconds float64 `json:"vacuum_seconds"`
	AttachSeconds float64 `json:"attach_seconds"`
	// LogBytes is the log's heap (with TOAST); IndexBytes each of its indexes over every
	// partition, by name.
	LogBytes   int64            `json:"log_bytes"`
	IndexBytes map[string]int64 `json:"index_bytes"`
}

// apiReadResult is one read's requests in one run, or pooled over the runs with the API.
type apiReadResult struct {
	Read       string      `json:"read"`
	Route      string      `json:"route"`
	Requests   int         `json:"requests"`
	Errors     int         `json:"errors"`
	FirstError string      `json:"first_error,omitempty"`
	Latency    percentiles `json:"latency"`
	samples    []time.Duration
}

// apiRun is one steady run, without the API or with it.
type apiRun struct {
	API    bool            `json:"api"`
	Steady *latencyResult  `json:"steady"`
	Reads  []apiReadResult `json:"reads,omitempty"`
	// ClientLateness is how far behind its schedule each request started (the clients', not
	// the API's, delay).
	ClientLateness *percentiles `json:"client_start_lateness,omitempty"`
}

// apiArm pools the runs of one side: the steady latencies together, CPU over all events.
type apiArm struct {
	Runs          int         `json:"runs"`
	Events        int         `json:"events"`
	Lost          int         `json:"lost"`
	Rejected      int         `json:"rejected"`
	FromScheduled percentiles `json:"latency_from_scheduled_start"`
	// FromCommit leaves out the producers' own delay (a machine short of CPU starts inserts
	// late): commit → arrival is the dispatcher's part.
	FromCommit percentiles `json:"latency_from_commit"`
	// CPUMicrosPerEvent is the dispatcher process's (with the API: the API's too).
	CPUMicrosPerEvent         float64  `json:"dispatcher_cpu_us_per_event"`
	PostgresCPUMicrosPerEvent *float64 `json:"postgres_cpu_us_per_event"`
	// MachineCPUs is how many CPUs the machine had busy on average during the runs, and
	// OtherCPUs how many of them went to programs that are not part of the bench.
	MachineCPUs float64 `json:"machine_cpus_busy"`
	OtherCPUs   float64 `json:"other_cpus"`
}

type apiResult struct {
	// Serving says how the API was served.
	Serving     string  `json:"serving"`
	LogRows     int64   `json:"log_rows"`
	Events      int64   `json:"events"`
	Endpoints   int     `json:"endpoints"`
	Tenants     int     `json:"tenants"`
	DeadLetters int64   `json:"dead_letters"`
	Partitions  int     `json:"partitions"`
	Fill        apiFill `json:"fill"`
	// SteadyRate is the steady flow's events/s, RequestRate the API requests/s (all reads
	// together, in turn), each run DurationSeconds long; Pairs runs without and with, in turn.
	SteadyRate      float64  `json:"steady_rate_per_sec"`
	RequestRate     float64  `json:"request_rate_per_sec"`
	DurationSeconds float64  `json:"duration_sec"`
	Pairs           int      `json:"pairs"`
	Runs            []apiRun `json:"runs"`
	Without         apiArm   `json:"without_api"`
	With            apiArm   `json:"with_api"`
	// Reads are pooled over the runs with the API.
	Reads []apiReadResult `json:"reads"`
	// The ratios with over without of the pooled steady p99 and p50 and of the dispatcher's
	// CPU per event (nil when a side measured nothing).
	P99Ratio *float64 `json:"steady_p99_ratio"`
	P50Ratio *float64 `json:"steady_p50_ratio"`
	CPURatio *float64 `json:"cpu_per_event_ratio"`
	// APICPUMicrosPerRequest estimates the API's own CPU per request: the dispatcher's extra
	// CPU with the API over the requests made; PostgresCPUMicrosPerRequest the same of
	// PostgreSQL's (the throwaway cluster only). Nil when the CPU per event did not rise.
	APICPUMicrosPerRequest      *float64 `json:"api_cpu_us_per_request_estimate"`
	PostgresCPUMicrosPerRequest *float64 `json:"postgres_cpu_us_per_request_estimate"`
}

// api: fill the log, the endpoints and the dead letters, then run the steady flow without the
// API and with it, --api-pairs times in turn.
func (b *bench) api(ctx context.Context) (_ *apiResult, err error) {
	o := b.opts
	r := &apiResult{
		Serving: "fluxhook serve with API_ADDR (the dispatcher and the API in one process)",
		LogRows: o.apiLogRows, Events: apiEvents(o.apiLogRows), Endpoints: o.apiEndpoints, Tenants: apiTenants(o.apiEndpoints),
		DeadLetters: apiDeadLetters(o.apiLogRows), SteadyRate: float64(o.apiSteadyRate), RequestRate: float64(o.apiRate),
		DurationSeconds: o.apiDuration.Seconds(), Pairs: o.apiPairs,
	}
	if err := b.resetTables(ctx); err != nil {
		return nil, err
	}
	defer func() {
		// The workloads after this one run without endpoints, keys or this log.
		if rmErr := b.db.exec(context.WithoutCancel(ctx), `DELETE FROM webhook_endpoints`); rmErr != nil && err == nil {
			err = rmErr
		}
		if rmErr := b.db.exec(context.WithoutCancel(ctx), `DELETE FROM webhook_api_keys`); rmErr != nil && err == nil {
			err = rmErr
		}
	}()
	keys, err := b.apiFillAll(ctx, r)
	if err != nil {
		return nil, err
	}
	plan := &apiPlan{events: r.Events, endpoints: r.Endpoints, tenants: r.Tenants, keys: keys}
	for pair := range o.apiPairs {
		for _, with := range []bool{false, true} {
			b.logf("  pair %d of %d: steady %d events/s for %s, %s", pair+1, o.apiPairs, o.apiSteadyRate, o.apiDuration,
				map[bool]string{false: "without the API", true: fmt.Sprintf("with the API, %d requests/s", o.apiRate)}[with])
			run, err := b.apiRun(ctx, plan, with, uint64(pair))
			if err != nil {
				return nil, fmt.Errorf("pair %d, api %v: %w", pair+1, with, err)
			}
			r.Runs = append(r.Runs, *run)
		}
	}
	r.pool()
	return r, nil
}

// apiFillAll makes the endpoints (and the one the steady flow goes to), a key per tenant, the
// log and the dead letters, and returns the keys by tenant.
func (b *bench) apiFillAll(ctx context.Context, r *apiResult) ([]string, error) {
	o := b.opts
	started := time.Now()
	conn, err := b.db.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	exec := func(sql string, args ...any) error {
		b.db.stmts.Add(1)
		if _, err := conn.Exec(ctx, benchMark+sql, args...); err != nil {
			return fmt.Errorf("%s: %w", shortQuery(sql, 60), err)
		}
		return nil
	}
	secret, err := endpoints.GenerateSecret(endpoints.SchemeFluxora)
	if err != nil {
		return nil, err
	}
	// The tenants' endpoints: never delivered to (the steady flow has no tenant), there to be
	// read and to be routed past. Secrets in clear, as without WEBHOOK_ENCRYPTION_KEY.
	if err := exec(`INSERT INTO webhook_endpoints (id, url, description, tenant, secret)
		SELECT md5('fluxhook-bench-endpoint-' || i)::uuid, 'https://hooks.example.com/t' || (i % $2::bigint) || '/e' || i,
		       'bench endpoint ' || i, 'tenant-' || (i % $2::bigint), $3
		FROM generate_series(0, $1::bigint - 1) i`, o.apiEndpoints, r.Tenants, secret); err != nil {
		return nil, err
	}
	// The steady flow's endpoint: untenanted events go to it alone, on the consumer's first
	// endpoint path, as a deployment with managed endpoints delivers.
	b.db.stmts.Add(1)
	clear, err := endpoints.NewCipher("", "")
	if err != nil {
		return nil, err
	}
	if _, err := endpoints.Add(ctx, conn, clear, endpoints.New{URL: b.consumer.endpointURL(0),
		Description: "fluxhook bench api: the steady flow", Secret: b.endpointSecrets[0]}); err != nil {
		return nil, fmt.Errorf("adding the steady flow's endpoint: %w", err)
	}
	keys := make([]string, r.Tenants)
	for t := range keys {
		tenant := "tenant-" + strconv.Itoa(t)
		b.db.stmts.Add(1)
		if _, keys[t], err = apikeys.Add(ctx, conn, apikeys.New{Tenant: &tenant, Description: "fluxhook bench", CreatedBy: "bench"}); err != nil {
			return nil, fmt.Errorf("adding an API key: %w", err)
		}
	}
	b.logf("  %d endpoints in %d tenants, a key each", o.apiEndpoints, r.Tenants)

	var now time.Time
	if err := conn.QueryRow(ctx, benchMark+`SELECT now()`).Scan(&now); err != nil {
		return nil, err
	}
	// From an hour inside the retention (no partition is due to be dropped for an hour) to a
	// minute ago.
	start := now.Add(-apiRetention + time.Hour).Truncate(time.Millisecond)
	window := now.Add(-time.Minute).Truncate(time.Millisecond).Sub(start)
	pad := string(slices.Repeat([]byte{'x'}, o.payloadBytes))
	args := func(from, to, step int64) []any {
		return []any{from, to, step, start, window.Milliseconds(), o.apiLogRows, o.apiEndpoints, r.Tenants, pad}
	}
	parts := apiLayout(start, window, o.apiLogRows)
	r.Partitions = len(parts)
	var rowsTime, vacuumTime, attachTime time.Duration
	for i, p := range parts {
		name := pgx.Identifier{"webhook_delivery_log_" + p.lo.UTC().Format("20060102_150405")}.Sanitize()
		t0 := time.Now()
		// Created and filled in one transaction: with wal_level minimal (the throwaway
		// cluster) the rows are not written to the WAL.
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			b.db.stmts.Add(2)
			if _, err := tx.Exec(ctx, benchMark+`CREATE TABLE `+name+` (LIKE webhook_delivery_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
				WITH (autovacuum_freeze_min_age = 0)`); err != nil {
				return err
			}
			if p.to > p.from {
				if _, err := tx.Exec(ctx, benchMark+`INSERT INTO `+name+` (`+apiLogColumns+`) `+apiLogRows, args(p.from, p.to-1, 1)...); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("filling %s: %w", name, err)
		}
		t1 := time.Now()
		if err := exec(`VACUUM (FREEZE, ANALYZE) ` + name); err != nil {
			return nil, err
		}
		t2 := time.Now()
		if err := exec(fmt.Sprintf(`ALTER TABLE webhook_delivery_log ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
			name, p.lo.UTC().Format(time.RFC3339), p.hi.UTC().Format(time.RFC3339))); err != nil {
			return nil, err
		}
		t3 := time.Now()
		rowsTime, vacuumTime, attachTime = rowsTime+t1.Sub(t0), vacuumTime+t2.Sub(t1), attachTime+t3.Sub(t2)
		b.logf("  partition %d of %d: %d rows in %s (insert %s, vacuum %s, attach with indexes %s)", i+1, len(parts), p.to-p.from,
			t3.Sub(t0).Round(time.Millisecond), t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond), t3.Sub(t2).Round(time.Millisecond))
	}
	if r.DeadLetters > 0 {
		if err := exec(`INSERT INTO webhook_dead_letter (outbox_id, delivery_id, event_type, payload, attempts, last_status, last_error,
			reason, enqueued_at, failed_at, tenant, endpoint_id)
			SELECT id, delivery_id, event_type, payload, attempt, status_code, error, 'permanent failure: HTTP 410', enqueued_at,
			       processed_at, tenant, endpoint_id
			FROM (`+apiLogRows+`) AS x (`+apiLogColumns+`)`, args(apiBlockRows-1, o.apiLogRows-1, 10*apiBlockRows)...); err != nil {
			return nil, err
		}
	}
	// The partitioned parent has statistics only when analyzed itself: autovacuum never does.
	for _, sql := range []string{`ANALYZE webhook_delivery_log`, `ANALYZE webhook_dead_letter`, `ANALYZE webhook_endpoints`} {
		if err := exec(sql); err != nil {
			return nil, err
		}
	}
	// The steady flow's rows get ids above the fill's.
	if err := exec(`SELECT setval(pg_get_serial_sequence('webhook_outbox', 'id'),
		greatest($1::bigint, nextval(pg_get_serial_sequence('webhook_outbox', 'id'))))`, o.apiLogRows+1); err != nil {
		return nil, err
	}
	// The fill's dirty pages written out now rather than by a checkpoint during a measured
	// run; a server of DATABASE_URL may not let this role (pg_checkpoint): then not.
	_ = exec(`CHECKPOINT`)
	r.Fill = apiFill{Seconds: time.Since(started).Seconds(), RowsSeconds: rowsTime.Seconds(), VacuumSeconds: vacuumTime.Seconds(),
		AttachSeconds: attachTime.Seconds(), IndexBytes: map[string]int64{}}
	b.db.stmts.Add(2)
	if err := conn.QueryRow(ctx, benchMark+`SELECT coalesce(sum(pg_table_size(relid)), 0)::bigint
		FROM pg_partition_tree('webhook_delivery_log') WHERE isleaf`).Scan(&r.Fill.LogBytes); err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, benchMark+`SELECT i.indexrelid::regclass::text,
		       (SELECT coalesce(sum(pg_relation_size(t.relid)), 0)::bigint FROM pg_partition_tree(i.indexrelid) t)
		FROM pg_index i WHERE i.indrelid = 'webhook_delivery_log'::regclass`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name string
		var size int64
		if err := rows.Scan(&name, &size); err != nil {
			rows.Close()
			return nil, err
		}
		r.Fill.IndexBytes[name] = size
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	b.logf("  filled %d log rows (%d events, %d dead letters) in %d partitions in %s: log %s MB, indexes %v",
		o.apiLogRows, r.Events, r.DeadLetters, r.Partitions, time.Since(started).Round(time.Second),
		num(float64(r.Fill.LogBytes)/(1<<20), 0), r.Fill.IndexBytes)
	return keys, nil
}

// apiPlan is what the API clients read: the fill's events and endpoints, with each tenant's key.
type apiPlan struct {
	base      string // http://API_ADDR
	events    int64
	endpoints int
	tenants   int
	keys      []string
}

// request is the i-th request of a run: read i mod 3, on an event, endpoint or tenant drawn
// from rng, with its tenant's key.
func (p *apiPlan) request(i int, rng *rand.Rand) (read int, path, key string) {
	read = i % len(apiReads)
	switch read {
	case 0:
		e := rng.Int64N(p.events)
		ep := apiEndpointOf(e, p.endpoints)
		return read, "/v1/deliveries/" + apiDeliveryID(e), p.keys[ep%p.tenants]
	case 1:
		ep := rng.IntN(p.endpoints)
		return read, "/v1/endpoints/" + apiEndpointID(ep) + "/deliveries", p.keys[ep%p.tenants]
	default:
		return read, "/v1/dead-letters", p.keys[rng.IntN(p.tenants)]
	}
}

// apiRun is one steady run of the api workload, with the API (served by the dispatcher, read
// by the clients at --api-rate while the events flow) or without it.
func (b *bench) apiRun(ctx context.Context, plan *apiPlan, withAPI bool, seed uint64) (*apiRun, error) {
	o := b.opts
	overrides := map[string]string{"WEBHOOK_URL": "", "WEBHOOK_SECRET": "", "WEBHOOK_RETENTION": apiRetention.String()}
	run := &apiRun{API: withAPI}
	opt := latencyOptions{overrides: overrides, keepLog: true}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: apiWorkers}}
	defer client.CloseIdleConnections()
	if withAPI {
		addr, err := freeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		overrides["API_ADDR"] = addr
		p := *plan
		p.base = "http://" + addr
		opt.ready = func(ctx context.Context, s *session) error { return p.warmUp(ctx, client, s.disp) }
		opt.alongside = func(ctx context.Context) func() error {
			done := make(chan error, 1)
			go func() {
				var err error
				run.Reads, run.ClientLateness, err = p.load(ctx, client, o.apiRate, o.apiDuration, seed)
				done <- err
			}()
			return func() error { return <-done }
		}
	}
	total := max(int(float64(o.apiSteadyRate)*o.apiDuration.Seconds()), 1)
	period := time.Duration(float64(time.Second) / float64(o.apiSteadyRate))
	var err error
	if run.Steady, err = b.latencyRun(ctx, "api.steady", total, period, o.connections, opt); err != nil {
		return nil, err
	}
	line := fmt.Sprintf("  steady p50 %.2f ms, p99 %.2f ms, dispatcher %.0f µs/event", run.Steady.FromScheduled.P50,
		run.Steady.FromScheduled.P99, run.Steady.Cost.CPUMicrosPerEvent)
	for _, rd := range run.Reads {
		line += fmt.Sprintf("; %s p50 %.1f ms, p99 %.1f ms (%d, %d errors)", rd.Read, rd.Latency.P50, rd.Latency.P99, rd.Requests, rd.Errors)
	}
	b.logf("%s", line)
	return run, nil
}

// warmUp waits until the dispatcher's API answers, then makes each read several times from
// every client at once, unmeasured: the API's pool opens all its connections, whose backends
// load the catalog of the log's partitions and plan the reads, as in a running deployment.
// Without it the first requests of a run waited for new connections and their first plans,
// hundreds of milliseconds on a busy machine.
func (p *apiPlan) warmUp(ctx context.Context, client *http.Client, disp *dispatcherProc) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		status, err := p.get(ctx, client, "/v1/openapi.json", "")
		if err == nil && status == http.StatusOK {
			break
		}
		if disp.exited() {
			return disp.failure()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API at %s did not answer within 30 s: %v (status %d)", p.base, err, status)
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	for round := range 3 {
		errs := make(chan error, apiWorkers)
		for w := range apiWorkers {
			go func() {
				i := round*apiWorkers + w
				_, path, key := p.request(i, rand.New(rand.NewPCG(1<<32, uint64(i))))
				status, err := p.get(ctx, client, path, key)
				if err == nil && status != http.StatusOK {
					err = fmt.Errorf("status %d", status)
				}
				if err != nil {
					err = fmt.Errorf("warming up the API: GET %s: %w", path, err)
				}
				errs <- err
			}()
		}
		var first error
		for range apiWorkers {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		if first != nil {
			return first
		}
	}
	return nil
}

// get makes one request and reads its answer whole.
func (p *apiPlan) get(ctx context.Context, client *http.Client, path, key string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return 0, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return resp.StatusCode, err
	}
	return resp.StatusCode, nil
}

// load makes rate requests a second for duration from apiWorkers clients, on a fixed schedule
// (request i at start + i / rate, whichever client is free), and measures each from its start to
// the end of its answer. Anything but 200 is an error, counted per read.
func (p *apiPlan) load(ctx context.Context, client *http.Client, rate int, duration time.Duration, seed uint64) ([]apiReadResult, *percentiles, error) {
	total := max(int(float64(rate)*duration.Seconds()), 1)
	period := time.Duration(float64(time.Second) / float64(rate))
	type sample struct {
		read       int
		took, late time.Duration
		err        string
	}
	samples := make([]sample, total)
	var next atomic.Int64
	t0 := time.Now()
	var wg sync.WaitGroup
	for range apiWorkers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				sched := t0.Add(time.Duration(i) * period)
				if d := time.Until(sched); d > 0 && sleepCtx(ctx, d) != nil {
					return
				}
				read, path, key := p.request(i, rand.New(rand.NewPCG(seed, uint64(i))))
				start := time.Now()
				status, err := p.get(ctx, client, path, key)
				s := sample{read: read, took: time.Since(start), late: max(start.Sub(sched), 0)}
				switch {
				case err != nil:
					s.err = err.Error()
				case status != http.StatusOK:
					s.err = fmt.Sprintf("GET %s: status %d", path, status)
				}
				samples[i] = s
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	reads := make([]apiReadResult, len(apiReads))
	var late []time.Duration
	for i := range reads {
		reads[i].Read, reads[i].Route = apiReads[i].name, apiReads[i].route
	}
	for _, s := range samples {
		rd := &reads[s.read]
		rd.Requests++
		late = append(late, s.late)
		if s.err != "" {
			rd.Errors++
			if rd.FirstError == "" {
				rd.FirstError = s.err
			}
			continue
		}
		rd.samples = append(rd.samples, s.took)
	}
	for i := range reads {
		reads[i].Latency = summarize(reads[i].samples)
	}
	lateness := summarize(late)
	return reads, &lateness, nil
}

// pool sums the runs up per side, and the reads over the runs with the API.
func (r *apiResult) pool() {
	r.Reads = make([]apiReadResult, len(apiReads))
	for i := range r.Reads {
		r.Reads[i].Read, r.Reads[i].Route = apiReads[i].name, apiReads[i].route
	}
	type side struct {
		arm                  *apiArm
		latencies, commits   []time.Duration
		cpu, pgCPU, pgEvents float64
		pgOK                 bool
		machine, other, secs float64
	}
	without, with := &side{arm: &r.Without, pgOK: true}, &side{arm: &r.With, pgOK: true}
	requests := 0
	for _, run := range r.Runs {
		sd := without
		if run.API {
			sd = with
		}
		st := run.Steady
		sd.arm.Runs++
		sd.arm.Lost += st.Lost
		sd.arm.Rejected += st.Rejected
		sd.latencies = append(sd.latencies, st.fromScheduled...)
		sd.commits = append(sd.commits, st.fromCommit...)
		if c := st.Cost; c != nil {
			sd.arm.Events += c.Events
			sd.cpu += c.CPUMicrosPerEvent * float64(c.Events)
			sd.machine += c.CPU.Machine * c.CPU.Seconds
			sd.other += c.CPU.Other * c.CPU.Seconds
			sd.secs += c.CPU.Seconds
			if c.PostgresCPUMicrosPerEvent != nil {
				sd.pgCPU += *c.PostgresCPUMicrosPerEvent * float64(c.Events)
				sd.pgEvents += float64(c.Events)
			} else {
				sd.pgOK = false
			}
		}
		for i, rd := range run.Reads {
			p := &r.Reads[i]
			p.Requests += rd.Requests
			p.Errors += rd.Errors
			requests += rd.Requests
			if p.FirstError == "" {
				p.FirstError = rd.FirstError
			}
			p.samples = append(p.samples, rd.samples...)
		}
	}
	for _, sd := range []*side{without, with} {
		sd.arm.FromScheduled, sd.arm.FromCommit = summarize(sd.latencies), summarize(sd.commits)
		if sd.secs > 0 {
			sd.arm.MachineCPUs, sd.arm.OtherCPUs = sd.machine/sd.secs, sd.other/sd.secs
		}
		if sd.arm.Events > 0 {
			sd.arm.CPUMicrosPerEvent = sd.cpu / float64(sd.arm.Events)
		}
		if sd.pgOK && sd.pgEvents > 0 {
			v := sd.pgCPU / sd.pgEvents
			sd.arm.PostgresCPUMicrosPerEvent = &v
		}
	}
	for i := range r.Reads {
		r.Reads[i].Latency = summarize(r.Reads[i].samples)
	}
	ratio := func(a, b float64) *float64 {
		if a <= 0 || b <= 0 {
			return nil
		}
		v := a / b
		return &v
	}
	if r.With.FromScheduled.N > 0 && r.Without.FromScheduled.N > 0 {
		r.P99Ratio = ratio(r.With.FromScheduled.P99, r.Without.FromScheduled.P99)
		r.P50Ratio = ratio(r.With.FromScheduled.P50, r.Without.FromScheduled.P50)
	}
	r.CPURatio = ratio(r.With.CPUMicrosPerEvent, r.Without.CPUMicrosPerEvent)
	// Only a rise is an estimate: on a machine short of CPU the dispatcher batches more and
	// spends less per event, with the API or not.
	if r.CPURatio != nil && requests > 0 && r.With.CPUMicrosPerEvent > r.Without.CPUMicrosPerEvent {
		v := (r.With.CPUMicrosPerEvent - r.Without.CPUMicrosPerEvent) * float64(r.With.Events) / float64(requests)
		r.APICPUMicrosPerRequest = &v
	}
	if w, a := r.Without.PostgresCPUMicrosPerEvent, r.With.PostgresCPUMicrosPerEvent; w != nil && a != nil && requests > 0 && *a > *w {
		v := (*a - *w) * float64(r.With.Events) / float64(requests)
		r.PostgresCPUMicrosPerRequest = &v
	}
}

// check adds the api workload's budget lines: each read's p99, no failed request, the steady
// flow's p99 and CPU per event with the API within 10% of without, nothing lost.
func (r *apiResult) check(add func(workload, what string, value float64, unit, budget string, ok bool),
	notComputed func(workload, what string, value *float64, unit, budget, reason string)) {
	for _, rd := range r.Reads {
		what := apiReadCheck(rd.Read)
		if rd.Latency.N == 0 {
			notComputed("api", what, nil, "ms", "≤ 50", "no request answered")
			continue
		}
		add("api", what, rd.Latency.P99, "ms", "≤ 50", rd.Latency.P99 <= apiBudgetMS)
	}
	errs := 0
	for _, rd := range r.Reads {
		errs += rd.Errors
	}
	add("api", "API requests failed", float64(errs), "", "0", errs == 0)
	ratioCheck := func(what string, v *float64, reason string) {
		if v == nil {
			notComputed("api", what, nil, "", "≤ 1.10", reason)
			return
		}
		add("api", what, *v, "", "≤ 1.10", *v <= apiBudgetRatio)
	}
	ratioCheck(apiP99Check, r.P99Ratio, "a side had no event arrive")
	ratioCheck(apiCPUCheck, r.CPURatio, "a side had no CPU measured")
	lost := r.Without.Lost + r.With.Lost + r.Without.Rejected + r.With.Rejected
	add("api", "lost", float64(r.Without.Lost+r.With.Lost), "", "0", lost == 0)
}

// The api workload's budget lines.
const (
	apiP99Check = "steady p99, with the API / without"
	apiCPUCheck = "dispatcher CPU per event, with the API / without"
)

func apiReadCheck(read string) string { return read + " p99" }

// writeRows prints the api workload's rows of the report's table.
func (r *apiResult) writeRows(tw io.Writer, verdict func(workload, what string) string) {
	idx := make([]string, 0, len(r.Fill.IndexBytes))
	for name, size := range r.Fill.IndexBytes {
		idx = append(idx, fmt.Sprintf("%s %s MB", name, num(float64(size)/(1<<20), 0)))
	}
	slices.Sort(idx)
	fmt.Fprintf(tw, "api\t%s log rows (%s events to %s endpoints of %d tenants, %s dead letters) in %d partitions\tfilled in %.0f s\t\n",
		num(float64(r.LogRows), 0), num(float64(r.Events), 0), num(float64(r.Endpoints), 0), r.Tenants, num(float64(r.DeadLetters), 0),
		r.Partitions, r.Fill.Seconds)
	fmt.Fprintf(tw, "\t  fill: insert, vacuum, attach (builds the indexes)\t%.0f, %.0f, %.0f s\t\n", r.Fill.RowsSeconds, r.Fill.VacuumSeconds, r.Fill.AttachSeconds)
	fmt.Fprintf(tw, "\t  log heap; indexes\t%s MB; %s\t\n", num(float64(r.Fill.LogBytes)/(1<<20), 0), strings.Join(idx, ", "))
	fmt.Fprintf(tw, "\t  %s; %s requests/s in turn while %s events/s flow, %d pairs of %.0f s runs without, with\t\t\n",
		r.Serving, num(r.RequestRate, 0), num(r.SteadyRate, 0), r.Pairs, r.DurationSeconds)
	for _, rd := range r.Reads {
		fmt.Fprintf(tw, "\t  %s (%s), %d requests: p50, p99, max\t%s, %s, %s ms\t%s\n", rd.Read, rd.Route, rd.Requests,
			ms(rd.Latency.P50), ms(rd.Latency.P99), ms(rd.Latency.Max), verdict("api", apiReadCheck(rd.Read)))
	}
	errs := 0
	for _, rd := range r.Reads {
		errs += rd.Errors
	}
	fmt.Fprintf(tw, "\t  requests failed\t%d\t%s\n", errs, verdict("api", "API requests failed"))
	ratioText := func(v *float64) string {
		if v == nil {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", *v)
	}
	w, a := r.Without, r.With
	fmt.Fprintf(tw, "\t  steady p50 without, with the API\t%s, %s ms (%s)\t\n", ms(w.FromScheduled.P50), ms(a.FromScheduled.P50), ratioText(r.P50Ratio))
	fmt.Fprintf(tw, "\t  steady p99 without, with the API\t%s, %s ms (%s)\t%s\n", ms(w.FromScheduled.P99), ms(a.FromScheduled.P99), ratioText(r.P99Ratio), verdict("api", apiP99Check))
	fmt.Fprintf(tw, "\t  steady commit → arrival p50, p99 without; with the API\t%s, %s; %s, %s ms\t\n", ms(w.FromCommit.P50), ms(w.FromCommit.P99),
		ms(a.FromCommit.P50), ms(a.FromCommit.P99))
	fmt.Fprintf(tw, "\t  machine's CPUs busy without, with the API (of which other programs)\t%.2f (%.2f), %.2f (%.2f)\t\n", w.MachineCPUs, w.OtherCPUs,
		a.MachineCPUs, a.OtherCPUs)
	fmt.Fprintf(tw, "\t  dispatcher CPU per event without, with the API (with: the API's too)\t%.0f, %.0f µs (%s)\t%s\n",
		w.CPUMicrosPerEvent, a.CPUMicrosPerEvent, ratioText(r.CPURatio), verdict("api", apiCPUCheck))
	if v := r.APICPUMicrosPerRequest; v != nil {
		fmt.Fprintf(tw, "\t  the API's CPU per request, estimated (extra CPU / requests)\t%.0f µs\t\n", *v)
	}
	if v := r.PostgresCPUMicrosPerRequest; v != nil {
		fmt.Fprintf(tw, "\t  PostgreSQL's CPU per request, estimated (extra CPU / requests)\t%.0f µs\t\n", *v)
	}
	for k, run := range r.Runs {
		side := "without"
		if run.API {
			side = "with"
		}
		c := run.Steady.Cost
		line := fmt.Sprintf("\t  run %d, %s: steady p50, p99; dispatcher CPU; machine busy (other)\t%s, %s ms; %.0f µs/event; %.2f (%.2f) CPUs", k+1, side,
			ms(run.Steady.FromScheduled.P50), ms(run.Steady.FromScheduled.P99), c.CPUMicrosPerEvent, c.CPU.Machine, c.CPU.Other)
		for _, rd := range run.Reads {
			line += fmt.Sprintf("; %s p99 %s", rd.Read, ms(rd.Latency.P99))
		}
		fmt.Fprintln(tw, line+"\t")
	}
	fmt.Fprintf(tw, "\t  lost, rejected\t%d, %d\t%s\n", w.Lost+a.Lost, w.Rejected+a.Rejected, verdict("api", "lost"))
}
