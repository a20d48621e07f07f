package pgtemp_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/pgtemp"
)

func TestStartRestartStop(t *testing.T) {
	t.Parallel()
	if _, err := pgtemp.FindBinaries(); err != nil && os.Geteuid() != 0 {
		t.Skipf("no PostgreSQL server binaries and not root to install them: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var progress strings.Builder
	c, err := pgtemp.Start(ctx, pgtemp.Options{Progress: &progress})
	if err != nil {
		t.Fatalf("Start: %v\nprogress:\n%s", err, progress.String())
	}
	t.Cleanup(func() { _ = c.Stop() })
	if !strings.HasPrefix(c.URL(), "postgres://postgres:") || !strings.Contains(c.URL(), "@127.0.0.1:") ||
		!strings.HasSuffix(c.URL(), "/postgres?sslmode=disable") {
		t.Errorf("URL() is not a password URL for postgres on 127.0.0.1")
	}

	selectOne(ctx, t, c.URL())
	refusesWithoutThePassword(ctx, t, c)
	// A connection open across the restart is terminated by the fast shutdown.
	held, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatalf("connect before restart: %v", err)
	}
	defer held.Close(context.Background())

	port := c.Port()
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if c.Port() != port {
		t.Errorf("port changed across restart: %d → %d", port, c.Port())
	}
	if err := held.Ping(ctx); err == nil {
		t.Errorf("a connection from before the restart still works; want it terminated")
	}
	selectOne(ctx, t, c.URL())

	dir := c.Dir()
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Stop, stat %s = %v; want it removed", dir, err)
	}
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := c.Restart(ctx); err == nil {
		t.Errorf("Restart after Stop succeeded")
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if conn, err := pgx.Connect(short, c.URL()); err == nil {
		conn.Close(ctx)
		t.Errorf("connected after Stop")
	}
}

func TestBinDirWithoutBinaries(t *testing.T) {
	t.Parallel()
	_, err := pgtemp.Start(context.Background(), pgtemp.Options{BinDir: t.TempDir()})
	if !errors.Is(err, pgtemp.ErrNoBinaries) {
		t.Fatalf("Start with an empty BinDir = %v, want ErrNoBinaries", err)
	}
}

func selectOne(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err) // not the URL: it holds the password
	}
	defer conn.Close(ctx)
	var one int
	if err := conn.QueryRow(ctx, "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("select 1 = %d, %v", one, err)
	}
}

// refusesWithoutThePassword: another local user can reach the port (and, with the right
// permissions, the socket), so neither may admit the superuser without the cluster's
// password: with trust, any local user could run programs as the server's user.
func refusesWithoutThePassword(ctx context.Context, t *testing.T, c *pgtemp.Cluster) {
	t.Helper()
	good, err := pgx.ParseConfig(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, host, password string
	}{
		{"TCP without a password", "127.0.0.1", ""},
		{"TCP with a wrong password", "127.0.0.1", "wrong"},
		{"the Unix socket without a password", c.Dir(), ""},
	} {
		cfg := good.Copy()
		cfg.Host, cfg.Password, cfg.Fallbacks = tc.host, tc.password, nil
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			conn.Close(ctx)
			t.Errorf("%s: connected as postgres; want the connection refused", tc.name)
			continue
		}
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); tc.password != "" && (!ok || pgErr.Code != "28P01") {
			t.Errorf("%s: %v; want SQLSTATE 28P01 (password authentication failed)", tc.name, err)
		}
	}
	sock := good.Copy()
	sock.Host, sock.Fallbacks = c.Dir(), nil
	conn, err := pgx.ConnectConfig(ctx, sock)
	if err != nil {
		t.Fatalf("the Unix socket with the password: %v", err)
	}
	conn.Close(ctx)
	if fi, err := os.Stat(c.Dir()); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("cluster directory: %v, %v; want mode 0700", fi, err)
	}
}
