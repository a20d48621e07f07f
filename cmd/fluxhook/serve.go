package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/stages/dispatcher"
)

func init() {
	commands["serve"] = command{summary: "run the dispatcher until SIGTERM/SIGINT", run: runServe}
}

// runServe validates the whole configuration before connecting to anything, then runs the
// dispatcher until the first signal, drains, and escalates on a second signal or the drain
// timeout.
func runServe(ctx context.Context, env *environment, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	values, err := loadSettings(fs, args, env.getenv)
	if err != nil {
		return err
	}
	cfg, err := parseServeConfig(values)
	if err != nil {
		return usageError("invalid configuration:\n%v", err)
	}
	log := newLogger(cfg.logLevel, cfg.logFormat, zapcore.Lock(zapcore.AddSync(env.stderr)))
	defer func() { _ = log.Sync() }()
	cfg.dispatcher.Logger = log
	d, err := dispatcher.New(cfg.dispatcher)
	if err != nil {
		return usageError("invalid configuration:\n%v", err)
	}
	log.Info("starting fluxhook", effectiveConfig(withComputedDefaults(values, d.Config(), cfg.drainTimeout))...)
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

	var metricsSrv *http.Server
	if cfg.metricsAddr != "" {
		ln, err := net.Listen("tcp", cfg.metricsAddr)
		if err != nil {
			_ = d.Stop(context.Background())
			return fmt.Errorf("METRICS_ADDR: %w", err)
		}
		metricsSrv = &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = metricsSrv.Serve(ln) }()
		log.Info("serving /metrics, /livez and /readyz", zap.String("addr", ln.Addr().String()))
	}

	<-ctx.Done()
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
