package produce

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestEventsRoundTrip: a producer in another process hands its timings back through
// WriteEvents and ReadEvents unchanged; a torn record is an error, not a short list.
func TestEventsRoundTrip(t *testing.T) {
	t.Parallel()
	in := []Event{
		{ID: NewID(), Scheduled: 1, Start: 2, Commit: 3, OK: true},
		{ID: NewID(), Scheduled: -4, Start: 1 << 62, Commit: 0, OK: false},
	}
	var buf bytes.Buffer
	if err := WriteEvents(&buf, in); err != nil {
		t.Fatal(err)
	}
	out, err := ReadEvents(bytes.NewReader(buf.Bytes()))
	if err != nil || !slices.Equal(in, out) {
		t.Fatalf("ReadEvents = %+v, %v; want %+v", out, err, in)
	}
	if _, err := ReadEvents(bytes.NewReader(buf.Bytes()[:buf.Len()-1])); err == nil {
		t.Error("ReadEvents accepted a torn record")
	}
}

// TestFormatID: the canonical text form the consumer parses, and a version-4 UUID.
func TestFormatID(t *testing.T) {
	t.Parallel()
	id := [16]byte{0x01, 0x90, 0xa6, 0xc2, 0x7b, 0x1e, 0x7d, 0x3a, 0x9f, 0x00, 0x12, 0x34, 0x56, 0x78, 0x90, 0xab}
	if got := FormatID(id); got != "0190a6c2-7b1e-7d3a-9f00-1234567890ab" {
		t.Errorf("FormatID = %s", got)
	}
	n := NewID()
	if s := FormatID(n); s[14] != '4' || !strings.ContainsAny(s[19:20], "89ab") {
		t.Errorf("NewID = %s, not a version-4 UUID", s)
	}
}

// TestAtRate: every event is inserted once, on its schedule, its times in order; a failed
// insert is counted and named, and the others still go.
func TestAtRate(t *testing.T) {
	t.Parallel()
	conns := make([]*pgx.Conn, 3) // the insert below never uses its connection
	mu := make(chan struct{}, 1)
	seen := map[int]int{}
	insert := func(_ context.Context, _ *pgx.Conn, seq int) ([16]byte, error) {
		mu <- struct{}{}
		seen[seq]++
		<-mu
		if seq == 7 {
			return [16]byte{}, errors.New("refused")
		}
		return [16]byte{byte(seq)}, nil
	}
	const total, period = 20, time.Millisecond
	sent, attempted, err := AtRate(context.Background(), conns, period, total, insert)
	if attempted != total || err == nil || !strings.Contains(err.Error(), "1 producer inserts failed") || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("AtRate: %d attempted, %v; want %d and one failure named", attempted, err, total)
	}
	for seq := range total {
		ev := sent[seq]
		if seen[seq] != 1 {
			t.Errorf("event %d inserted %d times", seq, seen[seq])
		}
		if ev.OK != (seq != 7) || (ev.OK && ev.ID != [16]byte{byte(seq)}) {
			t.Errorf("event %d: %+v", seq, ev)
		}
		if ev.Start < ev.Scheduled || ev.Commit < ev.Start {
			t.Errorf("event %d: scheduled %d, start %d, commit %d: out of order", seq, ev.Scheduled, ev.Start, ev.Commit)
		}
		if seq > 0 && ev.Scheduled-sent[seq-1].Scheduled != int64(period) {
			t.Errorf("event %d scheduled %s after the one before, want %s", seq, time.Duration(ev.Scheduled-sent[seq-1].Scheduled), period)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := AtRate(ctx, conns, time.Hour, 5, insert); !errors.Is(err, context.Canceled) {
		t.Errorf("AtRate on a cancelled context: %v", err)
	}
}

// TestPayload: the same bytes for the same event, whatever system it goes to.
func TestPayload(t *testing.T) {
	t.Parallel()
	if got := string(Payload(12, 3)); got != `{"seq":12,"pad":"xxx"}` {
		t.Errorf("Payload(12, 3) = %s", got)
	}
}
