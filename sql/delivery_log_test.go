package sql_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// The delivery log's partition maintenance (webhook_delivery_log_maintain and
// webhook_delivery_log_drop_one), called directly, as the janitor does
// (stages/claim.MaintainLog), against the races and settings a busy installation meets.

// logCtx bounds a test's statements: a maintenance call that blocks fails the test within a
// minute instead of hanging to the package timeout.
func logCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// connWith opens a session on url with the given settings, closed at cleanup.
func connWith(t *testing.T, url string, params map[string]string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range params {
		cfg.RuntimeParams[k] = v
	}
	conn, err := pgx.ConnectConfig(logCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// utcISO are the settings the tests read partition bounds under.
var utcISO = map[string]string{"DateStyle": "ISO, YMD", "TimeZone": "UTC", "IntervalStyle": "postgres"}

// settleSQL stands in for a settle: one log row processed now, as every settle writes it.
const settleSQL = `INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, processed_at)
	VALUES ($1, 'settle', '{}', now(), gen_random_uuid(), 1, now(), now())`

// logPartition is one dated partition of the delivery log, its bounds read under utcISO.
type logPartition struct {
	Name   string
	Lo, Hi time.Time
}

func (p logPartition) String() string {
	return fmt.Sprintf("%s [%s, %s)", p.Name, p.Lo.UTC().Format(time.RFC3339), p.Hi.UTC().Format(time.RFC3339))
}

// readPartitions lists the log's dated partitions by start, reading their bounds in a session
// of its own under utcISO (not through webhook_delivery_log_partitions, which is under test).
func readPartitions(t *testing.T, url string) []logPartition {
	t.Helper()
	conn := connWith(t, url, utcISO)
	defer conn.Close(context.Background())
	rows, err := conn.Query(logCtx(t), `
		SELECT c.relname::text, m[1]::timestamptz, m[2]::timestamptz
		FROM pg_catalog.pg_inherits h
		JOIN pg_catalog.pg_class c ON c.oid = h.inhrelid,
		LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(c.relpartbound, c.oid), $re$FROM \('([^']*)'\) TO \('([^']*)'\)$re$) m
		WHERE h.inhparent = 'webhook_delivery_log'::regclass::oid AND m IS NOT NULL
		ORDER BY 2`)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (logPartition, error) {
		var p logPartition
		err := row.Scan(&p.Name, &p.Lo, &p.Hi)
		return p, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return parts
}

// expectedPartitions are the partitions maintain(step, ahead) creates on a log that has none,
// called at now: aligned to step in UTC, named by their start in UTC, from the one holding now
// until now + ahead.
func expectedPartitions(now time.Time, step, ahead time.Duration) []logPartition {
	var out []logPartition
	for lo := now.UTC().Truncate(step); lo.Before(now.Add(ahead)); lo = lo.Add(step) {
		out = append(out, logPartition{Name: "webhook_delivery_log_" + lo.Format("20060102_150405"), Lo: lo, Hi: lo.Add(step)})
	}
	return out
}

func samePartitions(a, b []logPartition) bool {
	return slices.EqualFunc(a, b, func(x, y logPartition) bool {
		return x.Name == y.Name && x.Lo.Equal(y.Lo) && x.Hi.Equal(y.Hi)
	})
}

// maintain calls webhook_delivery_log_maintain on conn and returns its lines and the now() it
// ran at (its transaction's).
func maintain(ctx context.Context, conn *pgx.Conn, retention, step, ahead time.Duration) ([]string, time.Time, error) {
	var lines []string
	var now time.Time
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT * FROM webhook_delivery_log_maintain($1::bigint * interval '1 millisecond',
			$2::bigint * interval '1 millisecond', $3::bigint * interval '1 millisecond')`,
			retention.Milliseconds(), step.Milliseconds(), ahead.Milliseconds())
		if err != nil {
			return err
		}
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return lines, now, err
}

// dropAll calls webhook_delivery_log_drop_one on conn until it has nothing more to drop (as the
// janitor does) and returns its lines.
func dropAll(ctx context.Context, conn *pgx.Conn, retention, step time.Duration) ([]string, error) {
	var lines []string
	for range 20 {
		var line *string
		if err := conn.QueryRow(ctx, `SELECT webhook_delivery_log_drop_one($1::bigint * interval '1 millisecond',
			$2::bigint * interval '1 millisecond')`, retention.Milliseconds(), step.Milliseconds()).Scan(&line); err != nil {
			return lines, err
		}
		if line == nil {
			return lines, nil
		}
		lines = append(lines, *line)
		if !strings.HasPrefix(*line, "dropped ") {
			return lines, nil
		}
	}
	return lines, errors.New("drop_one still dropping after 20 calls")
}

// TestMaintainCatchesUpWhileSettling: maintenance that fell behind (every settle lands in the
// default partition, which holds a backlog) catches up while settles go on: it creates the
// partition of now, moving the backlog into it, and those ahead, and no row is lost or
// duplicated. The settles that arrive while rows move must not land in the default partition
// for the range being attached (which made the attach's validation fail: "updated partition
// constraint for default partition ... would be violated"), nor fail (with the default
// partition locked but not the log, a settle that had chosen the default partition before the
// attach committed failed its own partition check after it).
func TestMaintainCatchesUpWhileSettling(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := logCtx(t)
	const backlog = 200_000
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, processed_at)
		SELECT g, 'backlog', '{}', now(), gen_random_uuid(), 1, now(), now() FROM generate_series(1, $1::int) g`, backlog); err != nil {
		t.Fatal(err)
	}

	// A dispatcher settling one row every 3 ms, each in a statement of its own.
	settler := connWith(t, db.URL, nil)
	var settled atomic.Int64
	var settleErr error
	var longest time.Duration
	stop, stopped := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(halt)
	wg.Go(func() {
		defer close(stopped)
		for id := int64(1_000_000); ; id++ {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			if _, err := settler.Exec(ctx, settleSQL, id); err != nil {
				settleErr = fmt.Errorf("settle of row %d: %w", id, err)
				return
			}
			longest = max(longest, time.Since(start))
			settled.Add(1)
			time.Sleep(3 * time.Millisecond)
		}
	})
	waitSettled := func(n int64) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for settled.Load() < n {
			select {
			case <-stopped: // failed: reported below
				return
			case <-deadline:
				t.Fatalf("%d settles in 30 s, want %d", settled.Load(), n)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	waitSettled(20)

	owner := connWith(t, db.URL, nil)
	start := time.Now()
	const retention, step, ahead = 7 * 24 * time.Hour, 24 * time.Hour, 48*time.Hour + 5*time.Minute
	lines, now, err := maintain(ctx, owner, retention, step, ahead)
	took := time.Since(start)
	waitSettled(settled.Load() + 20) // and settles go on after it
	halt()

	if err != nil {
		t.Fatalf("maintain while settling: %v", err)
	}
	if settleErr != nil {
		t.Errorf("a settle failed while maintain ran: %v", settleErr)
	}
	t.Logf("maintain took %s (%q); %d settles, the longest %s", took.Round(time.Millisecond), lines, settled.Load(), longest.Round(time.Millisecond))
	want := expectedPartitions(now, step, ahead)
	if got := readPartitions(t, db.URL); !samePartitions(got, want) {
		t.Errorf("partitions after maintain: %v, want %v", got, want)
	}
	created := 0
	for _, line := range lines {
		if strings.HasPrefix(line, "created webhook_delivery_log_") {
			created++
		} else {
			t.Errorf("maintain said %q", line)
		}
	}
	if created != len(want) {
		t.Errorf("maintain created %d partitions (%q), want %d", created, lines, len(want))
	}
	var rows, ids, stranded int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT id),
		count(*) FILTER (WHERE tableoid = 'webhook_delivery_log_default'::regclass AND processed_at >= $1)
		FROM webhook_delivery_log`, want[0].Lo).Scan(&rows, &ids, &stranded); err != nil {
		t.Fatal(err)
	}
	if rows != backlog+settled.Load() || ids != rows {
		t.Errorf("the log holds %d rows (%d ids), want the %d of the backlog and the %d settled, once each", rows, ids, backlog, settled.Load())
	}
	if stranded != 0 {
		t.Errorf("%d rows of the new partitions' ranges left in the default partition", stranded)
	}
}

// TestMaintainCreatesTheOtherRangesWhenOneFails: a range that cannot be created (here a table
// of its name is in the way) is reported, and the others, the one holding now and those ahead,
// are still created: the failure used to abort the whole call, leaving settles to the default
// partition.
func TestMaintainCreatesTheOtherRangesWhenOneFails(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := logCtx(t)
	owner := connWith(t, db.URL, nil)
	const retention, step, ahead = 7 * 24 * time.Hour, 24 * time.Hour, 48*time.Hour + 5*time.Minute
	var now time.Time
	if err := owner.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	want := expectedPartitions(now, step, ahead)
	squatted := want[1]
	if _, err := owner.Exec(ctx, `CREATE TABLE `+squatted.Name+` (x int)`); err != nil {
		t.Fatal(err)
	}
	lines, now, err := maintain(ctx, owner, retention, step, ahead)
	if err != nil {
		t.Fatalf("maintain with %s in the way: %v", squatted.Name, err)
	}
	want = slices.DeleteFunc(expectedPartitions(now, step, ahead), func(p logPartition) bool { return p.Name == squatted.Name })
	if got := readPartitions(t, db.URL); !samePartitions(got, want) {
		t.Errorf("partitions after maintain (%q): %v, want %v", lines, got, want)
	}
	failed := "creation of " + squatted.Name + " failed: "
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, failed) }) {
		t.Errorf("maintain did %q; want a line starting %q", lines, failed)
	}
}

// TestLogBoundsIgnoreSessionSettings: partition bounds are written and read the same whatever
// the calling session's DateStyle, TimeZone and IntervalStyle. Under a style that prints zone
// abbreviations, a bound printed in Asia/Kolkata ("IST") was read back as Israel time (3.5
// hours off) and maintain tried to create an existing partition again ("relation ... already
// exists"); one printed in Europe/Dublin's summer ("IST", +01) read an hour early, and
// drop_one dropped a partition that was still within the retention.
func TestLogBoundsIgnoreSessionSettings(t *testing.T) {
	t.Parallel()
	for _, s := range []struct{ dateStyle, timeZone, intervalStyle string }{
		{"SQL, DMY", "Asia/Kolkata", "postgres"},
		{"SQL, MDY", "Europe/Dublin", "postgres_verbose"},
		{"German", "America/St_Johns", "sql_standard"},
		{"Postgres, MDY", "Pacific/Chatham", "iso_8601"},
		{"Postgres, DMY", "Asia/Shanghai", "postgres"},
	} {
		t.Run(s.timeZone, func(t *testing.T) {
			t.Parallel()
			db := sqltest.NewMigrated(t)
			ctx := logCtx(t)
			odd := connWith(t, db.URL, map[string]string{"DateStyle": s.dateStyle, "TimeZone": s.timeZone, "IntervalStyle": s.intervalStyle})
			ref := connWith(t, db.URL, utcISO)

			const retention, step, ahead = 7 * 24 * time.Hour, 24 * time.Hour, 48*time.Hour + 5*time.Minute
			lines, now, err := maintain(ctx, odd, retention, step, ahead)
			if err != nil {
				t.Fatalf("maintain under %s, %s: %v", s.dateStyle, s.timeZone, err)
			}
			want := expectedPartitions(now, step, ahead)
			if got := readPartitions(t, db.URL); !samePartitions(got, want) {
				t.Fatalf("partitions made under %s, %s (%q): %v, want %v", s.dateStyle, s.timeZone, lines, got, want)
			}
			// Again, under either session's settings: there is nothing left to do.
			for _, conn := range []*pgx.Conn{odd, ref, odd} {
				if lines, _, err := maintain(ctx, conn, retention, step, ahead); err != nil || len(lines) != 0 {
					t.Fatalf("maintain again under %s: %q, %v; want nothing done", conn.PgConn().ParameterStatus("TimeZone"), lines, err)
				}
			}

			// A retention that ends on July 1st of last year at noon UTC (summer: Dublin
			// prints "IST"): one partition ends 30 minutes after that, within it; another ends
			// two days before, past it.
			var edge time.Time
			if err := ref.QueryRow(ctx, `SELECT make_timestamptz(extract(year FROM now())::int - 1, 7, 1, 12, 0, 0, 'UTC')`).Scan(&edge); err != nil {
				t.Fatal(err)
			}
			keep := logPartition{"webhook_delivery_log_keep", edge.Add(-24*time.Hour + 30*time.Minute), edge.Add(30 * time.Minute)}
			past := logPartition{"webhook_delivery_log_past", edge.Add(-72 * time.Hour), edge.Add(-48 * time.Hour)}
			for _, p := range []logPartition{keep, past} {
				if _, err := ref.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF webhook_delivery_log FOR VALUES FROM ('%s') TO ('%s')`,
					p.Name, p.Lo.UTC().Format("2006-01-02 15:04:05Z07:00"), p.Hi.UTC().Format("2006-01-02 15:04:05Z07:00"))); err != nil {
					t.Fatal(err)
				}
			}
			var dbNow time.Time
			if err := ref.QueryRow(ctx, `SELECT now()`).Scan(&dbNow); err != nil {
				t.Fatal(err)
			}
			longRetention := dbNow.Sub(edge)
			dropped, err := dropAll(ctx, odd, longRetention, step)
			if err != nil {
				t.Fatalf("drop_one under %s, %s: %v (after %q)", s.dateStyle, s.timeZone, err, dropped)
			}
			if !slices.Equal(dropped, []string{"dropped webhook_delivery_log_past"}) {
				t.Errorf("drop_one under %s, %s with the retention ending %s did %q; want only the partition past it dropped",
					s.dateStyle, s.timeZone, edge.Format(time.RFC3339), dropped)
			}
			if got := readPartitions(t, db.URL); !samePartitions(got, append([]logPartition{keep}, want...)) {
				t.Errorf("partitions after drop_one: %v, want %v and %v", got, keep, want)
			}
		})
	}
}

