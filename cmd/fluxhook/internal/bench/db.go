package bench

// The database side of `fluxhook bench`: a throwaway cluster or a fresh database on the
// server in DATABASE_URL, and the PostgreSQL and Redis counters read around each workload.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/pgtemp"
	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
)

// benchMark starts every statement the bench itself runs, so that pg_stat_statements tells
// them apart from the dispatcher's.
const benchMark = "/* fluxhook-bench */ "

// benchDB is the database the bench runs in, created for the run and removed after it.
type benchDB struct {
	cluster   *pgtemp.Cluster // nil when DATABASE_URL names the server
	serverURL string          // the server's own database, for admin work (never written to)
	name      string          // fluxhook_bench_<random>
	url       string          // the bench database
	admin     *pgx.Conn       // on serverURL: creates and drops the database, reads counters
	oid       uint32
	pgss      bool // pg_stat_statements is loaded and installed in the bench database
	info      pgServerInfo
	// versionNum is server_version_num: where the statistics views differ between versions.
	versionNum int

	// Bench-side activity in the bench database, subtracted from commit counts: statements
	// (each its own transaction) and connections (each costs connCost commits of its own).
	stmts, conns atomic.Int64
	connCost     int64 // commits a new connection adds, calibrated at setup
	snapCost     int64 // commits one counters() call adds, calibrated at setup
}

// pgServerInfo describes the server, for the report.
type pgServerInfo struct {
	Version           string `json:"version"`
	Database          string `json:"database"` // created for the run, dropped after it
	Throwaway         bool   `json:"throwaway_cluster"`
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	SharedBuffers     string `json:"shared_buffers"`
	AutovacuumNaptime string `json:"autovacuum_naptime"`
	StatementStats    string `json:"statement_stats"` // pg_stat_statements, or why not
}

