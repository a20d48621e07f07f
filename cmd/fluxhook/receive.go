package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/receiver"
)

func init() {
	commands["receive"] = command{summary: "Run a local consumer that verifies and prints deliveries (development)", run: runReceive}
}

// runReceive serves receiver.Receiver: every request is checked like a real consumer should
// (docs/wire-format.md) and printed. --status and --delay make it a failing or slow
// consumer, to watch retries, dead letters and the circuit breaker.
func runReceive(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("receive", env, "fluxhook receive [--addr HOST:PORT] [--secret SECRET|- | --secret-file FILE] [--previous-secret SECRET|- | --previous-secret-file FILE] [--status N] [--delay DURATION] [--quiet]")
	addr := fs.String("addr", "127.0.0.1:8089", "address to listen on")
	document(fs, "addr", flagDoc{Placeholder: "HOST:PORT", Default: "127.0.0.1:8089"})
	secret := fs.String("secret", "", "secret the signatures must match (serve's WEBHOOK_SECRET), or - to read it from standard input")
	document(fs, "secret", flagDoc{Placeholder: "SECRET", Env: "WEBHOOK_SECRET"})
	secretFile := fs.String("secret-file", "", "read the secret from this file (one line)")
	document(fs, "secret-file", flagDoc{Placeholder: "FILE", Env: "WEBHOOK_SECRET_FILE"})
	previous := fs.String("previous-secret", "", "also accept this secret, as during a rotation")
	document(fs, "previous-secret", flagDoc{Placeholder: "SECRET", Env: "WEBHOOK_SECRET_PREVIOUS"})
	previousFile := fs.String("previous-secret-file", "", "read the previous secret from this file (one line)")
	document(fs, "previous-secret-file", flagDoc{Placeholder: "FILE", Env: "WEBHOOK_SECRET_PREVIOUS_FILE"})
	status := fs.Int("status", receiver.DefaultStatus, "answer verified requests with this HTTP status (500 or 503 to watch retries, 410 for dead letters)")
	delay := fs.Duration("delay", 0, "wait this long before answering a verified request (a slow consumer)")
	quiet := fs.Bool("quiet", false, "print only rejected requests, not each delivery")
	if err := noArguments(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *secret == "-" && *previous == "-" {
		return usageError("--secret - and --previous-secret - both read standard input: give one of them with a file (--secret-file, --previous-secret-file)")
	}
	for _, s := range []struct {
		value      *string
		name, file string
		variable   string
	}{{secret, "secret", *secretFile, "WEBHOOK_SECRET"}, {previous, "previous-secret", *previousFile, "WEBHOOK_SECRET_PREVIOUS"}} {
		v, err := secretArg(env, s.name, *s.value, s.file)
		if err != nil {
			return err
		}
		if v == "" {
			if v, err = secretEnv(env, s.variable); err != nil {
				return usageError("%v", err)
			}
		}
		*s.value = v
	}
	// Trimmed like serve trims its settings, so both sides use the same key.
	*secret, *previous = strings.TrimSpace(*secret), strings.TrimSpace(*previous)
	switch {
	case *secret == "":
		return usageError("no secret: set --secret or WEBHOOK_SECRET to the dispatcher's WEBHOOK_SECRET")
	case *status < 200 || *status > 599:
		return usageError("--status %d: want an HTTP status from 200 to 599", *status)
	case *delay < 0:
		return usageError("--delay %v is negative", *delay)
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	p := &deliveryPrinter{w: env.stdout, quiet: *quiet}
	rc := &receiver.Receiver{
		Secrets:    []string{*secret, *previous},
		Status:     *status,
		Delay:      *delay,
		OnDelivery: p.delivery,
		OnReject:   p.reject,
	}
	srv := &http.Server{
		Handler:           rc,
		ReadHeaderTimeout: 10 * time.Second,
		// Requests share the command's context: Ctrl-C ends a --delay wait at once.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	secrets := "the current secret"
	if *previous != "" {
		secrets += " or the previous one"
	}
	fmt.Fprintf(env.stdout, "receiving on http://%s/ (any path): verifying with %s, answering %d", ln.Addr(), secrets, *status)
	if *delay > 0 {
		fmt.Fprintf(env.stdout, " after %v", *delay)
	}
	fmt.Fprintln(env.stdout, "; Ctrl-C stops")

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// Let answers in progress finish; their --delay waits have already ended.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// deliveryPrinter writes one block per request; requests arrive concurrently.
type deliveryPrinter struct {
	mu    sync.Mutex
	w     io.Writer
	quiet bool
}

func (p *deliveryPrinter) delivery(d receiver.Delivery) {
	if p.quiet {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %d  %s  %s", d.ReceivedAt.Format("15:04:05.000"), d.Status, printable(d.ID), printable(d.Event))
	if d.Attempt > 0 {
		fmt.Fprintf(&b, "  attempt %d", d.Attempt)
	}
	if d.Secret > 0 {
		b.WriteString("  (previous secret)")
	}
	if field, age, ok := payloadAge(d.Body, d.ReceivedAt); ok {
		fmt.Fprintf(&b, "  %v after %s", age, field)
	}
	fmt.Fprintf(&b, "  %d bytes", len(d.Body))
	if d.Abandoned {
		b.WriteString("  (client gone before the answer)")
	}
	b.WriteString("\n")
	b.WriteString(prettyBody(d.Body))
	p.write(b.String())
}

func (p *deliveryPrinter) reject(r receiver.Rejection) {
	id := r.DeliveryID
	if id == "" {
		id = "-"
	}
	p.write(fmt.Sprintf("%s  %d  %s  rejected: %s\n", r.ReceivedAt.Format("15:04:05.000"), r.Status, printable(id), printable(r.Reason)))
}

func (p *deliveryPrinter) write(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _ = io.WriteString(p.w, s)
}

// prettyBody indents a JSON body under the header line; other bodies are shown escaped. Long
// bodies are cut.
func prettyBody(body []byte) string {
	const limit = 2 << 10
	var out bytes.Buffer
	if len(body) <= limit && json.Valid(body) {
		if err := json.Indent(&out, body, "    ", "  "); err == nil {
			return "    " + out.String() + "\n"
		}
	}
	shown := body
	if len(shown) > limit {
		shown = shown[:limit]
	}
	s := "    " + printable(string(shown))
	if len(shown) < len(body) {
		s += fmt.Sprintf(" … (%d more bytes)", len(body)-len(shown))
	}
	return s + "\n"
}

// ageFields are the top-level payload fields that may say when the event happened, in the
// order they are tried. Payloads are the application's own, so this is a guess, and the
// printout names the field it used.
var ageFields = []string{"enqueued_at", "created_at", "sent_at", "occurred_at", "timestamp", "time", "ts"}

// payloadAge is how long before arrival the payload's time field says the event happened, when
// the payload has one: an RFC 3339 string or Unix seconds, milliseconds or nanoseconds.
func payloadAge(body []byte, arrived time.Time) (string, time.Duration, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return "", 0, false
	}
	for _, name := range ageFields {
		raw, ok := fields[name]
		if !ok {
			continue
		}
		at, ok := parseEventTime(raw)
		if !ok {
			continue
		}
		age := arrived.Sub(at)
		if age < -time.Minute || age > 24*time.Hour {
			continue // not the event's time, or clocks too far apart to be useful
		}
		return name, age.Round(10 * time.Microsecond), true
	}
	return "", 0, false
}

func parseEventTime(raw json.RawMessage) (time.Time, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		t, err := time.Parse(time.RFC3339Nano, s)
		return t, err == nil
	}
	var n float64
	if json.Unmarshal(raw, &n) != nil || n <= 0 || n >= math.MaxInt64 {
		return time.Time{}, false
	}
	switch {
	case n < 1e11: // seconds
		sec, frac := math.Modf(n)
		return time.Unix(int64(sec), int64(frac*1e9)), true
	case n < 1e14: // milliseconds
		return time.UnixMicro(int64(n * 1e3)), true
	case n < 1e17: // microseconds
		return time.UnixMicro(int64(n)), true
	default: // nanoseconds
		return time.Unix(0, int64(n)), true
	}
}
