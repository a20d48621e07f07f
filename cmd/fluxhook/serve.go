package main

import (
	"context"
	"errors"
	"flag"
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
	log.Info("starting fluxhook", effectiveConfig(values)...)
	if cfg.redisURL != "" {
		log.Warn("REDIS_URL is set but this build gates in-process; the shared breaker and rate limit are not active yet")
	}
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = d.Start(startCtx)
	cancel()
	if err != nil {
		return err
	}

	<-ctx.Done()
	log.Info("shutting down: draining in-flight deliveries", zap.Duration("drain_timeout", cfg.drainTimeout))
	drainCtx, cancelDrain := context.WithTimeoutCause(context.Background(), cfg.drainTimeout, errors.New("drain timeout"))
	defer cancelDrain()
	go func() {
		select {
		case <-env.signals:
			log.Warn("second signal: cancelling in-flight deliveries")
			cancelDrain()
		case <-drainCtx.Done():
		}
	}()
	if err := d.Stop(drainCtx); err != nil {
		log.Warn("shutdown incomplete", zap.Error(err))
	}
	return nil
}
