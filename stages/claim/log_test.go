package claim_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/claim"
)

func TestLogPartitionStep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ retention, step time.Duration }{
		{time.Minute, time.Minute},
		{5 * time.Minute, time.Minute},
		{20 * time.Minute, 5 * time.Minute},
		{time.Hour, 15 * time.Minute},
		{24 * time.Hour, 6 * time.Hour},
		{7 * 24 * time.Hour, 24 * time.Hour},
		{90 * 24 * time.Hour, 24 * time.Hour},
	} {
		if got := claim.LogPartitionStep(tc.retention); got != tc.step {
			t.Errorf("LogPartitionStep(%s) = %s, want %s", tc.retention, got, tc.step)
		}
	}
}

// logPartitions lists the delivery log's partitions by name with the number of rows each holds.
func logPartitions(t *testing.T, db *sqltest.DB) map[string]int {
	t.Helper()
	rows, err := db.Pool.Query(deadline(t), `
		SELECT c.relname, (SELECT count(*) FROM webhook_delivery_log l WHERE l.tableoid = c.oid)
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'webhook_delivery_log'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		out[name] = n
	}
	return out
}

// TestMaintainLog: the janitor's partition maintenance creates the partitions the next
// minutes need, moves what the default partition caught into them, drops a partition whose
// whole range is past retention (no DELETE), and does it all as a role that owns nothing and
// has only EXECUTE on the function.
func TestMaintainLog(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	// Before any maintenance every settle lands in the default partition; an old partition
	// holds a row past retention. The caught row is a few minutes ahead: one of now would stay
	// in the default partition when a minute begins before MaintainLog runs.
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, processed_at)
		VALUES (1, 'caught', '{}', now(), gen_random_uuid(), 1, now(), now() + interval '3 minutes'),
		       (2, 'stale', '{}', now(), gen_random_uuid(), 1, now(), now() - interval '3 hours');
		CREATE TABLE webhook_delivery_log_old PARTITION OF webhook_delivery_log
			FOR VALUES FROM (now() - interval '2 hours') TO (now() - interval '1 hour');
		INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, processed_at)
		VALUES (3, 'old', '{}', now(), gen_random_uuid(), 1, now(), now() - interval '90 minutes');`); err != nil {
		t.Fatal(err)
	}
	role := sqltest.NewRole(t, db)
	if _, err := db.Pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION webhook_delivery_log_maintain(interval, interval, interval),
		webhook_delivery_log_drop_one(interval, interval) TO `+role); err != nil {
		t.Fatal(err)
	}
	pool := sqltest.ConnectAs(t, db, role)
	c := claim.New(pool, "x", time.Minute)

	const retention = 10 * time.Minute // partitions of 1 minute, 7 minutes ahead
	done, err := c.MaintainLog(ctx, retention)
	if err != nil {
		t.Fatalf("MaintainLog: %v", err)
	}
	if !slices.Contains(done, "dropped webhook_delivery_log_old") {
		t.Errorf("MaintainLog did %q; want the old partition dropped", done)
	}
	created := 0
	for _, line := range done {
		if strings.HasPrefix(line, "created webhook_delivery_log_") {
			created++
		}
	}
	if created < 7 || created > 8 {
		t.Errorf("MaintainLog created %d partitions (%q); want the 7 or 8 one-minute partitions up to now + 7m", created, done)
	}
	parts := logPartitions(t, db)
	if _, ok := parts["webhook_delivery_log_old"]; ok {
		t.Error("the old partition is still attached")
	}
	if parts["webhook_delivery_log_default"] != 0 {
		t.Errorf("the default partition holds %d rows, want none: the caught row moved, the stale one deleted", parts["webhook_delivery_log_default"])
	}
	var where string
	if err := db.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM webhook_delivery_log WHERE id = 1`).Scan(&where); err != nil {
		t.Fatalf("the row the default partition caught: %v", err)
	}
	if !strings.HasPrefix(where, "webhook_delivery_log_2") {
		t.Errorf("the caught row is in %s, want the partition of its minute", where)
	}
	// A second run has nothing to do until the clock moves past a partition's width.
	again, err := c.MaintainLog(ctx, retention)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range again {
		if !strings.HasPrefix(line, "created ") {
			t.Errorf("second run did %q", line)
		}
	}
}