// TestDropOneKeepsAFuturePartitionASettleWrote: drop_one drops an empty partition that lies
// wholly in the future and is wider than the step (made while the retention was longer). A
// settle writing into it while drop_one runs must not be dropped with it: here the settle's
// transaction has inserted its row, not yet committed, when drop_one looks, and commits while
// drop_one waits for the partition's lock. drop_one used to check for rows first and lock
// after, and dropped the committed row. The settle's processed_at lies in the partition: a
// settle whose transaction began once the clock reached the partition's start (at the turn
// of a day, for daily partitions), while drop_one's own now() was still before it.
//
// Under REPEATABLE READ (a janitor's pool with that default) the check after the lock still
// reads the snapshot of drop_one's statement, which predates the commit: only a partition
// without a page counts as empty then.
func TestDropOneKeepsAFuturePartitionASettleWrote(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			db := sqltest.NewMigrated(t)
			ctx := logCtx(t)
			if _, err := db.Pool.Exec(ctx, `CREATE TABLE webhook_delivery_log_future PARTITION OF webhook_delivery_log
				FOR VALUES FROM (date_trunc('hour', now()) + interval '2 hours') TO (date_trunc('hour', now()) + interval '26 hours')`); err != nil {
				t.Fatal(err)
			}
			settle, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer settle.Rollback(ctx)
			if _, err := settle.Exec(ctx, `INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, processed_at)
				VALUES (1, 'late.settle', '{}', now(), gen_random_uuid(), 1, now(), date_trunc('hour', now()) + interval '2 hours 1 minute')`); err != nil {
				t.Fatal(err)
			}

			dropper := connWith(t, db.URL, nil)
			type result struct {
				line *string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				var r result
				r.err = pgx.BeginTxFunc(ctx, dropper, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
					return tx.QueryRow(ctx, `SELECT webhook_delivery_log_drop_one('10 minutes', '1 minute')`).Scan(&r.line)
				})
				done <- r
			}()
			// drop_one found the partition empty (the row is not committed) and waits for its
			// lock behind the settle.
			for waiting := false; !waiting; {
				if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE relation = 'webhook_delivery_log_future'::regclass
					AND mode = 'AccessExclusiveLock' AND NOT granted)`).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				select {
				case r := <-done:
					t.Fatalf("drop_one returned %v, %v before waiting for the partition's lock", r.line, r.err)
				case <-time.After(5 * time.Millisecond):
				}
			}
			if err := settle.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatalf("drop_one: %v", r.err)
			}
			if r.line != nil && strings.HasPrefix(*r.line, "dropped webhook_delivery_log_future") {
				t.Errorf("drop_one %s the partition a settle had just written to", *r.line)
			}
			var n int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_delivery_log WHERE event_type = 'late.settle'`).Scan(&n); err != nil || n != 1 {
				t.Errorf("the settled row: %d in the log, %v; want it kept", n, err)
			}
		})
	}
}

