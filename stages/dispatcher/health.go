package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/stages/wake"
)

// Handler serves /metrics (Prometheus), /livez and /readyz for this dispatcher. It is meant
// for METRICS_ADDR: an operator's port, not the internet.
//
//   - /livez answers 200 while the claiming loop keeps going round; a loop stuck for longer
//     than three poll intervals plus the request timeout plus 30 s (a deadlock) answers 503
//     so that a supervisor restarts the process.
//   - /readyz answers 200 when PostgreSQL answers, the NOTIFY listener is connected and the
//     schema is current, and 503 from the moment shutdown begins, so a load balancer or
//     orchestrator stops counting on this instance before it goes away.
func (d *Dispatcher) Handler() http.Handler {
	mux := http.NewServeMux()
	// ContinueOnError: the backlog gauges come from a query that can time out under load;
	// with the default (HTTP 500) that blanked every counter of the scrape with it.
	mux.Handle("/metrics", promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{
		Registry: d.metrics.reg, ErrorHandling: promhttp.ContinueOnError, ErrorLog: metricsErrorLog{d.log},
	}))
	mux.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) {
		if err := d.Live(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := d.Ready(ctx); err != nil {
			if errors.Is(err, errDatabaseUnready) {
				// The driver's error names the database's address, role and database: the
				// log has it, the unauthenticated answer does not.
				d.log.Warn("not ready: database check failed", zap.Error(err))
				http.Error(w, "database unavailable or schema not current (the log says which)", http.StatusServiceUnavailable)
				return
			}
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// errDatabaseUnready marks Ready's error when PostgreSQL did not answer or the schema is not
// current.
var errDatabaseUnready = errors.New("database")

// Registry is the dispatcher's own Prometheus registry, for programs that embed fluxhook and
// serve metrics themselves.
func (d *Dispatcher) Registry() *prometheus.Registry { return d.metrics.reg }

// Live returns nil while the claiming loop is running and has gone round recently.
func (d *Dispatcher) Live() error {
	d.mu.Lock()
	started, stopping := d.started, d.stopping
	d.mu.Unlock()
	if !started {
		return fmt.Errorf("not started")
	}
	if stopping {
		return nil // draining is alive; readiness says it is going away
	}
	last := time.Unix(0, d.lastLoop.Load())
	limit := d.liveLimit()
	if since := d.now().Sub(last); since > limit {
		return fmt.Errorf("claiming loop has not run for %s (limit %s)", since.Round(time.Second), limit)
	}
	return nil
}

// liveLimit is how long the claiming loop may go without a round before /livez fails. A
// healthy loop waits at most a poll interval when idle, and, with every slot taken, until a
// request finishes, which the request timeout bounds: a limit without the timeout would
// restart a healthy process whose consumers are merely slow. The 30 s cover a slow claim or
// settle statement.
func (d *Dispatcher) liveLimit() time.Duration {
	return 3*d.cfg.PollInterval + d.cfg.Timeout + 30*time.Second
}

// Ready returns nil when this instance can deliver: not shutting down, PostgreSQL reachable,
// listener connected, schema current.
func (d *Dispatcher) Ready(ctx context.Context) error {
	if d.draining.Load() {
		return fmt.Errorf("shutting down")
	}
	pool, waker := d.handles()
	if pool == nil || waker == nil {
		return fmt.Errorf("not started")
	}
	if err := fluxsql.CheckCurrent(ctx, pool); err != nil {
		return fmt.Errorf("%w: %w", errDatabaseUnready, err)
	}
	if !waker.Connected() {
		return fmt.Errorf("NOTIFY listener not connected")
	}
	return nil
}

// handles returns the pool and waker once Start has set them (nil before), read under the
// lock Start holds while it sets them.
func (d *Dispatcher) handles() (*pgxpool.Pool, *wake.Waker) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pool, d.waker
}

// metricsErrorLog reports what a scrape could not serve: a metric that could not be collected
// (the backlog query failed) or, if the scraper went away mid-answer, each family that could
// not be written. One fixed message; the log's sampling thins out repeats.
type metricsErrorLog struct{ log *zap.Logger }

// Println is promhttp.Logger's one method.
func (l metricsErrorLog) Println(v ...any) {
	l.log.Warn("metrics collection incomplete", zap.String("error", strings.TrimSpace(fmt.Sprintln(v...))))
}
