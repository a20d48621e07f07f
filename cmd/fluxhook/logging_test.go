package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
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
