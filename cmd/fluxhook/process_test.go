package main

// Helpers for the process-level tests in serve_test.go: the fluxhook binary built once per
// test run, a `fluxhook serve` child process with its stderr captured, and a signature-checking
// webhook consumer whose answers a test scripts (including requests that hang until released).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/fluxhooktest"
	"github.com/fluxora/fluxhook/stages/sign"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// serveSecret is the WEBHOOK_SECRET of every process test; tests assert it never reaches a log.
const serveSecret = "whsec-proc-test-4f9c2a7e-never-logged"

func TestMain(m *testing.M) { os.Exit(fluxhooktest.Main(m)) }

// fluxhookBinary is this package's binary, built once per test run (with -race when the tests
// run with it, so that races in the child are reported too).
func fluxhookBinary(t *testing.T) string { return fluxhooktest.Binary(t) }

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool { return fluxhooktest.RaceEnabled() }

// syncBuffer is a bytes.Buffer safe for the exec copying goroutine and the test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// pollUntil checks cond every 10 ms until it holds, failing the test after timeout: a
// condition with a deadline, never a bare sleep.
func pollUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logLinesOf is a serve process's stderr as its log lines: without the Go runtime's scheduler
// trace ("SCHED …"), which serve's GODEBUG (sysmonAwake) has the runtime write on a host up for
// more than 24.8 days, and which is not fluxhook's.
func logLinesOf(stderr string) []string {
	var lines []string
	for line := range strings.SplitSeq(strings.TrimRight(stderr, "\n"), "\n") {
		if !strings.HasPrefix(line, "SCHED ") {
			lines = append(lines, line)
		}
	}
	return lines
}

// serveProc is one `fluxhook serve` child process.
type serveProc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	done   chan struct{} // closed when the process has exited and its output is collected
}

// startServe runs `fluxhook serve` with exactly env as its environment (nothing inherited, so
// that the developer's own DATABASE_URL or WEBHOOK_* cannot leak in). The process is killed
// at cleanup if it is still running, and its stderr is printed if the test failed.
func startServe(t *testing.T, name string, env map[string]string, flags ...string) *serveProc {
	t.Helper()
	return startServeBinary(t, fluxhookBinary(t), name, env, flags...)
}

// startServeBinary is startServe with another build of fluxhook (see fluxhookBinaryNoRace).
// flags follow `serve` on the command line.
func startServeBinary(t *testing.T, bin, name string, env map[string]string, flags ...string) *serveProc {
	t.Helper()
	return startCommand(t, bin, name, env, append([]string{"serve"}, flags...)...)
}

// startCommand runs `fluxhook ARGS...` as startServe runs serve: exactly env as its
// environment, killed at cleanup, its stderr shown if the test failed.
func startCommand(t *testing.T, bin, name string, env map[string]string, args ...string) *serveProc {
	t.Helper()
	p := &serveProc{t: t, name: name, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	p.cmd.Env = []string{}
	if raceEnabled() {
		// A race-enabled binary otherwise sleeps 1 s before exiting, which would blur the
		// shutdown timings the tests check.
		p.cmd.Env = append(p.cmd.Env, "GORACE=atexit_sleep_ms=0")
	}
	for _, k := range keys {
		p.cmd.Env = append(p.cmd.Env, k+"="+env[k])
	}
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		logs := p.stderr.String()
		if strings.Contains(logs, "WARNING: DATA RACE") {
			t.Errorf("%s: the race detector reported a data race", name)
		}
		if t.Failed() {
			t.Logf("%s (pid %d, %s) stderr:\n%s", name, p.cmd.Process.Pid, p.cmd.ProcessState, failureLog(t, name, logs))
		}
	})
	return p
}

