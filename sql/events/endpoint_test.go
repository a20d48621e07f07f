package events

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

const (
	acmeEP   = "aaaaaaaa-0000-4000-8000-00000000000a"
	acmeEP2  = "aaaaaaaa-0000-4000-8000-00000000000b"
	globexEP = "bbbbbbbb-0000-4000-8000-00000000000a"
)

func ptr[T any](v T) *T { return &v }

// epFixture is a migrated database whose delivery log has three hourly partitions before cut
// (and the default partition after it), with the endpoints above.
type epFixture struct {
	t    *testing.T
	db   *sqltest.DB
	cut  time.Time
	next int64
}

func newEPFixture(t *testing.T) *epFixture {
	t.Helper()
	f := &epFixture{t: t, db: sqltest.NewMigrated(t), cut: time.Now().UTC().Truncate(time.Hour), next: 1000}
	for i := 3; i >= 1; i-- {
		lo := f.cut.Add(-time.Duration(i) * time.Hour)
		f.exec(fmt.Sprintf(`CREATE TABLE webhook_delivery_log_t%d PARTITION OF webhook_delivery_log FOR VALUES FROM ('%s') TO ('%s')`,
			i, lo.Format(time.RFC3339), lo.Add(time.Hour).Format(time.RFC3339)))
	}
	for _, e := range []struct{ id, tenant string }{{acmeEP, "acme"}, {acmeEP2, "acme"}, {globexEP, "globex"}} {
		f.exec(`INSERT INTO webhook_endpoints (id, url, secret, tenant) VALUES ($1::uuid, 'https://consumer.example/' || $1, 's', $2)`,
			e.id, e.tenant)
	}
	return f
}

func (f *epFixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.db.Pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// logRow writes a settled attempt of a new event to endpoint ep with row id id.
func (f *epFixture) logRow(id int64, ep, tenant, eventType string, at time.Time, status int) string {
	f.t.Helper()
	did := fmt.Sprintf("%08x-0000-4000-8000-%012x", id, id)
	var errText *string
	if status >= 300 {
		errText = ptr(fmt.Sprintf("HTTP %d", status))
	}
	f.exec(`INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at,
		processed_at, status_code, error, duration_ms, tenant, endpoint_id)
		VALUES ($1, $2, '{}', $3, $4::uuid, 1, $3, $5, $6, $7, 12, $8, $9::uuid)`,
		id, eventType, at.Add(-time.Second), did, at, status, errText, tenant, ep)
	return did
}

// ids are a page's (time, id) keys, as text for the failure messages.
func keys(ds []Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = fmt.Sprintf("%s/%d/%s", d.At.UTC().Format(time.RFC3339Nano), d.ID, d.Status)
	}
	return out
}

// pages reads every page of eq, limit rows at a time, through the cursor.
func pages(t *testing.T, q Batcher, eq EndpointQuery, limit int) []Delivery {
	t.Helper()
	var all []Delivery
	eq.Limit = limit
	for range 1000 {
		page, err := EndpointDeliveries(context.Background(), q, eq)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > limit {
			t.Fatalf("a page of %d rows; limit %d", len(page), limit)
		}
		all = append(all, page...)
		if len(page) < limit {
			return all
		}
		last := page[len(page)-1]
		eq.AfterAt, eq.AfterID = last.At, last.ID
	}
	t.Fatal("more than 1000 pages")
	return nil
}

