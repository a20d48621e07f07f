package bench

// The child processes of `fluxhook bench`: the consumer and the dispatcher (`fluxhook serve`),
// each in its own process group so that a Ctrl-C reaches the bench alone and the bench stops
// them in order; and, should the bench die without cleaning up, the kernel kills them
// (Pdeathsig).

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// childProc is one child process with its stderr tail kept for error messages.
type childProc struct {
	name   string
	cmd    *exec.Cmd
	stderr *benchTail
	done   chan struct{} // closed when the process has exited
}

func startChild(name, exe string, args, env []string, stdin io.Reader, stdout io.Writer) (*childProc, error) {
	p := &childProc{name: name, stderr: &benchTail{}, done: make(chan struct{})}
	p.cmd = exec.Command(exe, args...)
	p.cmd.Env = env
	p.cmd.Stdin = stdin
	p.cmd.Stdout = stdout
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the %s: %w", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *childProc) pid() int { return p.cmd.Process.Pid }

func (p *childProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits up to grace for the process to exit, then kills it. It returns
// an error when the process had to be killed or exited with a failure status.
func (p *childProc) stop(grace time.Duration) error {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("the %s did not exit within %s of SIGTERM and was killed", p.name, grace)
		}
	}
	if st := p.cmd.ProcessState; st != nil && !st.Success() {
		return fmt.Errorf("the %s exited with %s\n%s", p.name, st, p.stderr.String())
	}
	return nil
}

// failure describes an unexpected exit, with the end of the process's stderr.
func (p *childProc) failure() error {
	return fmt.Errorf("the %s (pid %d) exited unexpectedly (%v):\n%s", p.name, p.pid(), p.cmd.ProcessState, p.stderr.String())
}

// consumerProc is the consumer child and a client for its control endpoints.
type consumerProc struct {
	*childProc
	stdin  io.WriteCloser
	base   string // http://127.0.0.1:port
	client *http.Client
}

// childPipes opens the pipes to a child's stdin and from its stdout.
func childPipes() (stdinR, stdinW, stdoutR, stdoutW *os.File, err error) {
	if stdinR, stdinW, err = os.Pipe(); err != nil {
		return nil, nil, nil, nil, err
	}
	if stdoutR, stdoutW, err = os.Pipe(); err != nil {
		stdinR.Close()
		stdinW.Close()
		return nil, nil, nil, nil, err
	}
	return stdinR, stdinW, stdoutR, stdoutW, nil
}

// startConsumer starts the consumer child: /hook verified with secret, and /ep/<i> with
// endpointSecrets[i] (the fanout workload's endpoints).
func startConsumer(ctx context.Context, exe, secret string, endpointSecrets []string) (*consumerProc, error) {
	stdinR, stdinW, stdoutR, stdoutW, err := childPipes()
	if err != nil {
		return nil, err
	}
	env := append(childBaseEnv(), benchSecretEnv+"="+secret)
	if len(endpointSecrets) > 0 {
		env = append(env, benchEndpointSecretsEnv+"="+strings.Join(endpointSecrets, ","))
	}
	p, err := startChild("consumer", exe, []string{"bench", benchConsumerMode}, env, stdinR, stdoutW)
	stdinR.Close()
	stdoutW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		return nil, err
	}
	c := &consumerProc{childProc: p, stdin: stdinW, client: &http.Client{Timeout: 60 * time.Second}}
	lines := make(chan string, 1)
	go func() {
		defer stdoutR.Close()
		sc := bufio.NewScanner(stdoutR)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdoutR)
	}()
	select {
	case line, ok := <-lines:
		addr, found := strings.CutPrefix(line, "listening ")
		if !ok || !found {
			c.close()
			return nil, fmt.Errorf("the consumer did not start: %q\n%s", line, p.stderr.String())
		}
		c.base = "http://" + addr
	case <-time.After(30 * time.Second):
		c.close()
		return nil, fmt.Errorf("the consumer did not start within 30 s\n%s", p.stderr.String())
	case <-ctx.Done():
		c.close()
		return nil, ctx.Err()
	}
	return c, nil
}

