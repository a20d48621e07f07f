package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

func TestEnqueueCommandWritesOneEvent(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)

	r := runCLI(t, db.URL, "enqueue", "--event-type", "order.created", "--payload", `{"order": 7}`,
		"--stream-id", "orders", "--endpoint-url", "https://consumer.example/hook", "--delay", "90s")
	if r.code != 0 {
		t.Fatalf("enqueue exited %d: %s", r.code, r.stderr)
	}
	var id int64
	var deliveryID string
	if _, err := fmt.Sscanf(r.stdout, "id=%d delivery_id=%s\n", &id, &deliveryID); err != nil {
		t.Fatalf("enqueue printed %q: %v", r.stdout, err)
	}

	var (
		gotDelivery, eventType, payload, streamID, endpoint string
		attempt                                             int
		dueIn                                               float64
	)
	err := db.Pool.QueryRow(context.Background(), `
		SELECT delivery_id::text, event_type, payload::text, stream_id, endpoint_url, attempt,
		       extract(epoch FROM created_at - now())::float8
		FROM webhook_deliveries WHERE id = $1`, id).
		Scan(&gotDelivery, &eventType, &payload, &streamID, &endpoint, &attempt, &dueIn)
	if err != nil {
		t.Fatalf("reading row %d: %v", id, err)
	}
	if gotDelivery != deliveryID || eventType != "order.created" || payload != `{"order": 7}` ||
		streamID != "orders" || endpoint != "https://consumer.example/hook" || attempt != 1 {
		t.Errorf("row = %s %s %s %s %s attempt %d", gotDelivery, eventType, payload, streamID, endpoint, attempt)
	}
	if dueIn < 80 || dueIn > 90 {
		t.Errorf("--delay 90s made the row due in %.1fs", dueIn)
	}
}

func TestEnqueueCommandDefaults(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)

	if r := runCLI(t, db.URL, "enqueue", "--event-type", "ping"); r.code != 0 {
		t.Fatalf("enqueue exited %d: %s", r.code, r.stderr)
	}
	n := count(t, db, `SELECT count(*) FROM webhook_deliveries
		WHERE event_type = 'ping' AND payload = '{}' AND stream_id IS NULL AND endpoint_url IS NULL
		  AND created_at <= now() AND attempt = 1 AND NOT processed`)
	if n != 1 {
		t.Fatalf("found %d default rows, want 1 (payload {}, no stream, configured endpoint, due now)", n)
	}
}

// TestEnqueueCommandRejectsBadFlagsWithoutWriting: every refusal names the flag to fix and the
// problem in the command's words, exits 2, and writes nothing.
func TestEnqueueCommandRejectsBadFlagsWithoutWriting(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)

	cases := []struct {
		args []string
		want string
	}{
		{[]string{"enqueue"}, "--event-type is required"},
		{[]string{"enqueue", "--event-type", "t", "--payload", `{"a":`}, "not valid JSON"},
		{[]string{"enqueue", "--event-type", "t", "--delay", "-1s"}, "negative"},
		{[]string{"enqueue", "--event-type", "t", "extra"}, `unexpected argument "extra"`},
		{[]string{"enqueue", "--event-type", "a\tb"}, `--event-type "a\tb" contains a control character`},
		{[]string{"enqueue", "--event-type", "t", "--payload", `{"a": "\u0000"}`}, `--payload contains \u0000`},
		{[]string{"enqueue", "--event-type", "t", "--endpoint-url", "ftp://consumer.example/"}, `--endpoint-url: scheme "ftp" is not supported`},
		{[]string{"enqueue", "--nope"}, "unknown flag --nope"},
		{[]string{"enqueue", "--event-typ", "t"}, "unknown flag --event-typ; did you mean --event-type?"},
	}
	for _, tc := range cases {
		r := runCLI(t, db.URL, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 mentioning %q", tc.args, r.code, r.stderr, tc.want)
		}
		// One sentence in the command's words: the flag, not the Go field or the packages the
		// error passed through.
		for _, internal := range []string{"outbox:", "invalid event", "EventType", "EndpointURL", "Payload", "invalid endpoint URL", "endpoint refused"} {
			if strings.Contains(r.stderr, internal) {
				t.Errorf("%q: stderr %q shows %q", tc.args, r.stderr, internal)
			}
		}
	}
	if n := count(t, db, "SELECT count(*) FROM webhook_deliveries"); n != 0 {
		t.Fatalf("rejected commands wrote %d rows", n)
	}
}

