package dispatcher

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pipeDB is a database of its own with a pool of one connection, so that every pipeline
// goes on the same connection as the one before.
func pipeDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, "postgres://root@127.0.0.1:5432/postgres")
	if err != nil {
		t.Skip(err)
	}
	name := fmt.Sprintf("review_pipe_%d", rand.Int64())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, "postgres://root@127.0.0.1:5432/"+name+"?pool_max_conns=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		_ = admin.Close(ctx)
	})
	return pool
}

func readInt(rows pgx.Rows) (int64, error) {
	defer rows.Close()
	var v int64
	if !rows.Next() {
		return 0, fmt.Errorf("no row: %w", rows.Err())
	}
	if err := rows.Scan(&v); err != nil {
		return 0, err
	}
	rows.Close()
	return v, rows.Err()
}

// TestPipelineFirstRefusedAtCommit: the first statement of a pipeline runs and fails only at
// its commit (the Sync after it; here a deferred constraint trigger). The second statement's
// answer must still be read as the second's.
func TestPipelineFirstRefusedAtCommit(t *testing.T) {
	ctx := context.Background()
	pool := pipeDB(t)
	if _, err := pool.Exec(ctx, `
		CREATE TABLE t (a int);
		CREATE FUNCTION no() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
		CREATE CONSTRAINT TRIGGER no AFTER INSERT ON t DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION no();`); err != nil {
		t.Fatal(err)
	}
	p, err := sendPipelined(ctx, pool, statement{`INSERT INTO t VALUES (1) RETURNING a::bigint`, nil}, statement{`SELECT 42::bigint`, nil})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readNext(p, readInt); err == nil {
		t.Error("first statement: no error, want the commit's")
	}
	v, err := readNext(p, readInt)
	p.close()
	if err != nil || v != 42 {
		t.Errorf("second statement: %d, %v; want 42 (its answer lost to the first's Sync)", v, err)
	}
}

// TestPipelineRefusedAtBindRecovers: a statement prepared before its result type changed fails
// at Bind ("cached plan must not change result type"); the next statement's answer is read as
// its own, and the next pipeline prepares it afresh.
func TestPipelineRefusedAtBindRecovers(t *testing.T) {
	ctx := context.Background()
	pool := pipeDB(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE t (a int); INSERT INTO t VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	const q = `SELECT a FROM t`
	run := func() (error, int64, error) {
		p, err := sendPipelined(ctx, pool, statement{q, nil}, statement{`SELECT 42::bigint`, nil})
		if err != nil {
			t.Fatal(err)
		}
		defer p.close()
		_, err1 := readNext(p, func(rows pgx.Rows) (int64, error) {
			defer rows.Close()
			for rows.Next() {
			}
			return 0, rows.Err()
		})
		v, err2 := readNext(p, readInt)
		return err1, v, err2
	}
	if e1, v, e2 := run(); e1 != nil || v != 42 || e2 != nil {
		t.Fatalf("before: %v, %d, %v", e1, v, e2)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE t ALTER COLUMN a TYPE bigint`); err != nil {
		t.Fatal(err)
	}
	e1, v, e2 := run()
	t.Logf("after the change: first %v; second %d, %v", e1, v, e2)
	if v != 42 || e2 != nil {
		t.Errorf("second statement after the first was refused: %d, %v", v, e2)
	}
	if e1, v, e2 := run(); e1 != nil || v != 42 || e2 != nil {
		t.Errorf("next pipeline: %v, %d, %v; want it prepared afresh", e1, v, e2)
	}
}
