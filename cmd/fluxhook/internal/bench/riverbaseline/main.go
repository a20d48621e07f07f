// Command riverbaseline is the River baseline of `fluxhook bench --baseline river`: River
// (github.com/riverqueue/river) tuned for latency, doing per event what fluxhook does. It is a
// program of its own so that River stays out of the fluxhook binary: the bench builds it
// (go build) for the run and starts it as it starts `fluxhook serve`.
//
// Its modes, the first argument:
//
//	migrate   applies River's migrations (rivermigrate) to DATABASE_URL
//	work      the dispatcher: a River client, FetchCooldown 1 ms, FetchPollInterval 20 ms,
//	          200 workers on the default queue, each job signed as fluxhook signs (package
//	          sign, WEBHOOK_SECRET) and POSTed to WEBHOOK_URL, completed on a 2xx; it answers
//	          GET /readyz on METRICS_ADDR once started, and stops on SIGTERM
//	prefill   inserts -events jobs (InsertManyFastTx, one transaction), for the drain
//	produce   the producer: -connections connections, one unmeasured job each, then "warm N"
//	          on stdout; on "go" from stdin -total jobs, one per -period, each with InsertTx in
//	          a transaction of its own, timed by package produce like fluxhook's producer;
//	          the events are written to -out
//
// Events carry a random UUID as their delivery id, sent as fluxhook sends its own, so the
// bench's verifying consumer records them like fluxhook's deliveries.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/bench/produce"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/sign"
)

// Tuned is the River configuration compared with: the fetch loop woken at most 1 ms after an
// insert's notification, a poll every 20 ms as the backstop, 200 workers.
const (
	fetchCooldown     = time.Millisecond
	fetchPollInterval = 20 * time.Millisecond
	maxWorkers        = 200
)

// errUsage marks a bad command line (exit status 2).
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "riverbaseline:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: riverbaseline migrate|work|prefill|produce [flags]", errUsage)
	}
	dbURL := getenv("DATABASE_URL")
	if dbURL == "" {
		return fmt.Errorf("%w: DATABASE_URL is not set", errUsage)
	}
	fs := flag.NewFlagSet("riverbaseline "+args[0], flag.ContinueOnError)
	events := fs.Int("events", 0, "prefill: jobs to insert")
	conns := fs.Int("connections", 1, "produce: producer connections")
	total := fs.Int("total", 0, "produce: jobs to insert after the warm-up")
	period := fs.Duration("period", 0, "produce: time between jobs")
	eventType := fs.String("event-type", "bench.river", "prefill, produce: the events' type")
	padBytes := fs.Int("payload-bytes", 200, "prefill, produce: padding in each payload")
	out := fs.String("out", "", "produce: file the events' timings are written to")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	switch args[0] {
	case "migrate":
		return migrate(ctx, dbURL)
	case "work":
		return work(ctx, dbURL, getenv)
	case "prefill":
		if *events < 1 {
			return fmt.Errorf("%w: prefill: -events must be positive", errUsage)
		}
		return prefill(ctx, dbURL, *events, *eventType, *padBytes)
	case "produce":
		if *conns < 1 || *total < 1 || *period <= 0 || *out == "" {
			return fmt.Errorf("%w: produce: -connections, -total, -period and -out are required", errUsage)
		}
		return produceRun(ctx, dbURL, *conns, *total, *period, *eventType, *padBytes, *out, stdin, stdout)
	}
	return fmt.Errorf("%w: unknown mode %q: use migrate, work, prefill or produce", errUsage, args[0])
}

// webhookArgs is one event as a River job: what fluxhook's outbox row holds.
type webhookArgs struct {
	DeliveryID string          `json:"delivery_id"`
	EventType  string          `json:"event_type"`
	Payload    json.RawMessage `json:"payload"`
}

// Kind names the job kind in river_job.
func (webhookArgs) Kind() string { return "fluxhook_bench_webhook" }

func connConfig(dbURL, app string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = app
	return cfg, nil
}

// migrate brings River's schema up to date.
func migrate(ctx context.Context, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrating River's schema: %w", err)
	}
	return nil
}

