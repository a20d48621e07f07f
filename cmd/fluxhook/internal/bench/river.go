package bench

// The River baseline (--baseline river): River tuned, run beside fluxhook in the same
// invocation, workload by workload, so that the ratio between them is one command away. River
// lives in a program of its own (riverbaseline), built for the run, so that it stays out of
// the fluxhook binary.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/bench/produce"
)

// baselineRiver is --baseline's one value.
const baselineRiver = "river"

// riverBaselinePackage is the baseline's program, built with the go command from the module
// the bench is run in.
const riverBaselinePackage = "github.com/fluxora/fluxhook/cmd/fluxhook/internal/bench/riverbaseline"

// riverTuned describes the baseline in the report.
const riverTuned = "River tuned: FetchCooldown 1 ms, FetchPollInterval 20 ms, 200 workers (riverpgxv5, pgxpool defaults); its producer inserts with InsertTx, one transaction per event"

// riverBaseline is the baseline's program, built into a directory of its own for the run.
type riverBaseline struct {
	dir, exe string
	// runs numbers the producers' output files.
	runs atomic.Int64
}

// buildRiverBaseline builds riverbaseline with the go command, from the working directory's
// module: the bench runs from a checkout of fluxhook (go run ./cmd/fluxhook bench).
func buildRiverBaseline(ctx context.Context) (*riverBaseline, error) {
	dir, err := os.MkdirTemp("", "fluxhook-bench-river-")
	if err != nil {
		return nil, err
	}
	exe := filepath.Join(dir, "riverbaseline")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", exe, riverBaselinePackage)
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("--baseline river builds River's program from fluxhook's source with Go: run the bench in a checkout of fluxhook (go run ./cmd/fluxhook bench ...): go build %s: %v\n%s",
			riverBaselinePackage, err, strings.TrimSpace(string(out)))
	}
	return &riverBaseline{dir: dir, exe: exe}, nil
}

func (r *riverBaseline) close() { _ = os.RemoveAll(r.dir) }