// overloadsSQL, run by a role with CREATE on fluxhook's schema, shadows built-ins the
// maintenance functions (SECURITY DEFINER: they run as the schema owner) call or could call:
// an exact match in the schema beats a polymorphic or coerced built-in (array_length(anyarray,
// int), format(text, VARIADIC "any"), array || element, numeric / float8, oid = regclass),
// and would run as the owner. Every one says it ran with a notice and then does the built-in's
// work, so the call goes on.
const overloadsSQL = `
CREATE FUNCTION fluxhook_test_called(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'overload called: %', what; END $$;
CREATE FUNCTION array_length(a timestamptz[], d integer) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('array_length'); RETURN pg_catalog.array_length(a, d); END $$;
CREATE FUNCTION array_append(a timestamptz[], e timestamptz) RETURNS timestamptz[] LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('array_append'); RETURN pg_catalog.array_append(a, e); END $$;
CREATE FUNCTION cardinality(a timestamptz[]) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('cardinality'); RETURN pg_catalog.cardinality(a); END $$;
CREATE FUNCTION to_timestamp(s double precision) RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('to_timestamp'); RETURN pg_catalog.to_timestamp(s); END $$;
CREATE FUNCTION floor(x double precision) RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('floor'); RETURN pg_catalog.floor(x); END $$;
CREATE FUNCTION now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('now'); RETURN pg_catalog.now(); END $$;
CREATE FUNCTION clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('clock_timestamp'); RETURN pg_catalog.clock_timestamp(); END $$;
CREATE FUNCTION date_part(f text, i interval) RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('date_part'); RETURN pg_catalog.date_part(f, i); END $$;
CREATE FUNCTION date_part(f text, t timestamptz) RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('date_part'); RETURN pg_catalog.date_part(f, t); END $$;
CREATE FUNCTION to_char(t timestamp, f text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('to_char'); RETURN pg_catalog.to_char(t, f); END $$;
CREATE FUNCTION regexp_match(s text, p text) RETURNS text[] LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('regexp_match'); RETURN pg_catalog.regexp_match(s, p); END $$;
CREATE FUNCTION pg_get_expr(e pg_node_tree, r oid) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('pg_get_expr'); RETURN pg_catalog.pg_get_expr(e, r); END $$;
CREATE FUNCTION set_config(n text, v text, l boolean) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('set_config'); RETURN pg_catalog.set_config(n, v, l); END $$;
CREATE FUNCTION current_setting(n text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('current_setting'); RETURN pg_catalog.current_setting(n); END $$;
CREATE FUNCTION pg_try_advisory_xact_lock(a integer, b integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('pg_try_advisory_xact_lock'); RETURN pg_catalog.pg_try_advisory_xact_lock(a, b); END $$;
CREATE FUNCTION pg_relation_size(r regclass) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('pg_relation_size'); RETURN pg_catalog.pg_relation_size(r); END $$;
CREATE FUNCTION format(f text, a regclass) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('format(text, regclass)'); RETURN pg_catalog.format(f, a); END $$;
CREATE FUNCTION format(f text, a text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('format(text, text)'); RETURN pg_catalog.format(f, a); END $$;
CREATE FUNCTION format(f text, a text, b text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('format(text, text, text)'); RETURN pg_catalog.format(f, a, b); END $$;
CREATE FUNCTION format(f text, a text, b timestamptz, c timestamptz) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('format(text, text, timestamptz, timestamptz)'); RETURN pg_catalog.format(f, a, b, c); END $$;
CREATE FUNCTION fluxhook_test_append(a timestamptz[], e timestamptz) RETURNS timestamptz[] LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('timestamptz[] || timestamptz'); RETURN pg_catalog.array_append(a, e); END $$;
CREATE OPERATOR || (LEFTARG = timestamptz[], RIGHTARG = timestamptz, FUNCTION = fluxhook_test_append);
CREATE FUNCTION fluxhook_test_div(a numeric, b double precision) RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('numeric / double precision'); RETURN a::double precision OPERATOR(pg_catalog./) b; END $$;
CREATE OPERATOR / (LEFTARG = numeric, RIGHTARG = double precision, FUNCTION = fluxhook_test_div);
CREATE FUNCTION fluxhook_test_eq(a oid, b regclass) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('oid = regclass'); RETURN a OPERATOR(pg_catalog.=) b::oid; END $$;
CREATE OPERATOR = (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = fluxhook_test_eq);
CREATE FUNCTION fluxhook_test_textcat(a text, b text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM fluxhook_test_called('text || text'); RETURN pg_catalog.textcat(a, b); END $$;
CREATE OPERATOR || (LEFTARG = text, RIGHTARG = text, FUNCTION = fluxhook_test_textcat);
`