// TestEndpointDeliveriesPagesAcrossPartitions pages an endpoint's rows spread over three
// partitions and the default one, with settles of several rows at one processed_at (ids out
// of time order), failures, a dead letter, a parked row and retries waiting in the queue, at
// every page size: the pages joined are exactly every row in scope, newest first, each once;
// filters and bounds keep exactly their rows.
func TestEndpointDeliveriesPagesAcrossPartitions(t *testing.T) {
	t.Parallel()
	f := newEPFixture(t)
	rng := rand.New(rand.NewPCG(7, 34))
	type want struct {
		at     time.Time
		id     int64
		status string
		typ    string
		tenant string
	}
	var acme []want
	// 120 rows over the three partitions and the default one (after cut), in settles of 1 to
	// 4 rows sharing processed_at; ids shuffled so that id order is not time order.
	ids := rng.Perm(120)
	at := f.cut.Add(-3 * time.Hour).Add(time.Minute)
	for n := 0; n < 120; {
		size := min(1+rng.IntN(4), 120-n)
		for range size {
			id := int64(10_000 + ids[n])
			typ := []string{"order.paid", "order.created"}[id%2]
			status, code := "delivered", 200
			switch id % 7 {
			case 3:
				status, code = "failed", 503
			case 5:
				status, code = "dead_lettered", 410
			}
			did := f.logRow(id, acmeEP, "acme", typ, at, code)
			if status == "dead_lettered" {
				f.exec(`INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, last_status, reason,
					enqueued_at, failed_at, tenant, endpoint_id) VALUES ($1::uuid, $2, '{}', 1, 410, 'gone', $3, $3, 'acme', $4::uuid)`,
					did, typ, at, acmeEP)
			}
			acme = append(acme, want{at, id, status, typ, "acme"})
			n++
		}
		at = at.Add(time.Duration(2+rng.IntN(6)) * time.Minute) // past cut: the default partition
	}
	// Other rows the page must not show: another endpoint's, another tenant's, and one of
	// this endpoint under another tenant (the scope is checked on the rows too).
	f.logRow(20_001, acmeEP2, "acme", "order.paid", f.cut.Add(-90*time.Minute), 200)
	f.logRow(20_002, globexEP, "globex", "order.paid", f.cut.Add(-90*time.Minute), 200)
	f.logRow(20_003, acmeEP, "globex", "order.paid", f.cut.Add(-89*time.Minute), 200)
	acme = append(acme, want{f.cut.Add(-89 * time.Minute), 20_003, "delivered", "order.paid", "globex"})
	// The queue: a retry due in ten minutes, one overdue, and a row parked by a stopped stream
	// (its time is its dead letter's).
	queue := func(due time.Time, typ string) int64 {
		var id int64
		if err := f.db.Pool.QueryRow(context.Background(), `INSERT INTO webhook_outbox (event_type, payload, created_at, delivery_id,
			attempt, enqueued_at, tenant, endpoint_id, routed_at) VALUES ($1, '{}', $2, gen_random_uuid(), 2, $3, 'acme', $4::uuid, $3)
			RETURNING id`, typ, due, f.cut.Add(-2*time.Hour), acmeEP).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	now := time.Now()
	acme = append(acme, want{now.Add(10 * time.Minute).Truncate(time.Microsecond), queue(now.Add(10*time.Minute), "order.paid"), "pending", "order.paid", "acme"})
	acme = append(acme, want{now.Add(-time.Minute).Truncate(time.Microsecond), queue(now.Add(-time.Minute), "order.created"), "pending", "order.created", "acme"})
	parkedAt := f.cut.Add(-150 * time.Minute)
	parked := queue(time.Now(), "order.paid")
	f.exec(`UPDATE webhook_outbox SET created_at = 'infinity', status_code = 500 WHERE id = $1`, parked)
	f.exec(`INSERT INTO webhook_dead_letter (outbox_id, delivery_id, event_type, payload, attempts, reason, enqueued_at, failed_at,
		tenant, endpoint_id) SELECT id, delivery_id, event_type, payload, 2, 'stream stopped', enqueued_at, $2, tenant, endpoint_id
		FROM webhook_outbox WHERE id = $1`, parked, parkedAt)
	acme = append(acme, want{parkedAt, parked, "dead_lettered", "order.paid", "acme"})
	f.exec(`ANALYZE webhook_delivery_log`)
	slices.SortFunc(acme, func(a, b want) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return int(b.id - a.id)
	})
	expect := func(scope *string, keep func(want) bool) []string {
		var out []string
		for _, w := range acme {
			if (scope == nil || *scope == w.tenant) && keep(w) {
				out = append(out, fmt.Sprintf("%s/%d/%s", w.at.UTC().Format(time.RFC3339Nano), w.id, w.status))
			}
		}
		return out
	}
	since := f.cut.Add(-4 * time.Hour)
	until := f.cut.Add(-time.Hour).Add(30 * time.Minute)
	cases := []struct {
		name string
		eq   EndpointQuery
		keep func(want) bool
	}{
		{"every row", EndpointQuery{Scope: ptr("acme")}, func(want) bool { return true }},
		{"admin", EndpointQuery{}, func(want) bool { return true }},
		{"until", EndpointQuery{Scope: ptr("acme"), Until: until}, func(w want) bool { return w.at.Before(until) }},
		{"since", EndpointQuery{Scope: ptr("acme"), Since: until}, func(w want) bool { return !w.at.Before(until) }},
		{"failed", EndpointQuery{Scope: ptr("acme"), Status: ptr("failed")}, func(w want) bool { return w.status == "failed" }},
		{"dead_lettered", EndpointQuery{Scope: ptr("acme"), Status: ptr("dead_lettered")}, func(w want) bool { return w.status == "dead_lettered" }},
		{"pending", EndpointQuery{Scope: ptr("acme"), Status: ptr("pending")}, func(w want) bool { return w.status == "pending" }},
		{"event type", EndpointQuery{Scope: ptr("acme"), EventType: ptr("order.created")}, func(w want) bool { return w.typ == "order.created" }},
	}
	for _, c := range cases {
		c.eq.EndpointID = acmeEP
		if c.eq.Since.IsZero() {
			c.eq.Since = since
		}
		wantKeys := expect(c.eq.Scope, c.keep)
		for _, limit := range []int{1, 2, 3, 7, 50, 500} {
			got := keys(pages(t, f.db.Pool, c.eq, limit))
			if i := firstDifference(got, wantKeys); i >= 0 {
				t.Errorf("%s, pages of %d: %d rows, %d wanted; from row %d:\n got %v\nwant %v", c.name, limit,
					len(got), len(wantKeys), i, got[i:min(i+5, len(got))], wantKeys[i:min(i+5, len(wantKeys))])
			}
		}
	}
	// Another tenant's scope sees nothing of an endpoint that is not its own, not even a row
	// under its name; nor does any scope see an endpoint that no longer exists, whose rows the
	// log keeps.
	f.logRow(20_004, "aaaaaaaa-0000-4000-8000-0000000000ff", "acme", "order.paid", f.cut.Add(-89*time.Minute), 200)
	for _, eq := range []EndpointQuery{{EndpointID: acmeEP, Scope: ptr("globex")}, {EndpointID: "aaaaaaaa-0000-4000-8000-0000000000ff"}, {EndpointID: "aaaaaaaa-0000-4000-8000-0000000000ff", Scope: ptr("acme")}} {
		eq.Since, eq.Limit = since, 50
		got, err := EndpointDeliveries(context.Background(), f.db.Pool, eq)
		if err != nil || len(got) != 0 {
			t.Errorf("%+v = %v, %v; want nothing", eq, keys(got), err)
		}
	}
}