// runRiver runs the baseline's program in mode to its end (migrate, prefill).
func (b *bench) runRiver(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, b.river.exe, args...)
	cmd.Env = append(childBaseEnv(), "DATABASE_URL="+b.db.url)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("riverbaseline %s: %v\n%s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// riverEnv is the baseline dispatcher's configuration: the database, the consumer, the
// secret and the signature scheme, as fluxhook's dispatcher has them.
func (b *bench) riverEnv() map[string]string {
	env := map[string]string{
		"DATABASE_URL":   b.db.url,
		"WEBHOOK_URL":    b.consumer.hookURL(),
		"WEBHOOK_SECRET": b.secret,
	}
	if v := b.dispatcherEnv["WEBHOOK_SIGNATURE_SCHEME"]; v != "" {
		env["WEBHOOK_SIGNATURE_SCHEME"] = v
	}
	return env
}

// startRiverSession is startSession for the baseline: its dispatcher (riverbaseline work)
// with the counters around its life.
func (b *bench) startRiverSession(ctx context.Context) (*session, error) {
	s := &session{b: b, baseline: true, redisBefore: -1}
	var err error
	if s.before, err = b.db.counters(ctx); err != nil {
		return nil, err
	}
	s.cpuStart, s.clockStart = b.cpuSnapshot(0), time.Now()
	if s.disp, err = startServer(ctx, "River baseline", b.river.exe, []string{"work"}, b.riverEnv()); err != nil {
		return nil, err
	}
	b.logf("  River pid %d ready after %s", s.disp.pid(), time.Since(s.disp.started).Round(time.Millisecond))
	return s, nil
}

// riverPrefilledSession is prefilledSession for the baseline: n jobs inserted with River's
// InsertManyFastTx while no River client runs, then ANALYZE, as fluxhook's prefill does.
func (b *bench) riverPrefilledSession(ctx context.Context, n int) (*session, error) {
	if err := b.resetTables(ctx); err != nil {
		return nil, err
	}
	started := time.Now()
	if err := b.runRiver(ctx, "prefill", "-events", strconv.Itoa(n), "-event-type", "bench.drain",
		"-payload-bytes", strconv.Itoa(b.opts.payloadBytes)); err != nil {
		return nil, err
	}
	if err := b.db.exec(ctx, `ANALYZE river_job`); err != nil {
		return nil, err
	}
	b.logf("  prefilled %d River jobs in %s", n, time.Since(started).Round(time.Millisecond))
	return b.startRiverSession(ctx)
}

// riverProducer is the baseline's producer: riverbaseline produce, in a process of its own,
// timing its InsertTx transactions with package produce and handing the timings back.
type riverProducer struct {
	b      *bench
	proc   *childProc
	stdin  io.WriteCloser
	lines  chan string
	out    string
	nconns int
	total  int
}

// startRiverProducer starts the baseline's producer: it connects and waits for warmUp.
func (b *bench) startRiverProducer(ctx context.Context, nconns, total int, period time.Duration, eventType string) (*riverProducer, error) {
	out := filepath.Join(b.river.dir, fmt.Sprintf("sent-%d", b.river.runs.Add(1)))
	stdinR, stdinW, stdoutR, stdoutW, err := childPipes()
	if err != nil {
		return nil, err
	}
	args := []string{"produce", "-connections", strconv.Itoa(nconns), "-total", strconv.Itoa(total),
		"-period", period.String(), "-event-type", eventType, "-payload-bytes", strconv.Itoa(b.opts.payloadBytes), "-out", out}
	proc, err := startChild("River producer", b.river.exe, args, append(childBaseEnv(), "DATABASE_URL="+b.db.url), stdinR, stdoutW)
	stdinR.Close()
	stdoutW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		return nil, err
	}
	b.db.conns.Add(int64(nconns))
	p := &riverProducer{b: b, proc: proc, stdin: stdinW, lines: make(chan string, 4), out: out, nconns: nconns, total: total}
	go func() {
		defer stdoutR.Close()
		sc := bufio.NewScanner(stdoutR)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	return p, nil
}

// line waits for the producer's next status line starting with prefix.
func (p *riverProducer) line(ctx context.Context, prefix string, timeout time.Duration) error {
	select {
	case l, ok := <-p.lines:
		if !ok {
			<-p.proc.done
			return p.proc.failure()
		}
		if !strings.HasPrefix(l, prefix) {
			return fmt.Errorf("the River producer said %q, want %q", l, prefix)
		}
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("the River producer did not say %q within %s\n%s", prefix, timeout, p.proc.stderr.String())
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *riverProducer) warmUp(ctx context.Context, s *session) (int, error) {
	if err := p.line(ctx, "warm ", 30*time.Second); err != nil {
		return 0, fmt.Errorf("warming up: %w", err)
	}
	p.b.db.stmts.Add(int64(p.nconns)) // one transaction each
	if _, err := p.b.consumer.waitReceived(ctx, p.nconns, 10*time.Second, s.disp); err != nil {
		return 0, fmt.Errorf("warming up: %w", err)
	}
	return p.nconns, nil
}

func (p *riverProducer) produce(ctx context.Context, period time.Duration, total int, eventType string) ([]sentEvent, error) {
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		return nil, fmt.Errorf("starting the River producer: %w", err)
	}
	timeout := time.Duration(total)*period + time.Minute
	if err := p.line(ctx, "sent ", timeout); err != nil {
		return nil, err
	}
	select { // it exits once it has written the events
	case <-p.proc.done:
	case <-time.After(10 * time.Second):
	}
	if err := p.proc.stop(time.Second); err != nil {
		return nil, err
	}
	p.b.db.stmts.Add(int64(p.total))
	f, err := os.Open(p.out)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sent, err := produce.ReadEvents(f)
	if err != nil {
		return nil, err
	}
	if len(sent) != total {
		return nil, fmt.Errorf("the River producer reported %d events, want %d", len(sent), total)
	}
	for _, ev := range sent {
		if !ev.OK {
			return nil, fmt.Errorf("the River producer reported a failed insert")
		}
	}
	return sent, nil
}

func (p *riverProducer) close() {
	_ = p.stdin.Close()
	if !p.proc.exited() {
		_ = p.proc.stop(5 * time.Second)
	}
	_ = os.Remove(p.out)
}

// riverIdle is the idle workload on the baseline.
func (b *bench) riverIdle(ctx context.Context) (*latencyResult, error) {
	return b.latencyRun(ctx, "idle", b.opts.idleEvents, b.opts.idleInterval, 1, latencyOptions{river: true})
}

// riverSteady is the steady workload at rate on the baseline.
func (b *bench) riverSteady(ctx context.Context, rate int) (*latencyResult, error) {
	return b.steadyRun(ctx, rate, latencyOptions{river: true})
}

// riverDrain is the drain workload on the baseline.
func (b *bench) riverDrain(ctx context.Context) (*drainResult, error) {
	return b.drainRun(ctx, b.riverPrefilledSession)
}