// failureLog is what a failed test prints of a child's stderr. A fault case's children log
// thousands of lines, and CI keeps only the end of a run's output: printed whole, they push
// the failed checks' own messages out of it. So a long log is written to a file, which the
// message names, and only its error lines and its last lines are printed.
func failureLog(t *testing.T, name, logs string) string {
	const keepErrors, keepTail = 10, 15
	lines := strings.Split(strings.TrimRight(logs, "\n"), "\n")
	if len(lines) <= keepErrors+keepTail {
		return logs
	}
	var b strings.Builder
	f, err := os.CreateTemp("", "fluxhook-"+strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()+"-"+name)+"-*.log")
	if err == nil {
		_, err = f.WriteString(logs)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(&b, "(%d lines; writing them to a file failed: %v)\n", len(lines), err)
	} else {
		fmt.Fprintf(&b, "(%d lines, all in %s)\n", len(lines), f.Name())
	}
	var errs []string
	crash := -1 // the first line of a race report, panic or fatal error: printed with its stack
	for i, l := range lines[:len(lines)-keepTail] {
		if crash < 0 && (strings.Contains(l, "WARNING: DATA RACE") || strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:")) {
			crash = i
		}
		if strings.Contains(l, `"level":"error"`) {
			errs = append(errs, l)
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(&b, "error lines (%d, first %d):\n%s\n", len(errs), min(len(errs), keepErrors), strings.Join(errs[:min(len(errs), keepErrors)], "\n"))
	}
	if crash >= 0 {
		const keepCrash = 60
		end := min(crash+keepCrash, len(lines)-keepTail)
		fmt.Fprintf(&b, "from line %d (up to %d lines):\n%s\n", crash+1, keepCrash, strings.Join(lines[crash:end], "\n"))
	}
	fmt.Fprintf(&b, "last %d lines:\n%s", keepTail, strings.Join(lines[len(lines)-keepTail:], "\n"))
	return b.String()
}

// exited reports, without waiting, whether the process has exited.
func (p *serveProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *serveProc) signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%s: sending %v: %v", p.name, sig, err)
	}
}

func (p *serveProc) kill() {
	p.t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		p.t.Fatalf("%s: kill: %v", p.name, err)
	}
}

// stopCleanly sends SIGTERM and fails the test unless the process exits 0 within 15 s: a
// graceful shutdown.
func (p *serveProc) stopCleanly() {
	p.t.Helper()
	p.signal(syscall.SIGTERM)
	if code := p.waitExit(15 * time.Second); code != 0 {
		p.t.Fatalf("%s exited %d after SIGTERM, want 0", p.name, code)
	}
}

// waitExit waits up to timeout for the process to exit and returns its exit status (-1 when
// a signal killed it).
func (p *serveProc) waitExit(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %s", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// waitFor is pollUntil that also fails at once if the process exits while waiting.
func (p *serveProc) waitFor(timeout time.Duration, what string, cond func() bool) {
	p.t.Helper()
	pollUntil(p.t, timeout, what, func() bool {
		if cond() {
			return true
		}
		if p.exited() {
			p.t.Fatalf("%s exited (%s) while waiting for %s", p.name, p.cmd.ProcessState, what)
		}
		return false
	})
}

// waitLog waits until the process has logged a line containing s.
func (p *serveProc) waitLog(timeout time.Duration, s string) {
	p.t.Helper()
	p.waitFor(timeout, fmt.Sprintf("%s to log %q", p.name, s), func() bool {
		return strings.Contains(p.stderr.String(), s)
	})
}

// serveEnv is a valid configuration for a serve process against databaseURL and hookURL, with
// debug logs and timings short enough for tests; tests override what they exercise.
func serveEnv(databaseURL, hookURL string) map[string]string {
	return map[string]string{
		"DATABASE_URL":           databaseURL,
		"WEBHOOK_URL":            hookURL,
		"WEBHOOK_SECRET":         serveSecret,
		"WEBHOOK_TIMEOUT_MS":     "15000", // generous: CI machines are loaded
		"WEBHOOK_RETRY_SCHEDULE": "200ms,200ms",
		"LOG_LEVEL":              "debug",
		// Tests' consumers listen on loopback, endpoint_url rows' too: allowed explicitly.
		"WEBHOOK_ROW_URL_NETWORKS": "loopback",
	}
}

// withPassword returns the database URL raw with password set in its user info. The test
// server trusts local connections, so the password is never checked: it only has to stay out
// of every log and error.
func withPassword(t *testing.T, raw, password string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("parsing database URL: %v", err)
	}
	user := "root"
	if u.User != nil && u.User.Username() != "" {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, password)
	return u.String()
}

// hookRequest is one request a hookConsumer received.
type hookRequest struct {
	N          int // arrival order, from 1
	DeliveryID string
	Event      string
	Attempt    string
	Body       []byte
	VerifyErr  error
	// Status is what the consumer answered; 0 when it gave up because the dispatcher
	// cancelled the request (or died).
	Status int
	// At is when the request arrived (its headers and body read).
	At time.Time
}