// firstDifference is the first index where got and want differ, -1 when they are equal.
func firstDifference(got, want []string) int {
	for i := range max(len(got), len(want)) {
		if i >= len(got) || i >= len(want) || got[i] != want[i] {
			return i
		}
	}
	return -1
}

// genericPool is a pool on db whose statements always get a generic plan.
func genericPool(t *testing.T, db *sqltest.DB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestEndpointDeliveriesReadsAPage: a page of an endpoint with many rows over several
// partitions reads about a page of its rows from the log, whatever the range, with the
// generic plan EndpointDeliveries uses and with a custom plan: the statement walks the
// endpoint's index back from the cursor and stops, where reading the range and sorting it
// would read every row.
func TestEndpointDeliveriesReadsAPage(t *testing.T) {
	t.Parallel()
	f := newEPFixture(t)
	// 6,000 rows of the endpoint, one a second over the three partitions and after them, and
	// as many of another endpoint.
	f.exec(`INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at,
		processed_at, status_code, duration_ms, tenant, endpoint_id)
		SELECT i, 'order.paid', '{}', ts, gen_random_uuid(), 1, ts, ts, CASE WHEN i % 10 = 0 THEN 503 ELSE 200 END, 12,
		       'acme', CASE WHEN i % 2 = 0 THEN $2::uuid ELSE $3::uuid END
		FROM generate_series(1, 12000) i, LATERAL (SELECT $1::timestamptz + i * interval '1 second' AS ts) t`,
		f.cut.Add(-3*time.Hour), acmeEP, acmeEP2)
	f.exec(`ANALYZE webhook_delivery_log`)
	const limit = 51
	cursorAt := f.cut.Add(-100 * time.Minute)
	for _, pool := range []struct {
		name string
		q    *pgxpool.Pool
	}{{"custom", f.db.Pool}, {"generic", genericPool(t, f.db)}} {
		for _, c := range []struct {
			name   string
			after  any
			status any
		}{{"first page", nil, nil}, {"a page behind a cursor", cursorAt, nil}, {"failed only", cursorAt, "failed"}} {
			var afterID any
			if c.after != nil {
				afterID = int64(1 << 40)
			}
			var plan []byte
			if err := explain(pool.q, &plan, acmeEP, c.after, afterID, c.status, f.cut.Add(-4*time.Hour), limit); err != nil {
				t.Fatal(err)
			}
			read := logRowsRead(t, plan)
			// A page of failures (one row in ten) reads ten rows a failure.
			budget := 2 * limit
			if c.status != nil {
				budget = 12 * limit
			}
			if read > budget || read < limit {
				t.Errorf("%s plan, %s: %d log rows read for a page of %d; want at most %d\n%s", pool.name, c.name, read, limit, budget, plan)
			}
		}
	}
}

// explain explains endpoint.sql prepared on a connection of pool, with its parameters, as the
// driver prepares it.
func explain(pool *pgxpool.Pool, plan *[]byte, ep string, after, afterID, status any, since time.Time, limit int) error {
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "PREPARE ep_page(uuid, text, text, text, timestamptz, timestamptz, timestamptz, bigint, bigint) AS "+endpointSQL); err != nil {
		return err
	}
	defer conn.Exec(ctx, "DEALLOCATE ep_page") //nolint:errcheck // the connection goes back to the pool either way
	// EXPLAIN EXECUTE takes no parameters of its own: the values are written into its text.
	return conn.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE ep_page($1, $2, $3, $4, $5, $6, $7, $8, $9)",
		pgx.QueryExecModeSimpleProtocol, ep, "acme", status, nil, since, nil, after, afterID, limit).Scan(plan)
}

