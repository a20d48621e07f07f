// Package redistest gives tests an isolated view of a real Redis: a key prefix of their own on
// the server named by FLUXHOOK_TEST_REDIS_URL (default redis://127.0.0.1:6379/0, which the
// README's test command starts), and, for tests that must stop Redis, a private redis-server
// on a free loopback port that they can kill and restart.
//
// A key prefix per test, rather than a database per test, because Redis has only 16 databases
// and Cluster has one: a prefix isolates any number of parallel tests on any deployment.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluxora/fluxhook/stages/gate/redisstore"
)

// DefaultURL is the server tests use when FLUXHOOK_TEST_REDIS_URL is unset.
const DefaultURL = "redis://127.0.0.1:6379/0"

// URL returns the URL of the shared test server.
func URL() string {
	if u := os.Getenv("FLUXHOOK_TEST_REDIS_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Prefix returns a key prefix unique to t and deletes its keys when t ends.
func Prefix(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "fluxhook_test_" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() {
		client, err := redisstore.NewClient(URL())
		if err != nil {
			return
		}
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, _ := client.Keys(ctx, prefix+"*").Result()
		for _, k := range keys {
			client.Del(ctx, k)
		}
	})
	return prefix
}

// Open returns a Store on the shared test server with prefix, closed when t ends. Every call
// makes a new client, as a separate fluxhook instance would have.
func Open(t testing.TB, prefix string) *redisstore.Store {
	t.Helper()
	return OpenURL(t, URL(), prefix)
}

// OpenURL is Open on the server (or Sentinel, or Cluster) named by redisURL, parsed as the
// daemon parses REDIS_URL.
func OpenURL(t testing.TB, redisURL, prefix string) *redisstore.Store {
	t.Helper()
	s, err := redisstore.Open(redisURL, redisstore.Options{KeyPrefix: prefix})
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("redistest: Redis at %s does not answer (set FLUXHOOK_TEST_REDIS_URL, or run the README's test command, which starts Redis): %v", redisURL, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// Now returns the time by Redis's clock (the clock the scripts use).
func Now(ctx context.Context, client redis.UniversalClient) (time.Time, error) {
	return client.Time(ctx).Result()
}

// WaitFor returns once d has passed by Redis's clock, polling TIME (never a bare sleep: the
// condition is Redis's own clock, which is what the scripts compare against).
func WaitFor(t testing.TB, client redis.UniversalClient, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+10*time.Second)
	defer cancel()
	start, err := Now(ctx, client)
	if err != nil {
		t.Fatalf("redistest: TIME: %v", err)
	}
	for {
		now, err := Now(ctx, client)
		if err != nil {
			t.Fatalf("redistest: TIME: %v", err)
		}
		left := d - now.Sub(start)
		if left <= 0 {
			return
		}
		time.Sleep(min(left, 20*time.Millisecond))
	}
}

// Server is a private redis-server that a test can stop and start again on the same port.
type Server struct {
	t    testing.TB
	bin  string
	Port int
	// args returns the command line for a port (nil: a plain server without persistence).
	args func(port int) []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result
}

// StartServer starts a redis-server (without persistence) on a free loopback port; it is
// killed when t ends.
func StartServer(t testing.TB) *Server {
	t.Helper()
	return startServer(t, nil)
}

// plainArgs is a standalone server without persistence.
func plainArgs(port int) []string {
	return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning"}
}

func startServer(t testing.TB, args func(port int) []string) *Server {
	t.Helper()
	if args == nil {
		args = plainArgs
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		for _, p := range []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server"} {
			if _, err2 := os.Stat(p); err2 == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		t.Fatalf("redistest: redis-server not found: install redis-server (the package of that name; .ci/services installs it in CI) so that tests can start private, Cluster and Sentinel servers: %v", err)
	}
	s := &Server{t: t, bin: bin, args: args}
	t.Cleanup(s.Stop)
	var lastErr error
	for range 5 { // another process may take the free port before redis-server binds it
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s.Port = l.Addr().(*net.TCPAddr).Port
		l.Close()
		if lastErr = s.start(); lastErr == nil {
			return s
		}
	}
	t.Fatalf("redistest: starting redis-server: %v", lastErr)
	return nil
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", s.Port) }

// Start starts the server again on the same port after Stop.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("redistest: restarting redis-server: %v", err)
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := exec.Command(s.bin, s.args(s.Port)...)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.Port), 200*time.Millisecond)
		if err == nil {
			ok := ping(c)
			c.Close()
			if ok {
				s.cmd, s.exited = cmd, exited
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on port %d did not answer within 10 s", s.Port)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ping(c net.Conn) bool {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 7)
	n, _ := c.Read(buf)
	return string(buf[:n]) == "+PONG\r\n"
}

// Stop kills the server (SIGKILL: Redis really gone, as in a crash) and waits for it to exit.
// Safe to call when it is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}
