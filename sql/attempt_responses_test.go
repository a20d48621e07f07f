package sql_test

import (
	"context"
	"slices"
	"testing"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// Schema 15 indexes the delivery log by delivery_id on the partitioned parent, so that
// partitions made later get the index when attached; it builds nothing an operator already
// has: an index of the parent that leads with delivery_id, or the partitions' own indexes
// built concurrently beforehand (docs/upgrading.md), which it attaches.
func TestDeliveryIDIndex(t *testing.T) {
	t.Parallel()
	// before prepares a schema-14 database that has log partitions with rows.
	before := func(t *testing.T) *sqltest.DB {
		t.Helper()
		db := sqltest.NewMigratedTo(t, 14)
		ctx := context.Background()
		for _, q := range []string{
			`SELECT webhook_delivery_log_maintain('7 days', '1 day', '2 days')`,
			`INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, processed_at)
			 SELECT i, 'e', '{}', now(), gen_random_uuid(), 1, now(), now() FROM generate_series(1, 100) i`,
		} {
			if _, err := db.Pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		return db
	}
	migrate := func(t *testing.T, db *sqltest.DB) {
		t.Helper()
		if _, err := fluxsql.Migrate(context.Background(), db.Pool); err != nil {
			t.Fatal(err)
		}
	}
	// indexes lists the indexes on delivery_id of rel, with the parent index each is attached to.
	indexes := func(t *testing.T, db *sqltest.DB, rel string) []string {
		t.Helper()
		return queryStrings(t, db, `
			SELECT i.indexrelid::regclass::text || coalesce(' of ' || h.inhparent::regclass::text, '')
			FROM pg_index i
			LEFT JOIN pg_inherits h ON h.inhrelid = i.indexrelid
			WHERE i.indrelid = '`+rel+`'::regclass AND i.indkey[0] = (
				SELECT attnum FROM pg_attribute WHERE attrelid = '`+rel+`'::regclass AND attname = 'delivery_id')
			ORDER BY 1`)
	}
	partitions := func(t *testing.T, db *sqltest.DB) []string {
		t.Helper()
		return queryStrings(t, db, `SELECT inhrelid::regclass::text FROM pg_inherits
			WHERE inhparent = 'webhook_delivery_log'::regclass ORDER BY 1`)
	}

	t.Run("built on the parent and every partition, then on new ones", func(t *testing.T) {
		t.Parallel()
		db := before(t)
		migrate(t, db)
		if got := indexes(t, db, "webhook_delivery_log"); !slices.Equal(got, []string{"webhook_delivery_log_delivery_id_idx"}) {
			t.Fatalf("the log's delivery_id indexes: %v", got)
		}
		if _, err := db.Pool.Exec(context.Background(), `SELECT webhook_delivery_log_maintain('7 days', '1 day', '5 days')`); err != nil {
			t.Fatal(err)
		}
		for _, p := range partitions(t, db) {
			if got := indexes(t, db, p); len(got) != 1 || !slices.Contains(got, p+"_delivery_id_idx of webhook_delivery_log_delivery_id_idx") {
				t.Errorf("partition %s's delivery_id indexes: %v, want one, part of the log's", p, got)
			}
		}
	})

	t.Run("an operator's index on the parent is kept, none added", func(t *testing.T) {
		t.Parallel()
		db := before(t)
		if _, err := db.Pool.Exec(context.Background(), `CREATE INDEX by_delivery ON webhook_delivery_log (delivery_id, attempt)`); err != nil {
			t.Fatal(err)
		}
		migrate(t, db)
		if got := indexes(t, db, "webhook_delivery_log"); !slices.Equal(got, []string{"by_delivery"}) {
			t.Errorf("the log's delivery_id indexes: %v, want the operator's alone", got)
		}
	})

	t.Run("partitions indexed beforehand are attached, not indexed again", func(t *testing.T) {
		t.Parallel()
		db := before(t)
		ctx := context.Background()
		for _, p := range partitions(t, db) {
			// As docs/upgrading.md has it, one statement per partition (CONCURRENTLY runs
			// outside a transaction).
			if _, err := db.Pool.Exec(ctx, `CREATE INDEX CONCURRENTLY `+p+`_by_delivery ON `+p+` (delivery_id)`); err != nil {
				t.Fatal(err)
			}
		}
		migrate(t, db)
		for _, p := range partitions(t, db) {
			if got := indexes(t, db, p); !slices.Equal(got, []string{p + "_by_delivery of webhook_delivery_log_delivery_id_idx"}) {
				t.Errorf("partition %s's delivery_id indexes: %v, want its own, attached", p, got)
			}
		}
	})
}