// logRowsRead sums the rows the plan's scans of the log's partitions returned or filtered out.
func logRowsRead(t *testing.T, plan []byte) int {
	t.Helper()
	var doc []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &doc); err != nil || len(doc) != 1 {
		t.Fatalf("plan %s: %v", plan, err)
	}
	var walk func(n map[string]any) int
	walk = func(n map[string]any) int {
		total := 0
		if rel, _ := n["Relation Name"].(string); strings.HasPrefix(rel, "webhook_delivery_log") {
			loops, _ := n["Actual Loops"].(float64)
			rows, _ := n["Actual Rows"].(float64)
			removed, _ := n["Rows Removed by Filter"].(float64)
			total += int((rows + removed) * max(loops, 1))
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				total += walk(m)
			}
		}
		return total
	}
	return walk(doc[0].Plan)
}

// TestReadsUseTheGenericPlanAtOnce: the reads of an endpoint's deliveries and of one event
// are planned once per connection (the generic plan) from their first execution, and the
// setting that asks for it ends with them: the connection's next statements plan as before.
func TestReadsUseTheGenericPlanAtOnce(t *testing.T) {
	t.Parallel()
	f := newEPFixture(t)
	did := f.logRow(1, acmeEP, "acme", "order.paid", f.cut.Add(-90*time.Minute), 200)
	cfg, err := pgxpool.ParseConfig(f.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for range 2 {
		if got, err := EndpointDeliveries(context.Background(), pool, EndpointQuery{EndpointID: acmeEP, Scope: ptr("acme"),
			Since: f.cut.Add(-4 * time.Hour), Limit: 10}); err != nil || len(got) != 1 {
			t.Fatalf("EndpointDeliveries = %v, %v", keys(got), err)
		}
		if d, err := Get(context.Background(), pool, did, ptr("acme"), false); err != nil || len(d.Destinations) != 1 {
			t.Fatalf("Get = %+v, %v", d, err)
		}
	}
	var mode string
	var custom, generic int64
	if err := pool.QueryRow(context.Background(), `SELECT current_setting('plan_cache_mode'), coalesce(sum(custom_plans), 0)::bigint,
		coalesce(sum(generic_plans), 0)::bigint
		FROM pg_prepared_statements WHERE statement LIKE '%webhook_delivery_log%' AND statement NOT LIKE '%pg_prepared_statements%'`).
		Scan(&mode, &custom, &generic); err != nil {
		t.Fatal(err)
	}
	if mode != "auto" || custom != 0 || generic != 4 {
		t.Errorf("plan_cache_mode %q after the reads, %d custom and %d generic plans; want auto, 0 and 4", mode, custom, generic)
	}
}