// insertClient is a River client that only inserts (with the Tx variants): the producer's
// side, with the tuned configuration, whose FetchCooldown also spaces its insert
// notifications.
func insertClient() (*river.Client[pgx.Tx], error) {
	return river.NewClient(riverpgxv5.New(nil), &river.Config{
		FetchCooldown:     fetchCooldown,
		FetchPollInterval: fetchPollInterval,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
}

// webhookWorker delivers a job as fluxhook delivers an outbox row: the payload compacted,
// signed by package sign, POSTed with keep-alive; any 2xx completes it.
type webhookWorker struct {
	river.WorkerDefaults[webhookArgs]
	url    string
	signer *sign.Signer
	client *http.Client
}

func (w *webhookWorker) Work(ctx context.Context, job *river.Job[webhookArgs]) error {
	var body bytes.Buffer
	if err := json.Compact(&body, job.Args.Payload); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	d := &delivery.Delivery{DeliveryID: job.Args.DeliveryID, EventType: job.Args.EventType, Payload: body.Bytes(), Attempt: job.Attempt}
	w.signer.Sign(d, time.Now())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(d.Payload))
	if err != nil {
		return err
	}
	req.Header = d.Header
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("the consumer answered %s", resp.Status)
	}
	return nil
}

// work runs the River client until ctx ends, then stops it gracefully (running jobs finish).
func work(ctx context.Context, dbURL string, getenv func(string) string) error {
	url, secret, metricsAddr := getenv("WEBHOOK_URL"), getenv("WEBHOOK_SECRET"), getenv("METRICS_ADDR")
	if url == "" || secret == "" || metricsAddr == "" {
		return fmt.Errorf("%w: work needs WEBHOOK_URL, WEBHOOK_SECRET and METRICS_ADDR", errUsage)
	}
	signer, err := sign.New(sign.Config{Secret: secret, Scheme: sign.Scheme(getenv("WEBHOOK_SIGNATURE_SCHEME"))})
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	poolCfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "fluxhook-bench-river"
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	transport := &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: maxWorkers,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &webhookWorker{url: url, signer: signer, client: &http.Client{Transport: transport, Timeout: 30 * time.Second}})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     fetchCooldown,
		FetchPollInterval: fetchPollInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:           workers,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("starting River: %w", err)
	}
	ln, err := net.Listen("tcp", metricsAddr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	<-ctx.Done()
	_ = srv.Close()
	stopCtx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	return client.Stop(stopCtx)
}

// prefill inserts n jobs in one transaction, as the bench's COPY prefills fluxhook's outbox.
func prefill(ctx context.Context, dbURL string, n int, eventType string, padBytes int) error {
	cfg, err := connConfig(dbURL, "fluxhook-bench")
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	client, err := insertClient()
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	pad := produce.Payload(0, padBytes)
	const batch = 10000
	params := make([]river.InsertManyParams, 0, batch)
	for i := 0; i < n; i += batch {
		params = params[:0]
		for range min(batch, n-i) {
			params = append(params, river.InsertManyParams{Args: webhookArgs{DeliveryID: produce.FormatID(produce.NewID()), EventType: eventType, Payload: pad}})
		}
		if _, err := client.InsertManyFastTx(ctx, tx, params); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
	}
	return tx.Commit(ctx)
}

// produceRun is the River producer: see the package comment.
func produceRun(ctx context.Context, dbURL string, nconns, total int, period time.Duration, eventType string, padBytes int, out string, stdin io.Reader, stdout io.Writer) error {
	cfg, err := connConfig(dbURL, "fluxhook-bench-producer")
	if err != nil {
		return err
	}
	var conns []*pgx.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close(context.Background())
		}
	}()
	for range nconns {
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("connecting a producer: %w", err)
		}
		conns = append(conns, c)
	}
	client, err := insertClient()
	if err != nil {
		return err
	}
	insert := func(eventType string) produce.Insert {
		return func(ctx context.Context, conn *pgx.Conn, seq int) ([16]byte, error) {
			id := produce.NewID()
			tx, err := conn.Begin(ctx)
			if err != nil {
				return id, err
			}
			defer tx.Rollback(context.Background())
			args := webhookArgs{DeliveryID: produce.FormatID(id), EventType: eventType, Payload: produce.Payload(seq, padBytes)}
			if _, err := client.InsertTx(ctx, tx, args, nil); err != nil {
				return id, err
			}
			return id, tx.Commit(ctx)
		}
	}
	// One unmeasured event per connection, as fluxhook's producer warms up: the statements
	// prepared, the backends warm.
	warm := insert("bench.warmup")
	for i, c := range conns {
		if _, err := warm(ctx, c, -1-i); err != nil {
			return fmt.Errorf("warming up a producer: %w", err)
		}
	}
	fmt.Fprintf(stdout, "warm %d\n", len(conns))
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if strings.TrimSpace(line) != "go" {
		return fmt.Errorf("waiting for go on stdin: %q, %v", line, err)
	}
	sent, _, err := produce.AtRate(ctx, conns, period, total, insert(eventType))
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := produce.WriteEvents(f, sent); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sent %d\n", len(sent))
	return nil
}