// hookURL is the URL the dispatcher delivers to.
func (c *consumerProc) hookURL() string { return c.base + "/hook" }

// endpointURL is the URL of the i-th fanout endpoint (from 0).
func (c *consumerProc) endpointURL(i int) string { return c.base + fanoutPath(i) }

// close ends the consumer: closing its stdin asks it to exit.
func (c *consumerProc) close() {
	_ = c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		_ = c.stop(2 * time.Second)
	}
}

func (c *consumerProc) stats(ctx context.Context) (consumerStats, error) {
	var s consumerStats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/stats", nil)
	if err != nil {
		return s, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		if c.exited() {
			return s, c.failure()
		}
		return s, fmt.Errorf("asking the consumer for its stats: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return s, fmt.Errorf("reading the consumer's stats: %w", err)
	}
	return s, nil
}

func (c *consumerProc) reset(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/reset", nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("resetting the consumer: %w", err)
	}
	resp.Body.Close()
	return nil
}

// arrivals fetches every arrival recorded since the last reset.
func (c *consumerProc) arrivals(ctx context.Context) ([]arrivalRecord, error) {
	return c.arrivalsFrom(ctx, 0)
}

// arrivalsFrom fetches the arrivals recorded since the last reset from the from-th on (the
// soak workload reads each interval's new ones).
func (c *consumerProc) arrivalsFrom(ctx context.Context, from int) ([]arrivalRecord, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/arrivals?from="+strconv.Itoa(from), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetching arrivals from the consumer: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("fetching arrivals from the consumer: %w", err)
	}
	if len(body)%arrivalRecordSize != 0 {
		return nil, fmt.Errorf("the consumer sent %d bytes of arrivals, not a multiple of %d", len(body), arrivalRecordSize)
	}
	out := make([]arrivalRecord, len(body)/arrivalRecordSize)
	for i := range out {
		rec := body[i*arrivalRecordSize:]
		copy(out[i].id[:], rec[:16])
		out[i].ns = int64(binary.LittleEndian.Uint64(rec[16:24]))
		out[i].ep = binary.LittleEndian.Uint16(rec[24:26])
	}
	return out, nil
}

// waitReceived polls the consumer until it has recorded at least n verified requests and
// returns its stats, or fails at the deadline or when the dispatcher exits.
func (c *consumerProc) waitReceived(ctx context.Context, n int, timeout time.Duration, disp *dispatcherProc) (consumerStats, error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(25 * time.Millisecond) // the times come from the arrivals; this only notices the end
	defer tick.Stop()
	for {
		s, err := c.stats(ctx)
		if err != nil {
			return s, err
		}
		if s.Received >= n {
			return s, nil
		}
		if disp != nil && disp.exited() {
			return s, disp.failure()
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("the consumer received %d of %d events within %s", s.Received, n, timeout)
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-tick.C:
		}
	}
}

// dispatcherProc is one `fluxhook serve` child with its metrics endpoint.
type dispatcherProc struct {
	*childProc
	metricsAddr string
	started     time.Time
}

// startDispatcher runs `fluxhook serve` with env (nothing else inherited) and waits until it
// answers /readyz: connected, listening for NOTIFY, schema current.
func startDispatcher(ctx context.Context, exe string, env map[string]string) (*dispatcherProc, error) {
	return startServer(ctx, "dispatcher", exe, []string{"serve"}, env)
}