// hookConsumer is a webhook consumer on 127.0.0.1 that verifies every request's Fluxora
// signature with serveSecret and answers what respond returns. respond may block; it must
// return once ctx (the request's context) is done, so that a killed dispatcher never keeps the
// server from closing.
type hookConsumer struct {
	srv     *httptest.Server
	respond func(ctx context.Context, req *hookRequest) int
	// closing ends every request's context at cleanup, before the server waits for them.
	closing context.Context

	mu       sync.Mutex
	arrivals int
	active   int
	okCount  int
	done     []*hookRequest
	// activeByID counts the requests being answered per delivery id; overlaps lists the ids
	// that had two requests in flight at once (a lease overrun or a double claim).
	activeByID map[string]int
	overlaps   []string
}

func newHookConsumer(t *testing.T, respond func(ctx context.Context, req *hookRequest) int) *hookConsumer {
	t.Helper()
	closing, closeAll := context.WithCancel(context.Background())
	c := &hookConsumer{respond: respond, closing: closing, activeByID: map[string]int{}}
	if c.respond == nil {
		c.respond = func(context.Context, *hookRequest) int { return http.StatusOK }
	}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serveHTTP))
	t.Cleanup(func() {
		closeAll()
		c.srv.Close()
	})
	return c
}

// URL is the consumer's hook URL (http on loopback, which fluxhook allows).
func (c *hookConsumer) URL() string { return c.srv.URL + "/hook" }

func (c *hookConsumer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(c.closing, cancel)()
	body, err := io.ReadAll(r.Body)
	req := &hookRequest{
		DeliveryID: r.Header.Get(sign.HeaderDeliveryID),
		Event:      r.Header.Get("x-fluxora-event"),
		Attempt:    r.Header.Get("x-fluxora-attempt"),
		Body:       body,
		VerifyErr:  sign.VerifyFluxora(r.Header, body, time.Now(), 0, []byte(serveSecret)),
		At:         time.Now(),
	}
	if err != nil && req.VerifyErr == nil {
		req.VerifyErr = fmt.Errorf("reading body: %w", err)
	}
	c.mu.Lock()
	c.arrivals++
	req.N = c.arrivals
	c.active++
	c.activeByID[req.DeliveryID]++
	if c.activeByID[req.DeliveryID] == 2 {
		c.overlaps = append(c.overlaps, req.DeliveryID)
	}
	c.mu.Unlock()

	status := http.StatusUnauthorized
	if req.VerifyErr == nil {
		status = c.respond(ctx, req)
	}
	if status != 0 && ctx.Err() != nil {
		status = 0 // nobody is listening any more: this is not a delivery
	}
	req.Status = status
	// Recorded before the response is written, so that by the time the dispatcher settles the
	// row, the test already sees the answer.
	c.mu.Lock()
	c.active--
	if n := c.activeByID[req.DeliveryID] - 1; n > 0 {
		c.activeByID[req.DeliveryID] = n
	} else {
		delete(c.activeByID, req.DeliveryID)
	}
	if status >= 200 && status <= 299 {
		c.okCount++
	}
	c.done = append(c.done, req)
	c.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
	}
}

// counts returns how many requests arrived, how many are being answered right now, and how
// many were answered 2xx.
func (c *hookConsumer) counts() (arrived, active, ok int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.arrivals, c.active, c.okCount
}

// overlapping returns the delivery ids that had two requests in flight at once.
func (c *hookConsumer) overlapping() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.overlaps...)
}

// requests returns the requests answered (or abandoned) so far.
func (c *hookConsumer) requests() []*hookRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*hookRequest(nil), c.done...)
}

// gate is a latch that hanging consumer requests wait on.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// wait blocks until the gate opens (true) or ctx ends (false).
func (g *gate) wait(ctx context.Context) bool {
	select {
	case <-g.ch:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// serve collects garbage at GOGC=400 unless GOGC says otherwise (see serveGCPercent), as the
// Go collector's go_gc_gogc_percent shows.
func TestServeGCPercent(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	for _, tc := range []struct {
		gogc string
		want float64
	}{{"", serveGCPercent}, {"100", 100}} {
		env := faultEnv(db.URL, "http://127.0.0.1:1/hook")
		env["METRICS_ADDR"] = "127.0.0.1:0"
		if tc.gogc != "" {
			env["GOGC"] = tc.gogc
		}
		p := startServe(t, "serve GOGC="+tc.gogc, env)
		if got := scrapeMetric(t, p.metricsAddr(), "go_gc_gogc_percent"); got != tc.want {
			t.Errorf("GOGC=%q: go_gc_gogc_percent = %v, want %v", tc.gogc, got, tc.want)
		}
	}
}
