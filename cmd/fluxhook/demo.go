package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/api"
	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/pgtemp"
	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/portal"
	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/receiver"
	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/dispatcher"
)

func init() {
	commands["demo"] = command{
		summary: "Watch signed webhooks arrive: throwaway PostgreSQL (or DATABASE_URL), local receiver, sample events",
		run:     runDemo,
	}
}

// runDemo is the README's first command: everything fluxhook does, on one screen, with
// nothing to set up. Without DATABASE_URL it starts a throwaway PostgreSQL cluster (installing
// Debian's server package if needed) and removes it on exit.
func runDemo(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("demo", env, "fluxhook demo [--events N] [--interval DURATION]")
	dbURL := databaseURLFlag(fs, env)
	events := fs.Int("events", 0, "stop after this many events have been delivered (0 = run until Ctrl-C)")
	interval := fs.Duration("interval", 500*time.Millisecond, "time between sample events")
	if err := noArguments(fs, args); err != nil {
		return err
	}
	if *interval <= 0 || *events < 0 {
		return usageError("--interval must be positive and --events not negative")
	}
	out := env.stdout

	url := *dbURL
	if url == "" {
		fmt.Fprintln(out, "DATABASE_URL is not set: starting a throwaway PostgreSQL cluster (removed on exit)...")
		cluster, err := pgtemp.Start(ctx, pgtemp.Options{Progress: env.stderr})
		if err != nil {
			return fmt.Errorf("starting a throwaway PostgreSQL (set DATABASE_URL to use your own): %w", err)
		}
		defer func() {
			if err := cluster.Stop(); err != nil {
				fmt.Fprintf(env.stderr, "stopping the throwaway cluster: %v\n", err)
			}
		}()
		url = cluster.URL()
	} else {
		// Never in the user's own database: a running serve there would take the demo's
		// events (and the demo would wait for them forever), and its endpoints would receive
		// the samples.
		scratch, err := pgtemp.CreateScratch(ctx, url, "fluxhook_demo")
		if err != nil {
			return fmt.Errorf("the demo runs in a database of its own on DATABASE_URL's server: %w; or unset DATABASE_URL for a throwaway cluster", err)
		}
		defer func() {
			if err := scratch.Drop(); err != nil {
				fmt.Fprintf(env.stderr, "removing the demo's database: %v\n", err)
			}
		}()
		fmt.Fprintf(out, "DATABASE_URL is set: running in a database of the demo's own, %s, on that server (dropped on exit)\n", scratch.Name)
		url = scratch.URL
	}
	pool, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := fluxsql.Migrate(ctx, pool); err != nil {
		return err
	}
	fmt.Fprintf(out, "schema installed (version %d) in %s\n", fluxsql.LatestVersion(), redactURL(url))

	// The consumer: the same verifying receiver as `fluxhook receive`, plus a flaky path that
	// fails every first attempt so the demo shows a retry with the same delivery id.
	secret := randomSecret()
	var mu sync.Mutex
	sentAt := map[string]time.Time{}
	var apiBase, apiKey string // set under mu once the API serves
	delivered := 0
	done := make(chan struct{})
	recv := &receiver.Receiver{
		Secrets: []string{secret},
		OnDelivery: func(d receiver.Delivery) {
			mu.Lock()
			defer mu.Unlock()
			start, ok := sentAt[d.ID]
			latency := "?"
			if ok {
				latency = fmt.Sprintf("%.1f ms", float64(d.ReceivedAt.Sub(start).Microseconds())/1000)
			}
			delivered++
			if delivered == 1 {
				// Once, for the first delivery: how to ask the API what happened to it.
				defer fmt.Fprintf(out, "  every attempt of this delivery, with the consumer's answer:\n  curl -s -H 'Authorization: Bearer %s' %s/v1/deliveries/%s\n",
					apiKey, apiBase, d.ID)
			}
			fmt.Fprintf(out, "✓ received %-16s delivery %s  attempt %d  signature ok  %s after insert  body %s\n",
				d.Event, d.ID, d.Attempt, latency, d.Body)
			if *events > 0 && delivered == *events {
				close(done)
			}
		},
		OnReject: func(r receiver.Rejection) {
			fmt.Fprintf(out, "✗ rejected delivery %s: %d %s\n", r.DeliveryID, r.Status, r.Reason)
		},
	}
	mux := http.NewServeMux()
	mux.Handle("/hook", recv)
	mux.HandleFunc("/flaky", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-fluxora-attempt") == "1" {
			fmt.Fprintf(out, "… flaky endpoint answered 503 to attempt 1 of %s; fluxhook will retry\n", r.Header.Get("x-fluxora-delivery-id"))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		recv.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "receiver verifying signatures at %s/hook\n", base)

	// The demo's events belong to one tenant, demoTenant, whose portal link the demo prints:
	// the receiver above is that tenant's endpoint for every event (signed with its secret),
	// and two more managed endpoints with filters and secrets of their own each take the
	// events their filter matches, signed with that endpoint's secret, which only its
	// receiver holds. They are removed when the demo ends.
	all, err := endpoints.Add(ctx, pool, nil, endpoints.New{URL: base + "/hook", Secret: secret, Tenant: demoTenant,
		Description: "fluxhook demo: every event"})
	if err != nil {
		return err
	}
	defer func() {
		_, _ = endpoints.Remove(context.WithoutCancel(ctx), pool, all.ID, endpoints.PendingDrop)
	}()
	fmt.Fprintf(out, "endpoint %-8s %s receives every event of tenant %s at /hook\n", "all", all.ID, demoTenant)
	for _, e := range []struct{ name, filter string }{{"streams", "stream.*"}, {"orders", "order.*"}} {
		ep, err := endpoints.Add(ctx, pool, nil, endpoints.New{URL: base + "/" + e.name, EventTypes: []string{e.filter},
			Tenant: demoTenant, Description: "fluxhook demo: " + e.filter})
		if err != nil {
			return err
		}
		defer func() {
			_, _ = endpoints.Remove(context.WithoutCancel(ctx), pool, ep.ID, endpoints.PendingDrop)
		}()
		name := e.name
		mux.Handle("/"+name, &receiver.Receiver{
			Secrets: []string{ep.Secret},
			OnDelivery: func(d receiver.Delivery) {
				fmt.Fprintf(out, "  ↳ endpoint %-8s got %-16s delivery %s  signed with its own secret\n", name, d.Event, d.ID)
			},
			OnReject: func(r receiver.Rejection) {
				fmt.Fprintf(out, "✗ endpoint %s rejected delivery %s: %d %s\n", name, r.DeliveryID, r.Status, r.Reason)
			},
		})
		fmt.Fprintf(out, "endpoint %-8s %s receives %s, with a secret of its own\n", name, ep.ID, e.filter)
	}

	// Every fifth event names the demo's own receiver, on loopback, in its endpoint_url: the
	// demo allows rows that address alone, as an operator would with WEBHOOK_ROW_URL_NETWORKS.
	recvAddr := ln.Addr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	d, err := dispatcher.New(dispatcher.Config{
		DatabaseURL:    url,
		DefaultURL:     base + "/hook",
		Secret:         secret,
		RowURLNetworks: []netip.Prefix{netip.PrefixFrom(recvAddr, recvAddr.BitLen())},
		RetrySchedule:  []time.Duration{time.Second, 5 * time.Second},
		Logger:         newLogger(zapcore.WarnLevel, "console", zapcore.Lock(zapcore.AddSync(env.stderr)), colorFor(env.stderr, env.getenv)),
	})
	if err != nil {
		return err
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Stop(stopCtx)
	}()
	base2, key, portalLink, stopAPI, err := demoAPI(ctx, url)
	if err != nil {
		return err
	}
	defer stopAPI()
	mu.Lock()
	apiBase, apiKey = base2, key
	mu.Unlock()
	fmt.Fprintf(out, "management API at %s/v1 (docs/api.md), admin key %s\n", apiBase, apiKey)
	fmt.Fprintf(out, "portal of tenant %s, its endpoints and deliveries as they happen (docs/portal.md):\n  %s\n", demoTenant, portalLink)
	fmt.Fprintln(out, "dispatcher running; enqueueing sample events (Ctrl-C to stop)")

	// stopping is the one exit for Ctrl-C, whether it lands while an insert is in flight or
	// while the loop waits for the next tick, so the person always sees what happens next.
	stopping := func() error {
		fmt.Fprintln(out, "\nstopping: draining in-flight deliveries, removing what the demo started")
		return nil
	}
	kinds := []string{"stream.created", "stream.updated", "order.paid", "user.signed_up"}
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for n := 1; ; n++ {
		if *events == 0 || n <= *events {
			ev := outbox.Event{
				EventType: kinds[n%len(kinds)],
				StreamID:  fmt.Sprintf("demo-%d", n%3),
				Payload:   map[string]any{"n": n, "demo": true},
				Tenant:    demoTenant,
			}
			if n%5 == 0 {
				ev.EndpointURL = base + "/flaky"
			}
			mu.Lock() // held across the insert so OnDelivery cannot look before sentAt is set
			start := time.Now()
			e, err := outbox.Enqueue(ctx, pool, ev)
			if err == nil {
				sentAt[e.DeliveryID] = start
			}
			mu.Unlock()
			if err != nil {
				if ctx.Err() != nil {
					return stopping()
				}
				return fmt.Errorf("enqueue: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			return stopping()
		case <-done:
			fmt.Fprintf(out, "%d events delivered; done\n", *events)
			return nil
		case <-tick.C:
		}
	}
}

// demoTenant is the tenant of the demo's endpoints and events, whose portal link it prints.
const demoTenant = "demo"

// demoPortalTTL is how long the demo's portal link works: the longest a link may, so that it
// outlives any demo session.
const demoPortalTTL = 24 * time.Hour

// demoAPI serves the management API and the portal for the demo's database on a free loopback
// port, with an admin key and a portal link for demoTenant made for it, so that the demo shows
// both on real deliveries.
func demoAPI(ctx context.Context, dbURL string) (base, key, portalLink string, stop func(), err error) {
	pool, err := connectPool(ctx, dbURL, 4, "fluxhook-demo-api")
	if err != nil {
		return "", "", "", nil, err
	}
	_, key, err = apikeys.Add(ctx, pool, apikeys.New{Description: "fluxhook demo", CreatedBy: "cli:demo"})
	if err != nil {
		pool.Close()
		return "", "", "", nil, err
	}
	tenant := demoTenant
	_, session, err := apikeys.AddPortalSession(ctx, pool, apikeys.New{Tenant: &tenant, Description: "fluxhook demo portal",
		CreatedBy: "cli:demo"}, demoPortalTTL)
	if err != nil {
		pool.Close()
		return "", "", "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		pool.Close()
		return "", "", "", nil, err
	}
	cipher, _ := endpoints.NewCipher("", "") // the demo's endpoints keep their secrets in clear
	a := api.New(api.Config{Pool: pool, Cipher: cipher, Portal: portal.Handler(portal.Options{})})
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	base = "http://" + ln.Addr().String()
	return base, key, base + "/portal/#session=" + session, func() { _ = srv.Close(); a.Close(); pool.Close() }, nil
}

func randomSecret() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "demo-" + hex.EncodeToString(b)
}
