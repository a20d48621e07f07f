package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/api"
	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/portal"
	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
)

func init() {
	commands["api"] = command{summary: "Serve the management API alone, without delivering (API_ADDR)", run: runAPI}
}

// apiSettingNames are the settings `fluxhook api` reads: the database, where to listen, the
// key that opens endpoint secrets, the network policies new endpoint URLs are checked against
// (the dispatchers' own: the operator's for an admin key's URL, the row URLs' for a tenant's),
// Redis for breaker state, and logging.
var apiSettingNames = []string{"DATABASE_URL", "API_ADDR", "API_DATABASE_URL", "API_PUBLIC_URL", "PORTAL_FRAME_ANCESTORS", "REDIS_URL", "WEBHOOK_ENCRYPTION_KEY",
	"WEBHOOK_ENCRYPTION_KEY_PREVIOUS", "WEBHOOK_ALLOWED_NETWORKS", "WEBHOOK_ROW_URL_NETWORKS", "LOG_LEVEL", "LOG_FORMAT"}

func runAPI(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("api", env, "fluxhook api [flags]")
	var own []setting
	for _, s := range settings {
		if slices.Contains(apiSettingNames, s.env) {
			own = append(own, s)
		}
	}
	values, err := loadSettingsOf(own, fs, args, env)
	if err != nil {
		return err
	}
	for _, s := range settings {
		if _, ok := values[s.env]; !ok {
			values[s.env] = s.def
		}
	}
	cfg, err := parseServeConfig(values)
	if err == nil && cfg.apiAddr == "" {
		err = errors.New("API_ADDR: is required: the address to serve the API on, such as 127.0.0.1:8080")
	}
	if err != nil {
		return fmt.Errorf("%w:\n%v", errInvalidConfig, err)
	}
	log := newLogger(cfg.logLevel, cfg.logFormat, zapcore.Lock(zapcore.AddSync(env.stderr)), colorFor(env.stderr, env.getenv))
	defer func() { _ = log.Sync() }()
	ln, err := listenAPI(cfg.apiAddr)
	if err != nil {
		return err
	}
	stop, err := startAPI(ctx, cfg, ln, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	<-ctx.Done()
	log.Info("shutting down the API")
	stop()
	return nil
}

// listenAPI binds API_ADDR before anything starts, so that an address in use stops the
// command (serve: before it claims anything) with the setting named.
func listenAPI(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("API_ADDR: cannot listen on %s: %w; choose a free address or leave it empty", addr, err)
	}
	return ln, nil
}

// apiPoolConns bounds the API's own connections: its pool is apart from the dispatcher's, so
// that a burst of API reads waits for an API connection rather than taking the dispatcher's.
const apiPoolConns = 8

// startAPI serves the management API on ln until stop is called: its own pool, the cipher
// that opens endpoint secrets, and Redis for breaker state when the gate is shared.
func startAPI(ctx context.Context, cfg serveConfig, ln net.Listener, log *zap.Logger) (stop func(), err error) {
	d := cfg.dispatcher
	dbURL := d.DatabaseURL
	if cfg.apiDBURL != "" {
		// A role of its own: the dispatcher's may not write endpoints or keys (docs/install.md).
		dbURL = cfg.apiDBURL
	}
	pool, err := connectPool(ctx, dbURL, apiPoolConns, "fluxhook-api")
	if err != nil {
		return nil, err
	}
	if err := fluxsql.CheckCurrent(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	cipher, err := endpoints.NewCipher(d.EncryptionKey, d.EncryptionKeyPrevious)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: WEBHOOK_ENCRYPTION_KEY: %v", errInvalidConfig, err)
	}
	acfg := api.Config{Pool: pool, Cipher: cipher, Logger: log.Named("api"), AllowedNetworks: d.AllowedNetworks, RowURLNetworks: d.RowURLNetworks,
		PublicURL: cfg.publicURL, Portal: portal.Handler(portal.Options{FrameAncestors: cfg.frameAnc}),
		DefaultURL: d.DefaultURL, RedisURL: d.RedisURL}
	var store *redisstore.Store
	if d.RedisURL != "" {
		if store, err = redisstore.Open(d.RedisURL, redisstore.Options{}); err != nil {
			pool.Close()
			return nil, fmt.Errorf("%w: REDIS_URL: %v", errInvalidConfig, err)
		}
		acfg.Breakers = store
	}
	a := api.New(acfg)
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: zap.NewStdLog(log.Named("api"))}
	go func() { _ = srv.Serve(ln) }()
	a.ResumeRecoveries()
	a.RunJanitor()
	log.Info("serving the management API", zap.String("addr", ln.Addr().String()))
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && cfg.publicURL == "" && !tcp.IP.IsLoopback() {
		// Behind a TLS proxy the request looks like plain http: a portal link would be one.
		log.Warn("API_PUBLIC_URL is not set: portal links take each request's host, over http unless the request came over TLS; set it to the https URL users reach the API at")
	}
	return func() {
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
		a.Close()
		pool.Close()
		if store != nil {
			_ = store.Close()
		}
	}, nil
}
