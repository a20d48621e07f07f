package settle_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/dispatcher"
	"github.com/fluxora/fluxhook/stages/settle"
)

// BenchmarkSettleDeliveryIDIndex measures what the delivery log's index on delivery_id
// (schema 15) costs a settle: the settle statement of delivered rows, each with a short answer
// kept, into a log of 200,000 rows, per batch size (1: a steady trickle; 100: a backlog's
// drain). Two databases, one with the index and one without it, are settled into alternately,
// batch by batch, so that both see the same moments of a shared machine; it reports the median
// µs per row of each and the median of the pairs' differences, which a stall of the shared
// server (a checkpoint, another database's vacuum) moves less than a mean. Run:
//
//	go test -run XXX -bench SettleDeliveryIDIndex -benchtime 2000x ./stages/settle/
func BenchmarkSettleDeliveryIDIndex(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			with, without := settleBench(b, batch, true), settleBench(b, batch, false)
			// One batch each first, untimed: the first insert into the log opens its partition
			// and the partition's indexes, which the backend then keeps.
			with.settle(b)
			without.settle(b)
			with.took, without.took = nil, nil
			b.ResetTimer()
			for i := range b.N {
				first, second := with, without
				if i%2 == 1 {
					first, second = without, with
				}
				first.settle(b)
				second.settle(b)
			}
			b.StopTimer()
			diffs := make([]time.Duration, b.N)
			for i := range diffs {
				diffs[i] = with.took[i] - without.took[i]
			}
			perRow := func(ds []time.Duration) float64 {
				slices.Sort(ds)
				return float64(ds[len(ds)/2].Nanoseconds()) / 1e3 / float64(batch)
			}
			b.ReportMetric(perRow(diffs), "index-µs/row")
			b.ReportMetric(perRow(with.took), "with-µs/row")
			b.ReportMetric(perRow(without.took), "without-µs/row")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// settleRun is one database of BenchmarkSettleDeliveryIDIndex: its settler, its leased rows
// not settled yet (b.N+1 batches at first) and the time its settles took.
type settleRun struct {
	s     *settle.Settler
	rows  []*delivery.Delivery
	batch int
	took  []time.Duration // of each settle
}

// settle settles the next batch of r's rows, timing it.
func (r *settleRun) settle(b *testing.B) {
	next := r.rows[:r.batch]
	r.rows = r.rows[r.batch:]
	t := time.Now()
	res, err := r.s.Settle(context.Background(), next)
	r.took = append(r.took, time.Since(t))
	if err != nil || res.Settled != r.batch {
		b.Fatalf("settle = %+v, %v; want %d settled", res, err, r.batch)
	}
}

func settleBench(b *testing.B, batch int, index bool) *settleRun {
	ctx := context.Background()
	db := sqltest.NewMigrated(b)
	setup := []string{
		`SELECT webhook_delivery_log_maintain('7 days', '1 day', '2 days')`,
		// A log that is not empty: the index's inserts descend a tree of some depth.
		`INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, processed_at)
		 SELECT -i, 'bench', '{}', now(), gen_random_uuid(), 1, now(), now() FROM generate_series(1, 200000) i`,
	}
	if !index {
		setup = append(setup, `DROP INDEX webhook_delivery_log_delivery_id_idx`)
	}
	setup = append(setup, `VACUUM ANALYZE webhook_delivery_log`)
	for _, q := range setup {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	rows, err := db.Pool.Query(ctx, `
		INSERT INTO webhook_outbox (event_type, payload, lease_until, leased_by, lease_token)
		SELECT 'bench', jsonb_build_object('i', i, 'pad', repeat('x', 200)), now() + interval '1 hour', 'bench', 7
		FROM generate_series(1, $1) i
		RETURNING id`, (b.N+1)*batch)
	if err != nil {
		b.Fatal(err)
	}
	run := &settleRun{batch: batch}
	for rows.Next() {
		d := &delivery.Delivery{LeaseToken: 7, Attempt: 1,
			Outcome: delivery.Outcome{Kind: delivery.Delivered, Status: 200, Duration: time.Millisecond,
				Excerpt: `{"received":true}`, Excerpted: true}}
		if err := rows.Scan(&d.ID); err != nil {
			b.Fatal(err)
		}
		run.rows = append(run.rows, d)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE webhook_outbox`); err != nil {
		b.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	dispatcher.SessionParams(cfg.ConnConfig.RuntimeParams, false) // generic plans, asynchronous commit
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	run.s = settle.New(pool, settle.Config{InstanceID: "bench"})
	if err := run.s.Warm(ctx, false); err != nil {
		b.Fatal(err)
	}
	return run
}
