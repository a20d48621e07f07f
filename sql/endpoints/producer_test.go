package endpoints_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestProducersNeverReadTheEndpoints: fan-out costs producers nothing. With endpoints in the
// table (of the event's tenant and of none, with and without filters), a producer's
// transaction, through outbox.Enqueue or a plain INSERT, touches webhook_outbox alone: it
// reads no endpoint and writes no delivery row (pg_stat_xact_user_tables, the transaction's
// own counters). Routing is the dispatcher's, after the commit; a trigger that fanned out in
// the producer's transaction would fail here.
func TestProducersNeverReadTheEndpoints(t *testing.T) {
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, "", "")
	for i, n := range []endpoints.New{
		{URL: "https://a.example/hooks"},
		{URL: "https://b.example/hooks", EventTypes: []string{"order.*"}},
		{URL: "https://c.example/hooks", Tenant: "acme"},
		{URL: "https://d.example/hooks", Tenant: "acme", EventTypes: []string{"order.created"}},
	} {
		n.Description = fmt.Sprint("endpoint ", i)
		mustAdd(t, db, c, n)
	}
	for _, tc := range []struct {
		name    string
		events  int64
		produce func(tx pgx.Tx) error
	}{
		{"outbox.Enqueue with a tenant", 1, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Event{EventType: "order.created", Payload: map[string]any{"n": 1}, Tenant: "acme"})
			return err
		}},
		{"outbox.Enqueue without a tenant", 1, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Event{EventType: "order.created", Payload: map[string]any{"n": 1}})
			return err
		}},
		{"plain INSERT of two events", 2, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, tenant)
				VALUES ('order.created', '{}', 'acme'), ('order.paid', '{}', NULL)`)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			// The counters also hold this backend's earlier transactions until it flushes
			// them (at most once a second), never within a transaction: the difference
			// across the producing statements is theirs alone.
			before := tableActivity(t, tx)
			if err := tc.produce(tx); err != nil {
				t.Fatalf("producing: %v", err)
			}
			// Deferred constraint triggers would fire at the commit, after the counting.
			if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
				t.Fatal(err)
			}
			var outboxWrites int64
			for rel, after := range tableActivity(t, tx) {
				scans, writes := after[0]-before[rel][0], after[1]-before[rel][1]
				switch {
				case rel == "webhook_outbox":
					outboxWrites = writes
				case scans > 0 || writes > 0:
					t.Errorf("the producer's transaction touched %s: %d scans, %d rows written; want webhook_outbox alone", rel, scans, writes)
				}
			}
			if outboxWrites != tc.events {
				t.Errorf("%d rows written to webhook_outbox, want the %d events alone (no delivery rows)", outboxWrites, tc.events)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("commit: %v", err)
			}
		})
	}
}

// tableActivity is each fluxhook table's scans and rows written as tx's backend counts them.
func tableActivity(t *testing.T, tx pgx.Tx) map[string][2]int64 {
	t.Helper()
	rows, err := tx.Query(context.Background(), `SELECT relname, coalesce(seq_scan, 0) + coalesce(idx_scan, 0), n_tup_ins + n_tup_upd + n_tup_del
		FROM pg_stat_xact_user_tables WHERE relname LIKE 'webhook%'`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	for rows.Next() {
		var rel string
		var scans, writes int64
		if err := rows.Scan(&rel, &scans, &writes); err != nil {
			t.Fatal(err)
		}
		got[rel] = [2]int64{scans, writes}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}
