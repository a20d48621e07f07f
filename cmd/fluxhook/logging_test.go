package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/dispatcher"
)

// logLines returns the lines written to logs.
func logLines(logs *syncBuffer) []string {
	return strings.Split(strings.TrimRight(logs.String(), "\n"), "\n")
}

// countMsgs counts the JSON log lines by message.
func countMsgs(t *testing.T, lines []string) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, line := range lines {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("log line is not JSON (%v): %s", err, line)
		}
		msg, _ := entry["msg"].(string)
		n[msg]++
	}
	return n
}

// TestLogLevelsAndLinesPerFailure runs a dispatcher with serve's logger at info and at debug
// through three successes and one event that fails every attempt (three attempts), and counts
// the lines: a failed-attempt line per retried attempt and a dead-letter line, at both levels;
// a line per success only at debug.
func TestLogLevelsAndLinesPerFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		level         zapcore.Level
		wantDelivered int
	}{
		{zapcore.InfoLevel, 0},
		{zapcore.DebugLevel, 3},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			t.Parallel()
			db := sqltest.NewMigrated(t)
			c := newHookConsumer(t, func(_ context.Context, req *hookRequest) int {
				if req.Event == "test.fail" {
					return http.StatusInternalServerError
				}
				return http.StatusOK
			})
			var logs syncBuffer
			log := newLogger(tc.level, "json", zapcore.AddSync(&logs), false)
			d, err := dispatcher.New(dispatcher.Config{
				DatabaseURL:   db.URL,
				DefaultURL:    c.URL(),
				Secret:        serveSecret,
				Timeout:       15 * time.Second,
				RetrySchedule: []time.Duration{100 * time.Millisecond, 100 * time.Millisecond},
				RetryJitter:   -1,
				Logger:        log,
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = d.Stop(ctx)
			})
			for range 3 {
				enqueueOne(t, db, outbox.Event{EventType: "test.ok"})
			}
			enqueueOne(t, db, outbox.Event{EventType: "test.fail"})
			pollUntil(t, 20*time.Second, "every row settled and the failing one dead-lettered", func() bool {
				return unprocessed(t, db) == 0 && queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter`) == 1
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := d.Stop(ctx); err != nil {
				t.Fatal(err)
			}

			n := countMsgs(t, logLines(&logs))
			if n["delivery attempt failed"] != 2 || n["delivery dead-lettered"] != 1 {
				t.Errorf("%d failed-attempt and %d dead-letter lines, want 2 and 1 (three attempts)",
					n["delivery attempt failed"], n["delivery dead-lettered"])
			}
			if n["delivered"] != tc.wantDelivered {
				t.Errorf("%d \"delivered\" lines at %s, want %d", n["delivered"], tc.level, tc.wantDelivered)
			}
			if n["dispatcher started"] != 1 {
				t.Errorf("no \"dispatcher started\" line at %s", tc.level)
			}
		})
	}
}

// TestLogFormatConsole checks that LOG_FORMAT=console writes lines for a person: not JSON,
// with the level, the message and the fields.
func TestLogFormatConsole(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	log := newLogger(zapcore.InfoLevel, "console", zapcore.AddSync(&logs), false)
	log.Info("delivery attempt failed", zap.String("delivery_id", "d-1"), zap.Int("status", 503))
	log.Debug("delivered", zap.String("delivery_id", "d-2"))
	lines := logLines(&logs)
	if len(lines) != 1 {
		t.Fatalf("%d lines, want the info line only: %q", len(lines), lines)
	}
	line := lines[0]
	if json.Valid([]byte(line)) {
		t.Errorf("console line is JSON: %s", line)
	}
	for _, want := range []string{"INFO", "delivery attempt failed", `"delivery_id": "d-1"`, `"status": 503`} {
		if !strings.Contains(line, want) {
			t.Errorf("console line lacks %q: %s", want, line)
		}
	}
	// Not to a terminal: no escape codes in a file or a collector's capture.
	if strings.Contains(line, "\x1b[") {
		t.Errorf("console line written to a buffer is coloured: %q", line)
	}
	var coloured syncBuffer
	newLogger(zapcore.InfoLevel, "console", zapcore.AddSync(&coloured), true).Info("started")
	if !strings.Contains(coloured.String(), "\x1b[") {
		t.Errorf("console line with colour has no escape code: %q", coloured.String())
	}
}

// TestColorOnlyOnATerminal: colour is for a person at a terminal; a pipe, a file or NO_COLOR
// gets plain levels.
func TestColorOnlyOnATerminal(t *testing.T) {
	t.Parallel()
	none := func(string) string { return "" }
	if colorFor(&bytes.Buffer{}, none) {
		t.Error("colour for a buffer")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if colorFor(w, none) {
		t.Error("colour for a pipe")
	}
	file, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if colorFor(file, none) {
		t.Error("colour for a file")
	}
	// /dev/null is a character device, like a terminal: the test for one, and NO_COLOR wins.
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if !colorFor(null, none) {
		t.Error("no colour for a character device")
	}
	if colorFor(null, func(k string) string { return map[string]string{"NO_COLOR": "1"}[k] }) {
		t.Error("colour despite NO_COLOR")
	}
}

// TestLogSamplingOfRepeatedLines checks the sampling that keeps a failing endpoint from
// flooding the log stack: of lines with one message, the first 100 in a second are written,
// then every 10th; another message is counted on its own.
func TestLogSamplingOfRepeatedLines(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	log := newLogger(zapcore.InfoLevel, "json", zapcore.AddSync(&logs), false)
	start := time.Now()
	for i := range 300 {
		log.Warn("delivery attempt failed", zap.Int("n", i))
	}
	log.Error("delivery dead-lettered")
	elapsed := time.Since(start)
	n := countMsgs(t, logLines(&logs))
	if n["delivery dead-lettered"] != 1 {
		t.Errorf("%d dead-letter lines, want 1: sampling of one message must not drop another", n["delivery dead-lettered"])
	}
	got := n["delivery attempt failed"]
	if got < 100 || got >= 300 {
		t.Fatalf("%d of 300 identical lines written, want the first 100 and then a sample", got)
	}
	// Within one second: 100, then lines 110, 120, ..., 300. A loaded machine may take
	// longer, and a new second starts the count again; the bounds above still hold.
	if elapsed < time.Second && got != 120 {
		t.Errorf("%d of 300 identical lines written within %s, want 120 (100, then every 10th)", got, elapsed)
	}
}

// hex64 matches a SHA-256 in hex: the endpoint hash, a key for Redis that names no consumer
// a person can recognise.
var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// TestDeliveryLinesNameTheManagedEndpoint runs a dispatcher with serve's logger against a
// managed endpoint that always fails, and reads its lines as an operator would: each failed
// attempt and the dead letter name the endpoint by its id and its URL's origin (never the path
// or query, where tokens live), the retry wait has its unit in its name, and the URL's hash
// appears only at debug.
func TestDeliveryLinesNameTheManagedEndpoint(t *testing.T) {
	t.Parallel()
	for _, level := range []zapcore.Level{zapcore.InfoLevel, zapcore.DebugLevel} {
		t.Run(level.String(), func(t *testing.T) {
			t.Parallel()
			db := sqltest.NewMigrated(t)
			c := newHookConsumer(t, func(context.Context, *hookRequest) int { return http.StatusInternalServerError })
			var id string
			if err := db.Pool.QueryRow(context.Background(), `INSERT INTO webhook_endpoints (url, secret)
				VALUES ($1, 'whsec_logging') RETURNING id::text`, c.URL()+"/secret-path?token=secret-query").Scan(&id); err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			d, err := dispatcher.New(dispatcher.Config{
				DatabaseURL:   db.URL,
				Secret:        serveSecret,
				Timeout:       15 * time.Second,
				RetrySchedule: []time.Duration{100 * time.Millisecond},
				RetryJitter:   -1,
				Logger:        newLogger(level, "json", zapcore.AddSync(&logs), false),
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = d.Stop(ctx)
			})
			enqueueOne(t, db, outbox.Event{EventType: "order.paid"})
			pollUntil(t, 20*time.Second, "the event dead-lettered", func() bool {
				return queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter`) == 1
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := d.Stop(ctx); err != nil {
				t.Fatal(err)
			}

			origin := strings.TrimSuffix(c.URL(), "/hook")
			seen := map[string]int{}
			for _, line := range logLines(&logs) {
				if strings.Contains(line, "secret-") {
					t.Errorf("a line carries the URL's path or query: %s", line)
				}
				var entry map[string]any
				if err := json.Unmarshal([]byte(line), &entry); err != nil {
					t.Fatalf("log line is not JSON (%v): %s", err, line)
				}
				msg, _ := entry["msg"].(string)
				if msg != "delivery attempt failed" && msg != "delivery dead-lettered" {
					continue
				}
				seen[msg]++
				if entry["endpoint_id"] != id || entry["origin"] != origin {
					t.Errorf("%q: endpoint_id %v and origin %v, want %s and %s: %s", msg, entry["endpoint_id"], entry["origin"], id, origin, line)
				}
				hashes := 0
				for k, v := range entry {
					if s, ok := v.(string); ok && hex64.MatchString(s) {
						hashes++
						if k != "endpoint_hash" {
							t.Errorf("%q: field %s holds a hash: %s", msg, k, line)
						}
					}
				}
				if want := map[zapcore.Level]int{zapcore.InfoLevel: 0, zapcore.DebugLevel: 1}[level]; hashes != want {
					t.Errorf("%q at %s: %d hashes, want %d (the endpoint hash only at debug): %s", msg, level, hashes, want, line)
				}
				if msg == "delivery attempt failed" {
					if _, ok := entry["retry_in"]; ok {
						t.Errorf("retry_in without a unit: %s", line)
					}
					if entry["retry_in_ms"] != float64(100) {
						t.Errorf("retry_in_ms = %#v, want 100: %s", entry["retry_in_ms"], line)
					}
				}
			}
			if seen["delivery attempt failed"] != 1 || seen["delivery dead-lettered"] != 1 {
				t.Errorf("lines %v, want one failed attempt and one dead letter", seen)
			}
		})
	}
}

// TestStartupLineNamesWebhookURLByOrigin: the start-up line names WEBHOOK_URL by its origin,
// which an operator recognises, never by the path, query or credentials, nor by a hash.
func TestStartupLineNamesWebhookURLByOrigin(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	log := newLogger(zapcore.InfoLevel, "json", zapcore.AddSync(&logs), false)
	log.Info("starting fluxhook", effectiveConfig(map[string]string{
		"WEBHOOK_URL": "https://shop:secret-pass@hooks.example.com:8443/secret-path?token=secret-query",
	})...)
	line := logs.String()
	var entry map[string]any
	if err := json.Unmarshal([]byte(line), &entry); err != nil {
		t.Fatal(err)
	}
	if entry["webhook_url_origin"] != "https://hooks.example.com:8443" {
		t.Errorf("webhook_url_origin = %#v, want https://hooks.example.com:8443: %s", entry["webhook_url_origin"], line)
	}
	for k, v := range entry {
		if s, _ := v.(string); hex64.MatchString(s) || strings.Contains(s, "secret-") {
			t.Errorf("field %s = %q: a hash or a part of the URL beyond its origin", k, s)
		}
	}
}