// startServer runs exe with args and env (nothing else inherited), METRICS_ADDR set to a free
// address, and waits until it answers /readyz there: the dispatcher, or a baseline's.
func startServer(ctx context.Context, name, exe string, args []string, env map[string]string) (*dispatcherProc, error) {
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	env["METRICS_ADDR"] = addr
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	full := childBaseEnv()
	for _, k := range keys {
		full = append(full, k+"="+env[k])
	}
	started := time.Now()
	p, err := startChild(name, exe, args, full, nil, io.Discard)
	if err != nil {
		return nil, err
	}
	d := &dispatcherProc{childProc: p, metricsAddr: addr, started: started}
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if d.exited() {
			return nil, d.failure()
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return d, nil
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			_ = d.stop(5 * time.Second)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("the %s was not ready within 30 s:\n%s", name, d.stderr.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// dispatcherMetrics are the counters the bench reads from /metrics.
type dispatcherMetrics struct {
	Claims       float64 // claim statements
	EmptyClaims  float64 // claims that returned no row
	ClaimedRows  float64
	Settles      float64 // settle batches
	SettledRows  float64
	Released     float64 // rows handed back unattempted (endpoint saturated)
	GateDecides  float64 // the gate's Redis round trips for claimed batches (counted by its client)
	GateRecords  float64 // the gate's Redis round trips for settled batches
	Wakeups      map[string]float64
	ok           bool
	scrapeFailed error
}

// scrape reads the dispatcher's claim, settle and gate round-trip counters from /metrics. Each
// scrape also runs the dispatcher's one backlog query.
func (d *dispatcherProc) scrape(ctx context.Context) dispatcherMetrics {
	m := dispatcherMetrics{Wakeups: map[string]float64{}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.metricsAddr+"/metrics", nil)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		m.scrapeFailed = err
		return m
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		m.scrapeFailed = fmt.Errorf("GET /metrics: %s", resp.Status)
		return m
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := parseMetricLine(line)
		if !ok {
			continue
		}
		switch {
		case name == "fluxora_webhook_claim_batch_rows_count":
			m.Claims = value
		case name == "fluxora_webhook_claim_batch_rows_sum":
			m.ClaimedRows = value
		case name == `fluxora_webhook_claim_batch_rows_bucket{le="0"}`:
			m.EmptyClaims = value
		case name == "fluxora_webhook_settle_batch_rows_count":
			m.Settles = value
		case name == "fluxora_webhook_settle_batch_rows_sum":
			m.SettledRows = value
		case name == "fluxora_webhook_released_total":
			m.Released = value
		case name == `fluxora_webhook_gate_store_round_trips_total{op="decide"}`:
			m.GateDecides = value
		case name == `fluxora_webhook_gate_store_round_trips_total{op="record"}`:
			m.GateRecords = value
		case strings.HasPrefix(name, "fluxora_webhook_wakeups_total{"):
			src := strings.TrimSuffix(strings.TrimPrefix(name, `fluxora_webhook_wakeups_total{source="`), `"}`)
			m.Wakeups[src] = value
		}
	}
	if err := sc.Err(); err != nil {
		m.scrapeFailed = fmt.Errorf("reading /metrics: %w", err)
		return m
	}
	m.ok = m.Claims > 0 // a dispatcher that has claimed nothing yet has no counters to compare
	return m
}

// parseMetricLine splits a Prometheus text-format sample into its name (with labels) and value.
func parseMetricLine(line string) (string, float64, bool) {
	i := strings.LastIndexByte(line, ' ')
	if i <= 0 {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(line[i+1:], 64)
	if err != nil {
		return "", 0, false
	}
	return line[:i], v, true
}

// procPeakRSS is the process's peak resident set size in bytes (VmHWM).
func procPeakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return 0, err
				}
				return kb << 10, nil
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmHWM", pid)
}

// childBaseEnv is what every child inherits from the bench: enough to run, plus the Go
// runtime knobs a user may be experimenting with. Database, webhook and Redis settings are
// set explicitly, so that nothing from the user's shell changes what is measured by accident.
func childBaseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "PATH", "HOME", "TMPDIR", "GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG", "GORACE", "GOTRACEBACK":
			env = append(env, kv)
		}
	}
	return env
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// benchTail keeps the last 16 KiB written to it (a child's stderr).
type benchTail struct {
	mu sync.Mutex
	b  []byte
}

func (t *benchTail) Write(p []byte) (int, error) {
	const limit = 16 << 10
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > limit {
		t.b = append(t.b[:0], t.b[len(t.b)-limit:]...)
	}
	return len(p), nil
}

func (t *benchTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
