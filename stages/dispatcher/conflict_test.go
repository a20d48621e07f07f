package dispatcher_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/dispatcher"
	"github.com/fluxora/fluxhook/stages/sign"
)

// originalReceiver answers as the original's receiver does for a delivery id it has already
// accepted: 409 Conflict. It stores each id on arrival, before answering, and hangs the first
// attempt of each past the dispatcher's timeout: the retry of a first attempt that timed out
// after the consumer stored it, the case 409-as-delivered exists for.
func originalReceiver(idOf func(arrival) string) func(arrival, http.ResponseWriter) {
	var mu sync.Mutex
	accepted := map[string]bool{}
	return func(a arrival, w http.ResponseWriter) {
		id := idOf(a)
		mu.Lock()
		seen := accepted[id]
		accepted[id] = true
		mu.Unlock()
		if seen {
			w.WriteHeader(http.StatusConflict)
			_, _ = fmt.Fprintf(w, "delivery %s already accepted", id)
			return
		}
		<-a.Ctx.Done() // stored, but the answer never reaches the dispatcher
	}
}

func fluxoraID(a arrival) string  { return a.DeliveryID }
func standardID(a arrival) string { return a.Header.Get("webhook-id") }

// conflictConfig is the test config with a timeout short enough for the first attempt to time
// out quickly, and generous enough (with -race, on a loaded machine) for the 409 to arrive.
func conflictConfig(b *bundle, url string) (cfg dispatcher.Config) {
	cfg = b.config(url)
	cfg.Timeout = 500 * time.Millisecond
	cfg.RetrySchedule = []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}
	return cfg
}

// outboxRow is one attempt's settled row.
type outboxRow struct {
	attempt   int
	processed bool
	status    int
	err       string
}

func (b *bundle) attempts(deliveryID string) []outboxRow {
	b.t.Helper()
	rows, err := b.pool.Query(context.Background(),
		`SELECT attempt, processed, coalesce(status_code, 0), coalesce(error, '') FROM webhook_deliveries
		 WHERE delivery_id = $1 ORDER BY attempt`, deliveryID)
	if err != nil {
		b.t.Fatal(err)
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.attempt, &r.processed, &r.status, &r.err); err != nil {
			b.t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		b.t.Fatal(err)
	}
	return out
}

// TestConflict409OnRetryIsSettledDelivered: under the fluxora scheme, by default, the retry's
// 409 settles the event delivered with status 409 (the consumer has it), with no dead letter
// and no further attempt.
func TestConflict409OnRetryIsSettledDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, originalReceiver(fluxoraID))
	d := b.start(conflictConfig(b, c.URL()))
	id := b.enqueue(outbox.Event{})
	b.waitSettled(20 * time.Second)

	rows := b.attempts(id)
	if len(rows) != 2 {
		t.Fatalf("attempt rows %+v, want two: the timed-out first attempt and the retry answered 409", rows)
	}
	if r := rows[0]; !r.processed || r.status != 0 || !strings.Contains(r.err, "timeout") {
		t.Errorf("first attempt %+v, want processed as a timeout", r)
	}
	if r := rows[1]; r.attempt != 2 || !r.processed || r.status != http.StatusConflict || r.err != "" {
		t.Errorf("retry %+v, want attempt 2 processed with status 409 and no error (delivered)", r)
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, id); n != 0 {
		_, _, reason := b.deadLetter(id)
		t.Errorf("the event was dead-lettered (%q) although the consumer has it", reason)
	}
	if n := len(c.byDelivery()[id]); n != 2 {
		t.Errorf("the consumer got %d requests, want 2", n)
	}
	if s := d.Stats(); s.Delivered.Load() != 1 || s.DeadLettered.Load() != 0 {
		t.Errorf("stats: delivered %d, dead-lettered %d; want 1 and 0", s.Delivered.Load(), s.DeadLettered.Load())
	}
}

