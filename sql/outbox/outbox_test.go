package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// outboxRow is what a test reads back to check what Enqueue wrote.
type outboxRow struct {
	ID          int64
	DeliveryID  string
	EventType   string
	Payload     string
	StreamID    *string
	EndpointURL *string
	Attempt     int
	Processed   bool
	DueInMs     float64 // created_at - now(), in milliseconds
	EnqueuedAt  time.Time
	LeaseUntil  *time.Time
}

func readRows(t *testing.T, db *sqltest.DB) []outboxRow {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		SELECT id, delivery_id::text, event_type, payload::text, stream_id, endpoint_url, attempt,
		       processed, extract(epoch FROM created_at - now()) * 1000, enqueued_at, lease_until
		FROM webhook_deliveries ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxRow, error) {
		var o outboxRow
		err := r.Scan(&o.ID, &o.DeliveryID, &o.EventType, &o.Payload, &o.StreamID, &o.EndpointURL,
			&o.Attempt, &o.Processed, &o.DueInMs, &o.EnqueuedAt, &o.LeaseUntil)
		return o, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestEnqueueRollsBackWithTheCallersTransaction(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := outbox.Enqueue(ctx, tx, outbox.Event{EventType: "order.created", Payload: map[string]int{"order": 1}})
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	if got.ID == 0 || got.DeliveryID == "" {
		t.Fatalf("Enqueue returned %+v, want an id and a delivery id", got)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if rows := readRows(t, db); len(rows) != 0 {
		t.Fatalf("after rollback the outbox holds %+v, want nothing", rows)
	}
}

func TestEnqueueCommitsWithTheCallersTransaction(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()

	var got outbox.Enqueued
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		got, err = outbox.Enqueue(ctx, tx, outbox.Event{
			EventType: "order.created",
			Payload:   json.RawMessage(`{"order": 1, "items": [1, 2]}`),
		})
		return err
	})
	if err != nil {
		t.Fatalf("transaction: %v", err)
	}
	rows := readRows(t, db)
	if len(rows) != 1 {
		t.Fatalf("outbox holds %d rows, want 1", len(rows))
	}
	r := rows[0]
	if r.ID != got.ID || r.DeliveryID != got.DeliveryID {
		t.Errorf("row id/delivery_id = %d/%s, Enqueue returned %d/%s", r.ID, r.DeliveryID, got.ID, got.DeliveryID)
	}
	if r.Attempt != 1 || r.Processed || r.LeaseUntil != nil {
		t.Errorf("row attempt=%d processed=%v lease_until=%v, want a fresh unleased first attempt", r.Attempt, r.Processed, r.LeaseUntil)
	}
	if r.StreamID != nil || r.EndpointURL != nil {
		t.Errorf("stream_id=%v endpoint_url=%v, want NULL for empty fields", r.StreamID, r.EndpointURL)
	}
	if r.EventType != "order.created" || r.Payload != `{"items": [1, 2], "order": 1}` {
		t.Errorf("row event_type=%q payload=%s", r.EventType, r.Payload)
	}
	if r.DueInMs > 0 {
		t.Errorf("created_at is %.1f ms in the future, want due now", r.DueInMs)
	}
	if time.Since(r.EnqueuedAt) > time.Minute || r.EnqueuedAt.IsZero() {
		t.Errorf("enqueued_at = %v, want about now", r.EnqueuedAt)
	}
}

func TestEnqueueOptionalFields(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()

	_, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{
		EventType:   "stream.updated",
		Payload:     []byte(`{"event":"stream.updated"}`),
		StreamID:    "stream-7",
		EndpointURL: "https://consumer.example/hook",
		Delay:       time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(48 * time.Hour).Truncate(time.Microsecond)
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{EventType: "later", Payload: "a string", DueAt: due}); err != nil {
		t.Fatal(err)
	}
	rows := readRows(t, db)
	if len(rows) != 2 {
		t.Fatalf("outbox holds %d rows, want 2", len(rows))
	}
	r := rows[0]
	if r.StreamID == nil || *r.StreamID != "stream-7" || r.EndpointURL == nil || *r.EndpointURL != "https://consumer.example/hook" {
		t.Errorf("stream_id=%v endpoint_url=%v", r.StreamID, r.EndpointURL)
	}
	if r.DueInMs < 59*60*1000 || r.DueInMs > 60*60*1000 {
		t.Errorf("Delay 1h gave created_at %.0f ms from now", r.DueInMs)
	}
	if r.Payload != `{"event": "stream.updated"}` {
		t.Errorf("payload = %s", r.Payload)
	}
	if rows[1].Payload != `"a string"` {
		t.Errorf("a string payload is stored as %s, want a JSON string", rows[1].Payload)
	}
	var createdAt time.Time
	if err := db.Pool.QueryRow(ctx, "SELECT created_at FROM webhook_deliveries WHERE id = $1", rows[1].ID).Scan(&createdAt); err != nil {
		t.Fatal(err)
	}
	if !createdAt.Equal(due) {
		t.Errorf("DueAt %v stored as created_at %v", due, createdAt)
	}
	if rows[0].DeliveryID == rows[1].DeliveryID {
		t.Errorf("two events share delivery id %s", rows[0].DeliveryID)
	}
}

