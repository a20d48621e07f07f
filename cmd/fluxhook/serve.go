package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/procs"
	"github.com/fluxora/fluxhook/stages/dispatcher"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
)

func init() {
	commands["serve"] = command{summary: "Run the dispatcher until SIGTERM/SIGINT", run: runServe}
}

// runServe validates the whole configuration before connecting to anything, then runs the
// dispatcher until the first signal, drains, and escalates on a second signal or the drain
// timeout.
func runServe(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("serve", env, "fluxhook serve [flags]")
	values, err := loadSettings(fs, args, env)
	if err != nil {
		return err
	}
	// Every check runs even when an earlier one failed, so that one message names every bad
	// variable. dispatcher.New opens no connection (no database, no Redis until used), so a
	// dispatcher built from a configuration that is then refused is only closed.
	cfg, parseErr := parseServeConfig(values)
	log := newLogger(cfg.logLevel, cfg.logFormat, zapcore.Lock(zapcore.AddSync(env.stderr)), colorFor(env.stderr, env.getenv))
	defer func() { _ = log.Sync() }()
	cfg.dispatcher.Logger = log
	redisstore.RouteLogs(log) // the Redis client's own lines too, or they bypass LOG_FORMAT
	d, buildErr := dispatcher.New(cfg.dispatcher)
	// Until Start succeeds, every way out closes what New made (the HTTP transport, a Redis
	// client): serve also runs inside tests' processes, which go on after it returns.
	running := false
	defer func() {
		if d != nil && !running {
			_ = d.Stop(context.Background())
		}
	}()
	if err := mergeConfigErrors(parseErr, buildErr); err != nil {
		return fmt.Errorf("%w:\n%v", errInvalidConfig, err)
	}
	log.Info("starting fluxhook", effectiveConfig(withComputedDefaults(values, d.Config(), cfg.drainTimeout))...)
	// The metrics address is bound before the dispatcher starts: an address that cannot be
	// bound (in use, not local) must stop serve before it registers or claims anything, not
	// after it has leased rows that a second instance would then wait a lease for.
	var metricsLn net.Listener
	if cfg.metricsAddr != "" {
		if metricsLn, err = net.Listen("tcp", cfg.metricsAddr); err != nil {
			return fmt.Errorf("METRICS_ADDR: cannot listen on %s: %w; choose a free local address or leave it empty", cfg.metricsAddr, err)
		}
		defer func() { _ = metricsLn.Close() }()
	}
	var apiLn net.Listener
	if cfg.apiAddr != "" {
		if apiLn, err = listenAPI(cfg.apiAddr); err != nil {
			return err
		}
		defer func() { _ = apiLn.Close() }()
	}
	if cfg.profileDir != "" {
		stopProfile, err := startProfile(cfg.profileDir)
		if err != nil {
			return err
		}
		defer func() {
			if err := stopProfile(); err != nil {
				log.Warn("writing profiles failed", zap.Error(err))
			}
		}()
	}
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = d.Start(startCtx)
	cancel()
	if err != nil {
		return err
	}
	running = true
	// One processor while the work fits on one (package procs says why), from a successful
	// start to the drain; GOMAXPROCS, read from the process's own environment as the runtime
	// reads it, turns this off.
	processors := procs.Adapt(ctx, os.Getenv("GOMAXPROCS"), procs.Options{Logger: log})
	defer processors.Stop()
	var metricsSrv *http.Server
	if metricsLn != nil {
		metricsSrv = &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = metricsSrv.Serve(metricsLn) }()
		log.Info("serving /metrics, /livez and /readyz", zap.String("addr", metricsLn.Addr().String()))
	}

	if apiLn != nil {
		// After the dispatcher started: the API shares its database and schema check.
		stopAPI, err := startAPI(ctx, cfg, apiLn, log)
		if err != nil {
			log.Error("the management API did not start; delivery goes on without it", zap.Error(err))
		} else {
			defer stopAPI()
		}
	}

	<-ctx.Done()
	processors.Stop() // the drain gets the processors it needs
	log.Info("shutting down: draining in-flight deliveries", zap.Int64("drain_timeout_ms", cfg.drainTimeout.Milliseconds()))
	signalled, cancelSignalled := context.WithCancelCause(context.Background())
	defer cancelSignalled(nil)
	drainCtx, cancelDrain := context.WithTimeoutCause(signalled, cfg.drainTimeout, errors.New("drain timeout"))
	defer cancelDrain()
	go func() {
		select {
		case <-env.signals:
			log.Warn("second signal: cancelling in-flight deliveries")
			cancelSignalled(errors.New("second signal"))
		case <-drainCtx.Done():
		}
	}()
	if err := d.Stop(drainCtx); err != nil {
		log.Warn("shutdown incomplete", zap.Error(err))
	}
	if metricsSrv != nil {
		_ = metricsSrv.Close()
	}
	return nil
}