// openBenchDB starts a throwaway cluster (serverURL empty) or connects to serverURL, creates
// the bench database, installs the schema and, when possible, pg_stat_statements.
func openBenchDB(ctx context.Context, serverURL string, progress io.Writer) (_ *benchDB, err error) {
	db := &benchDB{serverURL: serverURL}
	defer func() {
		if err != nil {
			db.close(progress)
		}
	}()
	if serverURL == "" {
		opts := pgtemp.Options{Progress: progress, Settings: map[string]string{}}
		if pgssInstalled() {
			opts.Settings["shared_preload_libraries"] = "pg_stat_statements"
			opts.Settings["pg_stat_statements.track"] = "top"
		}
		fmt.Fprintln(progress, "bench: DATABASE_URL is not set: starting a throwaway PostgreSQL cluster")
		db.cluster, err = pgtemp.Start(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("starting a throwaway PostgreSQL (set DATABASE_URL to use a server of yours): %w", err)
		}
		db.serverURL = db.cluster.URL()
		db.info.Throwaway = true
	}
	if db.admin, err = pgx.Connect(ctx, db.serverURL); err != nil {
		return nil, cli.ScrubPassword(fmt.Errorf("connecting to %s: %w", cli.RedactURL(db.serverURL), err), "")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "fluxhook_bench_" + hex.EncodeToString(b[:])
	if _, err := db.admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("creating the bench database: %w", err)
	}
	db.name, db.info.Database = name, name
	if db.url, err = withDatabaseName(db.serverURL, name); err != nil {
		return nil, err
	}
	if err := db.admin.QueryRow(ctx, `SELECT oid FROM pg_database WHERE datname = $1`, name).Scan(&db.oid); err != nil {
		return nil, fmt.Errorf("reading the bench database's oid: %w", err)
	}
	if err := db.admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('shared_buffers'), current_setting('autovacuum_naptime'),
		current_setting('server_version_num')::int`).
		Scan(&db.info.Version, &db.info.Fsync, &db.info.SynchronousCommit, &db.info.SharedBuffers, &db.info.AutovacuumNaptime,
			&db.versionNum); err != nil {
		return nil, fmt.Errorf("reading server settings: %w", err)
	}

	if err := db.install(ctx); err != nil {
		return nil, err
	}
	if err := db.calibrate(ctx); err != nil {
		return nil, err
	}
	return db, nil
}

// install applies fluxhook's migrations to the bench database and installs
// pg_stat_statements there when the server has it loaded. Its connections are closed when it
// returns, so that the first counters() reading sees nobody else.
func (db *benchDB) install(ctx context.Context) error {
	pool, err := pgxpool.New(ctx, db.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := fluxsql.Migrate(ctx, pool); err != nil {
		return err
	}
	db.info.StatementStats = "pg_stat_statements"
	var preload string
	if err := pool.QueryRow(ctx, `SELECT current_setting('shared_preload_libraries')`).Scan(&preload); err != nil {
		return err
	}
	if !strings.Contains(preload, "pg_stat_statements") {
		db.info.StatementStats = "pg_stat_database only (pg_stat_statements is not in shared_preload_libraries)"
	} else if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		db.info.StatementStats = "pg_stat_database only (CREATE EXTENSION pg_stat_statements: " + err.Error() + ")"
	} else {
		db.pgss = true
	}
	return nil
}

// pgssInstalled reports whether the PostgreSQL that pgtemp would run has pg_stat_statements.
func pgssInstalled() bool {
	bin, err := pgtemp.FindBinaries()
	if err != nil {
		return false
	}
	version := filepath.Base(filepath.Dir(bin)) // /usr/lib/postgresql/15/bin
	for _, p := range []string{
		filepath.Join("/usr/share/postgresql", version, "extension", "pg_stat_statements.control"),
		filepath.Join(filepath.Dir(bin), "lib", "pg_stat_statements.so"),
	} {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}

// close drops the bench database and stops the throwaway cluster. Safe on a partly opened db.
func (db *benchDB) close(progress io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if db.admin != nil {
		if db.name != "" && db.cluster == nil {
			if _, err := db.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db.name+" WITH (FORCE)"); err != nil {
				fmt.Fprintf(progress, "bench: dropping the bench database %s: %v\n", db.name, err)
			}
		}
		_ = db.admin.Close(ctx)
	}
	if db.cluster != nil {
		if err := db.cluster.Stop(); err != nil {
			fmt.Fprintf(progress, "bench: stopping the throwaway cluster: %v\n", err)
		}
	}
}

// withDatabaseName is pgtemp.WithDatabaseName, its error naming DATABASE_URL.
func withDatabaseName(u, name string) (string, error) {
	out, err := pgtemp.WithDatabaseName(u, name)
	if err != nil {
		return "", fmt.Errorf("DATABASE_URL %s: %w", cli.RedactURL(u), err)
	}
	return out, nil
}

// connect opens a bench-side connection to the bench database and counts it. Bench-side
// connections use the simple protocol, so that each statement is exactly one transaction.
func (db *benchDB) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(db.url)
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.RuntimeParams["application_name"] = "fluxhook-bench"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to the bench database: %w", err)
	}
	db.conns.Add(1)
	return conn, nil
}

// exec runs one bench statement (marked, counted) on a fresh connection.
func (db *benchDB) exec(ctx context.Context, sql string, args ...any) error {
	conn, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	db.stmts.Add(1)
	if _, err := conn.Exec(ctx, benchMark+sql, args...); err != nil {
		return fmt.Errorf("%s: %w", strings.TrimSpace(sql), err)
	}
	return nil
}

// queryInt64 runs one counted bench query returning a number, on a fresh connection.
func (db *benchDB) queryInt64(ctx context.Context, sql string, args ...any) (int64, error) {
	conn, err := db.connect(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	db.stmts.Add(1)
	var n int64
	if err := conn.QueryRow(ctx, benchMark+sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", strings.TrimSpace(sql), err)
	}
	return n, nil
}

// pgCounters are the database's counters at one moment.
type pgCounters struct {
	commits, rollbacks int64
	stmts              map[int64]pgStatement // by queryid; nil without pg_stat_statements
	// bench counts bench-side statements and connections up to this moment.
	benchStmts, benchConns int64
}

// pgStatement is one pg_stat_statements entry.
type pgStatement struct {
	Query  string  `json:"query"`
	Calls  int64   `json:"calls"`
	TimeMS float64 `json:"total_ms"`
}

// counters waits until no other client is connected to the bench database (a backend
// publishes its commit counts when it exits, before it leaves pg_stat_activity), then reads
// the commit counters and, with pg_stat_statements, every statement's calls.
func (db *benchDB) counters(ctx context.Context) (pgCounters, error) {
	var c pgCounters
	deadline := time.Now().Add(15 * time.Second)
	for {
		var others int
		if err := db.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = $1 AND backend_type = 'client backend'`, db.name).Scan(&others); err != nil {
			return c, fmt.Errorf("reading pg_stat_activity: %w", err)
		}
		if others == 0 {
			break
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("%d connections to the bench database are still open after 15 s", others)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := db.admin.QueryRow(ctx, `SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1`,
		db.name).Scan(&c.commits, &c.rollbacks); err != nil {
		return c, fmt.Errorf("reading pg_stat_database: %w", err)
	}
	c.benchStmts, c.benchConns = db.stmts.Load(), db.conns.Load()
	if !db.pgss {
		return c, nil
	}
	// pg_stat_statements is read in the bench database, where the extension is; that costs
	// this connection's commits, which calibrate() measures as snapCost.
	conn, err := pgx.Connect(ctx, db.url)
	if err != nil {
		return c, fmt.Errorf("connecting to read pg_stat_statements: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, benchMark+`SELECT queryid, query, calls, total_exec_time
		FROM pg_stat_statements WHERE dbid = $1 AND queryid IS NOT NULL`, db.oid)
	if err != nil {
		return c, fmt.Errorf("reading pg_stat_statements: %w", err)
	}
	c.stmts = map[int64]pgStatement{}
	for rows.Next() {
		var id int64
		var s pgStatement
		if err := rows.Scan(&id, &s.Query, &s.Calls, &s.TimeMS); err != nil {
			rows.Close()
			return c, err
		}
		c.stmts[id] = s
	}
	rows.Close()
	return c, rows.Err()
}

// calibrate measures what the bench's own bookkeeping costs in commits, so that the
// dispatcher's commits can be told apart: one counters() call, and one bench connection.
func (db *benchDB) calibrate(ctx context.Context) error {
	a, err := db.counters(ctx)
	if err != nil {
		return err
	}
	b, err := db.counters(ctx)
	if err != nil {
		return err
	}
	db.snapCost = b.commits - a.commits
	if err := db.exec(ctx, `SELECT 1`); err != nil {
		return err
	}
	c, err := db.counters(ctx)
	if err != nil {
		return err
	}
	db.connCost = max(c.commits-b.commits-db.snapCost-1, 0)
	db.snapCost = max(db.snapCost, 0)
	return nil
}

// pgDelta is what the dispatcher did between two counters() readings.
type pgDelta struct {
	Commits    int64 // dispatcher commits (bench bookkeeping subtracted)
	Statements int64 // dispatcher statements; -1 without pg_stat_statements
	Top        []pgStatement
}

// delta attributes the change between before and after to the dispatcher: bench statements
// are marked and left out, the COPY of the prefill too, and the commits of the bench's own
// connections and statements are subtracted.
func (db *benchDB) delta(before, after pgCounters) pgDelta {
	benchCommits := db.snapCost + (after.benchStmts - before.benchStmts) + db.connCost*(after.benchConns-before.benchConns)
	d := pgDelta{Commits: max(after.commits-before.commits-benchCommits, 0), Statements: -1}
	if after.stmts == nil {
		return d
	}
	d.Statements = 0
	for id, s := range after.stmts {
		if isBenchStatement(s.Query) {
			continue
		}
		prev := before.stmts[id]
		calls := s.Calls - prev.Calls
		if calls <= 0 {
			continue
		}
		d.Statements += calls
		d.Top = append(d.Top, pgStatement{Query: s.Query, Calls: calls, TimeMS: s.TimeMS - prev.TimeMS})
	}
	sortStatements(d.Top)
	return d
}

func isBenchStatement(q string) bool {
	q = strings.TrimSpace(q)
	return strings.Contains(q, strings.TrimSpace(benchMark)) ||
		strings.HasPrefix(strings.ToLower(q), "copy ") // pgx's CopyFrom: the prefill
}

func sortStatements(s []pgStatement) {
	for i := 1; i < len(s); i++ { // few entries: insertion sort by calls, descending
		for j := i; j > 0 && s[j].Calls > s[j-1].Calls; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// redisCounter reads total_commands_processed from a Redis server, or from every master of a
// cluster (nil client: no Redis).
type redisCounter struct{ client redis.UniversalClient }

// newRedisCounter connects to REDIS_URL in any form the dispatcher accepts (single node,
// Sentinel, Cluster).
func newRedisCounter(ctx context.Context, rawURL string) (*redisCounter, error) {
	if rawURL == "" {
		return &redisCounter{}, nil
	}
	c, err := redisstore.NewClient(rawURL)
	if err != nil {
		return nil, err
	}
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("connecting to Redis at %s: %w", cli.RedactURL(rawURL), err)
	}
	return &redisCounter{client: c}, nil
}

// commands is the server's total_commands_processed; it counts this INFO too, which delta
// subtracts. -1 without Redis.
func (r *redisCounter) commands(ctx context.Context) (int64, error) {
	if r.client == nil {
		return -1, nil
	}
	cluster, ok := r.client.(*redis.ClusterClient)
	if !ok {
		return commandsProcessed(ctx, r.client)
	}
	var mu sync.Mutex
	var total int64
	err := cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		n, err := commandsProcessed(ctx, node)
		mu.Lock()
		total += n
		mu.Unlock()
		return err
	})
	return total, err
}

// commandsProcessed is one server's total_commands_processed.
func commandsProcessed(ctx context.Context, c redis.Cmdable) (int64, error) {
	info, err := c.Info(ctx, "stats").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO stats: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("redis INFO stats has no total_commands_processed")
}

func (r *redisCounter) close() {
	if r.client != nil {
		_ = r.client.Close()
	}
}