// TestConflict409SettingOffIsDeadLettered: with Conflict409Delivered false (a consumer that
// uses 409 for something else) and 409 among the permanent statuses, the 409 is a permanent
// failure, dead-lettered at once (not delivered, as the fluxora scheme would by default).
//
// It needs dispatcher.New to pass Config.Conflict409Delivered on to send.Config; without that
// the send stage follows the scheme and delivers.
func TestConflict409SettingOffIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, originalReceiver(fluxoraID))
	cfg := conflictConfig(b, c.URL())
	cfg.Conflict409Delivered = new(false)
	cfg.PermanentStatuses = []int{http.StatusConflict} // as WEBHOOK_PERMANENT_STATUSES=409: not retried
	b.start(cfg)
	id := b.enqueue(outbox.Event{})
	b.waitSettled(20 * time.Second)

	if n := b.count(`SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, id); n != 1 {
		t.Fatalf("not dead-lettered with the setting off (attempt rows %+v): does dispatcher.New pass "+
			"Config.Conflict409Delivered on to send.Config?", b.attempts(id))
	}
	status, attempts, reason := b.deadLetter(id)
	if status != http.StatusConflict || attempts != 2 || reason != "permanent failure: HTTP 409 Conflict" {
		t.Errorf("dead letter: status %d, attempts %d, reason %q; want 409, 2, %q",
			status, attempts, reason, "permanent failure: HTTP 409 Conflict")
	}
}

// TestConflict409UnderStandardSchemeIsDeadLettered: the Standard Webhooks scheme gives 409 no
// "already delivered" meaning: with 409 among the permanent statuses it is dead-lettered (by
// default it is retried like any other answer).
func TestConflict409UnderStandardSchemeIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, originalReceiver(standardID))
	cfg := conflictConfig(b, c.URL())
	cfg.Scheme = sign.Standard
	cfg.Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cfg.PermanentStatuses = []int{http.StatusConflict} // as WEBHOOK_PERMANENT_STATUSES=409: not retried
	b.start(cfg)
	id := b.enqueue(outbox.Event{})
	b.waitSettled(20 * time.Second)

	status, attempts, reason := b.deadLetter(id)
	if status != http.StatusConflict || attempts != 2 || reason != "permanent failure: HTTP 409 Conflict" {
		t.Errorf("dead letter: status %d, attempts %d, reason %q; want 409, 2, %q",
			status, attempts, reason, "permanent failure: HTTP 409 Conflict")
	}
}

// TestPayloadTooLargeIsDeadLetteredWithTheSize: a consumer with the original's 256 KiB limit
// refuses a 300 kB event that WEBHOOK_MAX_PAYLOAD_BYTES (1 MiB) let through; the dead letter
// names the body size, the original's limit and the setting, once, without retrying.
func TestPayloadTooLargeIsDeadLetteredWithTheSize(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		if len(a.Body) > 256<<10 {
			http.Error(w, "verify: body larger than the limit", http.StatusRequestEntityTooLarge)
		}
	})
	b.start(b.config(c.URL()))
	id := b.enqueue(outbox.Event{Payload: map[string]any{"blob": strings.Repeat("x", 300000)}})
	b.waitSettled(20 * time.Second)

	got := c.byDelivery()[id]
	if len(got) != 1 {
		t.Fatalf("the consumer got %d requests, want 1 (413 is not retried)", len(got))
	}
	size := len(got[0].Body)
	status, attempts, reason := b.deadLetter(id)
	want := fmt.Sprintf("permanent failure: HTTP 413 Request Entity Too Large: the consumer refused a %d-byte body; "+
		"the original's receiver accepts at most 262144 bytes; lower WEBHOOK_MAX_PAYLOAD_BYTES to 262144 "+
		"to dead-letter such events before sending, or raise the consumer's limit", size)
	if status != http.StatusRequestEntityTooLarge || attempts != 1 || reason != want {
		t.Errorf("dead letter: status %d, attempts %d, reason\n%s\nwant 413, 1,\n%s", status, attempts, reason, want)
	}
	var lastError string
	if err := b.pool.QueryRow(context.Background(),
		`SELECT coalesce(last_error, '') FROM webhook_dead_letter WHERE delivery_id = $1`, id).Scan(&lastError); err != nil {
		t.Fatal(err)
	}
	if lastError != "HTTP 413 Request Entity Too Large" {
		t.Errorf("last_error %q, want the status", lastError)
	}
}