func TestEnqueueRejectsInvalidEventsBeforeTouchingTheDatabase(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()

	cases := []struct {
		name string
		ev   outbox.Event
		want string
	}{
		{"empty event type", outbox.Event{Payload: json.RawMessage(`{}`)}, "EventType is empty"},
		{"newline in event type", outbox.Event{EventType: "a\nb", Payload: json.RawMessage(`{}`)}, "control character"},
		{"nil payload", outbox.Event{EventType: "t"}, "Payload is nil"},
		{"invalid raw payload", outbox.Event{EventType: "t", Payload: json.RawMessage(`{"a":`)}, "not valid JSON"},
		{"invalid byte payload", outbox.Event{EventType: "t", Payload: []byte(`not json`)}, "not valid JSON"},
		{"empty byte payload", outbox.Event{EventType: "t", Payload: []byte{}}, "not valid JSON"},
		{"unmarshalable payload", outbox.Event{EventType: "t", Payload: make(chan int)}, "cannot be encoded as JSON"},
		{"NUL in payload", outbox.Event{EventType: "t", Payload: map[string]string{"a": "x\x00y"}}, `\u0000`},
		{"NUL in stream id", outbox.Event{EventType: "t", Payload: json.RawMessage(`{}`), StreamID: "a\x00"}, "NUL"},
		{"negative delay", outbox.Event{EventType: "t", Payload: json.RawMessage(`{}`), Delay: -time.Second}, "negative"},
		{"endpoint URL without a scheme", outbox.Event{EventType: "t", Payload: json.RawMessage(`{}`), EndpointURL: "notaurl"}, "EndpointURL"},
		{"endpoint URL with credentials", outbox.Event{EventType: "t", Payload: json.RawMessage(`{}`), EndpointURL: "https://u:p@x.example/"}, "password"},
		{"long stream id", outbox.Event{EventType: "t", Payload: json.RawMessage(`{}`), StreamID: strings.Repeat("s", 257)}, "StreamID is 257 bytes, over the limit of 256"},
		{"long endpoint URL", outbox.Event{EventType: "t", Payload: json.RawMessage(`{}`), EndpointURL: "https://x.example/" + strings.Repeat("p", 2040)}, "EndpointURL is 2058 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Inside a transaction: had anything reached the database and failed there, the
			// transaction would be aborted and the probe query below would fail.
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, tc.ev)
				if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Enqueue(%+v) error = %v, want ErrInvalidEvent mentioning %q", tc.ev, err, tc.want)
				}
				var one int
				return tx.QueryRow(ctx, "SELECT 1").Scan(&one)
			})
			if err != nil {
				t.Errorf("the caller's transaction is unusable after a rejected event: %v", err)
			}
		})
	}
	// A legitimate escaped backslash followed by "u0000" is not a NUL.
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Event{EventType: "t", Payload: json.RawMessage(`{"path":"C:\\u0000"}`)}); err != nil {
		t.Errorf("an escaped backslash before u0000 was rejected: %v", err)
	}
	if rows := readRows(t, db); len(rows) != 1 {
		t.Fatalf("outbox holds %d rows, want only the one valid event", len(rows))
	}
}

func TestEnqueueManyInsertsAllOrNothing(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()

	if n, err := outbox.EnqueueMany(ctx, db.Pool, nil); n != 0 || err != nil {
		t.Fatalf("EnqueueMany(nil) = %d, %v", n, err)
	}
	_, err := outbox.EnqueueMany(ctx, db.Pool, []outbox.Event{
		{EventType: "ok", Payload: json.RawMessage(`{}`)},
		{EventType: "", Payload: json.RawMessage(`{}`)},
	})
	if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "event 1") {
		t.Fatalf("EnqueueMany with an invalid second event: %v, want ErrInvalidEvent naming event 1", err)
	}
	if rows := readRows(t, db); len(rows) != 0 {
		t.Fatalf("a rejected batch wrote %d rows", len(rows))
	}

	evs := []outbox.Event{
		{EventType: "a", Payload: json.RawMessage(`{"n":0}`)},
		{EventType: "b", Payload: map[string]int{"n": 1}, StreamID: "s", EndpointURL: "https://e.example/"},
		{EventType: "c", Payload: []byte(`{"n":2}`), Delay: time.Minute},
	}
	n, err := outbox.EnqueueMany(ctx, db.Pool, evs)
	if err != nil || n != 3 {
		t.Fatalf("EnqueueMany = %d, %v; want 3", n, err)
	}
	rows := readRows(t, db)
	if len(rows) != 3 {
		t.Fatalf("outbox holds %d rows, want 3", len(rows))
	}
	for i, r := range rows {
		if r.EventType != evs[i].EventType || r.Attempt != 1 {
			t.Errorf("row %d = %+v, want event %q first attempt, in input order", i, r, evs[i].EventType)
		}
	}
	if rows[0].StreamID != nil || rows[1].StreamID == nil || *rows[1].StreamID != "s" || rows[1].EndpointURL == nil {
		t.Errorf("optional fields not mapped: %+v / %+v", rows[0], rows[1])
	}
	if rows[0].DueInMs > 0 || rows[2].DueInMs < 50_000 {
		t.Errorf("due times: %.0f ms and %.0f ms from now, want now and about a minute", rows[0].DueInMs, rows[2].DueInMs)
	}
}