func TestEnqueueCommandNeedsADatabase(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "", "enqueue", "--event-type", "t")
	if r.code != 2 || !strings.Contains(r.stderr, "DATABASE_URL") {
		t.Fatalf("without DATABASE_URL: exit %d, stderr %q; want 2 (configuration) naming DATABASE_URL", r.code, r.stderr)
	}
	unmigrated := sqltest.New(t)
	r = runCLI(t, unmigrated.URL, "enqueue", "--event-type", "t")
	if r.code != 1 || !strings.Contains(r.stderr, "fluxhook migrate") {
		t.Fatalf("on an unmigrated database: exit %d, stderr %q; want 1 with the migrate hint", r.code, r.stderr)
	}
}

// TestURLsTheDispatcherCannotReachAreRefusedAtTheDoor: a URL the dispatcher could never call
// (no scheme, credentials) or never reach by its address (a private IP for an endpoint, a
// loopback IP for a row's endpoint_url) is refused when it is stored, naming what is wrong
// and the setting that would allow it, instead of being accepted and dead-lettered at every
// delivery; with the setting, it is stored.
func TestURLsTheDispatcherCannotReachAreRefusedAtTheDoor(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"enqueue", "--event-type", "t.x", "--endpoint-url", "notaurl"}, "--endpoint-url: it has no scheme"},
		{[]string{"enqueue", "--event-type", "t.x", "--endpoint-url", "https://user:pw@consumer.example/hook"}, "user name or password"},
		{[]string{"enqueue", "--event-type", "t.x", "--endpoint-url", "http://127.0.0.1:9/admin"}, "WEBHOOK_ROW_URL_NETWORKS"},
		{[]string{"endpoints", "add", "--url", "https://10.0.0.5/hooks", "--secret", serveSecret}, "WEBHOOK_ALLOWED_NETWORKS"},
		{[]string{"endpoints", "add", "--url", "https://169.254.169.254/latest", "--secret", serveSecret}, "169.254.169.254"},
	} {
		r := runCLI(t, db.URL, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message naming %s", c.args, r.code, r.stderr, c.want)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox`) + count(t, db, `SELECT count(*) FROM webhook_endpoints`); n != 0 {
		t.Errorf("%d rows stored for refused URLs", n)
	}
	// With the setting that allows it, the same private endpoint is stored.
	r := runCLIEnv(t, map[string]string{"DATABASE_URL": db.URL, "WEBHOOK_ALLOWED_NETWORKS": "10.0.0.0/8"},
		"endpoints", "add", "--url", "https://10.0.0.5/hooks", "--secret", serveSecret)
	if r.code != 0 {
		t.Errorf("endpoints add of a private address allowed by WEBHOOK_ALLOWED_NETWORKS: exit %d, %s", r.code, r.stderr)
	}
}

// TestInvalidEventMessageNamesTheFlag: whatever outbox.Enqueue refuses of an event the command
// built reads as the flag that set the field and the problem, without the package's prefixes.
func TestInvalidEventMessageNamesTheFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ev   outbox.Event
		want string
	}{
		{outbox.Event{EventType: "a\x01b", Payload: json.RawMessage(`{}`)}, `--event-type "a\x01b" contains a control character`},
		{outbox.Event{EventType: "t", Payload: json.RawMessage(`{}`), StreamID: "a\x00"}, "--stream-id contains a NUL byte"},
		{outbox.Event{EventType: "t", Payload: json.RawMessage(`{}`), EndpointURL: "notaurl"}, "--endpoint-url it has no scheme"},
		{outbox.Event{EventType: "t", Payload: json.RawMessage(`["\u0000"]`)}, `--payload contains \u0000`},
		{outbox.Event{EventType: "t", Payload: json.RawMessage(`{}`), Delay: -time.Second}, "--delay -1s is negative"},
	} {
		_, err := outbox.Enqueue(context.Background(), nil, tc.ev) // refused before the querier is used
		if !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Fatalf("%+v: %v, want an invalid event", tc.ev, err)
		}
		if got := invalidEventMessage(err); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%+v: %q, want it to start with %q", tc.ev, got, tc.want)
		}
	}
}
