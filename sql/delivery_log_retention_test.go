package sql_test

import (
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestMaintenanceKeepsWhatRetentionKeeps pins webhook_delivery_log_maintain's purge of the
// default partition: it deletes only the rows older than the retention, as dropping a
// partition does for a dated one. Rows land in the default partition when maintenance falls
// behind (no dated partition covers their time), and a row there that is newer than the
// retention is history an operator is promised to keep for the retention; purging the whole
// default partition (up to now) would lose it without a trace. Here one row inside the
// retention and one past it sit in the default partition, before the partitions maintenance
// creates (from the step holding now); after maintenance and the drops the first is still
// readable through the log and the view, the second is gone.
func TestMaintenanceKeepsWhatRetentionKeeps(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := logCtx(t)
	conn := connWith(t, db.URL, utcISO)
	const retention, step, ahead = time.Hour, 15 * time.Minute, time.Hour
	if _, _, err := maintain(ctx, conn, retention, step, ahead); err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, processed_at)
		VALUES ($1, 'kept', '{}', now() - $2::interval, gen_random_uuid(), 1, now() - $2::interval, now() - $2::interval)
		RETURNING tableoid::regclass::text`
	for id, age := range map[int64]string{1: "30 minutes", 2: "2 hours"} {
		var part string
		if err := conn.QueryRow(ctx, insert, id, age).Scan(&part); err != nil {
			t.Fatal(err)
		}
		if part != "webhook_delivery_log_default" {
			t.Fatalf("a row processed %s ago landed in %s, not the default partition: the test proves nothing", age, part)
		}
	}
	lines, _, err := maintain(ctx, conn, retention, step, ahead)
	if err != nil {
		t.Fatal(err)
	}
	dropped, err := dropAll(ctx, conn, retention, step)
	if err != nil {
		t.Fatal(err)
	}
	count := func(query string, id int64) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, query, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if count(`SELECT count(*) FROM webhook_delivery_log WHERE id = $1`, 1) != 1 ||
		count(`SELECT count(*) FROM webhook_deliveries WHERE id = $1 AND processed`, 1) != 1 {
		t.Errorf("the default partition's row processed 30 minutes ago, within the 1 h retention, is gone after maintenance (maintain: %q, drops: %q)",
			lines, dropped)
	}
	if n := count(`SELECT count(*) FROM webhook_delivery_log WHERE id = $1`, 2); n != 0 {
		t.Errorf("the default partition's row processed 2 hours ago, past the 1 h retention, survived maintenance (maintain: %q, drops: %q)",
			lines, dropped)
	}
}