// TestMaintainLogPostponesADropBehindALock: dropping a partition needs the log's ACCESS
// EXCLUSIVE lock for an instant; behind a long reader of the log it gives up after the lock
// timeout instead of queueing every settle behind itself, and the next run drops it.
func TestMaintainLogPostponesADropBehindALock(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE webhook_delivery_log_old PARTITION OF webhook_delivery_log
		FOR VALUES FROM (now() - interval '2 hours') TO (now() - interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	reader, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM webhook_delivery_log`); err != nil {
		t.Fatal(err)
	}
	c := claim.New(db.Pool, "x", time.Minute)
	done, err := c.MaintainLog(ctx, 10*time.Minute)
	if err != nil {
		t.Fatalf("MaintainLog behind a reader: %v", err)
	}
	if !slices.Contains(done, "drop of webhook_delivery_log_old postponed: the log is busy") {
		t.Fatalf("MaintainLog did %q; want the drop postponed", done)
	}
	if _, ok := logPartitions(t, db)["webhook_delivery_log_old"]; !ok {
		t.Fatal("the partition went although the drop was postponed")
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if done, err = c.MaintainLog(ctx, 10*time.Minute); err != nil || !slices.Contains(done, "dropped webhook_delivery_log_old") {
		t.Fatalf("MaintainLog after the reader ended = %q, %v; want the partition dropped", done, err)
	}
}

// TestMaintainLogAfterShorterRetention: partitions made for a long retention (daily) are wide;
// once the retention is shortened, the empty future ones are dropped and the new step's
// partitions follow the current wide one, which stays until it has passed.
func TestMaintainLogAfterShorterRetention(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	c := claim.New(db.Pool, "x", time.Minute)
	if _, err := c.MaintainLog(ctx, 7*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	daily := logPartitions(t, db)
	// Today's partition and those up to LogPartitionsAhead: the next two days, or three within
	// that much of midnight (UTC), as the database counts them.
	var days int
	if err := db.Pool.QueryRow(ctx, `SELECT (date_trunc('day', (now() + $1::bigint * interval '1 millisecond') AT TIME ZONE 'UTC')::date
		- date_trunc('day', now() AT TIME ZONE 'UTC')::date) + 1`, claim.LogPartitionsAhead(7*24*time.Hour).Milliseconds()).Scan(&days); err != nil {
		t.Fatal(err)
	}
	if len(daily) != days+1 {
		t.Fatalf("partitions for 7 days of retention: %v, want %d daily ones and the default", daily, days)
	}
	done, err := c.MaintainLog(ctx, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dropped := 0
	for _, line := range done {
		if strings.HasPrefix(line, "dropped ") {
			dropped++
		}
	}
	if dropped != days-1 {
		t.Errorf("MaintainLog with a shorter retention did %q; want the %d future daily partitions dropped", done, days-1)
	}
	var today, uncovered int
	if err := db.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE pg_get_expr(c.relpartbound, c.oid) LIKE '%00:00:00%00:00:00%'),
		       (SELECT count(*) FROM generate_series(now(), now() + interval '7 minutes', interval '1 minute') g
		        WHERE NOT EXISTS (
		            SELECT 1 FROM pg_inherits h2 JOIN pg_class c2 ON c2.oid = h2.inhrelid,
		                LATERAL regexp_match(pg_get_expr(c2.relpartbound, c2.oid), $re$FROM \('([^']*)'\) TO \('([^']*)'\)$re$) m
		            WHERE h2.inhparent = 'webhook_delivery_log'::regclass AND m[1]::timestamptz <= g AND g < m[2]::timestamptz))
		FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
		WHERE h.inhparent = 'webhook_delivery_log'::regclass`).Scan(&today, &uncovered); err != nil {
		t.Fatal(err)
	}
	if today != 1 || uncovered != 0 {
		t.Errorf("%d daily partitions left (want today's), %d of the next 7 minutes uncovered (want none)", today, uncovered)
	}
}

// TestCheckLogGrantsNamesTheMissingGrants: a dispatcher whose role may not write the delivery
// log or maintain its partitions is told which GRANTs to run (it refuses to start without them).
func TestCheckLogGrantsNamesTheMissingGrants(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	role := sqltest.NewRole(t, db)
	pool := sqltest.ConnectAs(t, db, role)
	c := claim.New(pool, "x", time.Minute)
	err := c.CheckLogGrants(ctx)
	for _, want := range []string{"GRANT SELECT, INSERT ON webhook_delivery_log", "GRANT EXECUTE ON FUNCTION webhook_delivery_log_maintain"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckLogGrants without grants = %v, want it to name %q", err, want)
		}
	}
	if _, err := db.Pool.Exec(ctx, `GRANT SELECT, INSERT ON webhook_delivery_log TO `+role+`;
		GRANT EXECUTE ON FUNCTION webhook_delivery_log_maintain(interval, interval, interval),
			webhook_delivery_log_drop_one(interval, interval) TO `+role); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckLogGrants(ctx); err != nil {
		t.Fatalf("CheckLogGrants with the grants: %v", err)
	}
}