// TestLogMaintenanceCallsNoOverload: a role that may create objects in fluxhook's schema (the
// default for PUBLIC up to PostgreSQL 14) shadows the built-ins the maintenance functions use;
// maintain and drop_one, which run as the schema owner, and the migration that defines them
// never call the shadows.
func TestLogMaintenanceCallsNoOverload(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := logCtx(t)
	// Every path: a row the default partition caught for a time ahead (moved; a row of now
	// would stay in the default partition when a minute begins before maintain runs), a
	// partition past the retention and an empty future one wider than the step (both dropped).
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_delivery_log (id, event_type, payload, created_at, delivery_id, attempt, enqueued_at, processed_at)
		VALUES (1, 'caught', '{}', now(), gen_random_uuid(), 1, now(), now() + interval '3 minutes');
		CREATE TABLE webhook_delivery_log_old PARTITION OF webhook_delivery_log
			FOR VALUES FROM (now() - interval '2 hours') TO (now() - interval '1 hour');
		CREATE TABLE webhook_delivery_log_wide PARTITION OF webhook_delivery_log
			FOR VALUES FROM (now() + interval '1 hour') TO (now() + interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	role := sqltest.NewRole(t, db)
	var schema string
	if err := db.Pool.QueryRow(ctx, `SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'webhook_delivery_log'::regclass`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `GRANT CREATE ON SCHEMA `+schema+` TO `+role); err != nil {
		t.Fatal(err)
	}
	if _, err := sqltest.ConnectAs(t, db, role).Exec(ctx, `SET search_path = `+schema+`; `+overloadsSQL); err != nil {
		t.Fatalf("creating the overloads: %v", err)
	}

	// A new session: one that had run the functions before would reuse their plans.
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var called []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		what, ok := strings.CutPrefix(n.Message, "overload called: ")
		mu.Lock()
		defer mu.Unlock()
		if ok && !slices.Contains(called, what) {
			called = append(called, what)
		}
	}
	owner, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close(ctx)

	const retention, step, ahead = 10 * time.Minute, time.Minute, 7 * time.Minute
	dropped, err := dropAll(ctx, owner, retention, step)
	if err != nil {
		t.Fatalf("drop_one: %v", err)
	}
	slices.Sort(dropped)
	if !slices.Equal(dropped, []string{"dropped webhook_delivery_log_old", "dropped webhook_delivery_log_wide"}) {
		t.Errorf("drop_one did %q; want the old and the wide partitions dropped", dropped)
	}
	lines, _, err := maintain(ctx, owner, retention, step, ahead)
	if err != nil {
		t.Fatalf("maintain: %v", err)
	}
	if len(lines) < 7 {
		t.Errorf("maintain did %q; want the partitions of the next 7 minutes created", lines)
	}
	var where string
	if err := owner.QueryRow(ctx, `SELECT tableoid::regclass::text FROM webhook_delivery_log WHERE id = 1`).Scan(&where); err != nil || where == "webhook_delivery_log_default" {
		t.Errorf("the caught row is in %s (%v), want it moved to its partition", where, err)
	}
	// The migration that defines the functions, applied again (it is idempotent) by the owner.
	var defining fluxsql.Migration
	for _, m := range fluxsql.Migrations() {
		if strings.Contains(m.SQL, "webhook_delivery_log_maintain(retention interval") {
			defining = m
		}
	}
	if _, err := owner.Exec(ctx, defining.SQL); err != nil {
		t.Fatalf("applying %s again: %v", defining.Name, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(called) != 0 {
		t.Errorf("the schema owner ran another role's functions: %q", called)
	}
}
