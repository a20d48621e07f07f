// Package produce is the producer loop of `fluxhook bench`: events inserted on a common
// schedule from several connections, each insert's scheduled time, start and commit recorded.
// It is shared by the bench's own producer (fluxhook's outbox insert) and by the River
// baseline's (River's InsertTx, run in the baseline's program so that River stays out of the
// fluxhook binary), so that both are timed by one code path and their commit → arrival
// latencies compare: only the insert differs.
package produce

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Event is one producer insert.
type Event struct {
	// ID is the event's delivery id, what the consumer records its arrival by.
	ID                       [16]byte
	Scheduled, Start, Commit int64 // Unix ns
	OK                       bool
}

// Insert writes event seq on conn, committed when it returns, and returns its delivery id.
type Insert func(ctx context.Context, conn *pgx.Conn, seq int) ([16]byte, error)

// AtRate inserts total events, one per period from a common schedule, from all conns:
// whichever connection is free takes the next slot, and sleeps until its scheduled time.
// Latency is later measured from that scheduled time, so a stalled insert delays the events
// behind it in the measurement too (no coordinated omission). It returns the events and how
// many inserts were attempted; its error is the context's, or names how many inserts failed.
func AtRate(ctx context.Context, conns []*pgx.Conn, period time.Duration, total int, insert Insert) ([]Event, int, error) {
	sent := make([]Event, total)
	var next atomic.Int64
	var failures atomic.Int64
	var firstErr error
	var errOnce sync.Once
	t0 := time.Now().Add(10 * time.Millisecond)
	var wg sync.WaitGroup
	for _, conn := range conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				sched := t0.Add(time.Duration(i) * period)
				if d := time.Until(sched); d > 0 {
					t := time.NewTimer(d)
					select {
					case <-ctx.Done():
						t.Stop()
						return
					case <-t.C:
					}
				}
				ev := &sent[i]
				ev.Scheduled = sched.UnixNano()
				ev.Start = time.Now().UnixNano()
				id, err := insert(ctx, conn, i)
				ev.Commit = time.Now().UnixNano()
				if err != nil {
					failures.Add(1)
					errOnce.Do(func() { firstErr = err })
					continue
				}
				ev.ID, ev.OK = id, true
			}
		})
	}
	wg.Wait()
	attempted := min(int(next.Load()), total)
	if err := ctx.Err(); err != nil {
		return nil, attempted, err
	}
	if f := failures.Load(); f > 0 {
		return sent, attempted, fmt.Errorf("%d producer inserts failed, the first with: %w", f, firstErr)
	}
	return sent, attempted, nil
}

// Payload is an event body with padBytes of padding: the same bytes whichever system the
// event goes to.
func Payload(seq, padBytes int) []byte {
	buf := make([]byte, 0, padBytes+40)
	buf = append(buf, `{"seq":`...)
	buf = strconv.AppendInt(buf, int64(seq), 10)
	buf = append(buf, `,"pad":"`...)
	for range padBytes {
		buf = append(buf, 'x')
	}
	return append(buf, `"}`...)
}

// NewID is a random (version 4) UUID, for a system whose own ids are not UUIDs.
func NewID() [16]byte {
	var id [16]byte
	_, _ = rand.Read(id[:])
	id[6] = id[6]&0x0f | 0x40
	id[8] = id[8]&0x3f | 0x80
	return id
}

// FormatID is id's canonical text form, as the consumer parses it.
func FormatID(id [16]byte) string {
	const hexDigits = "0123456789abcdef"
	var b [36]byte
	j := 0
	for i, c := range id {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b[j] = '-'
			j++
		}
		b[j], b[j+1] = hexDigits[c>>4], hexDigits[c&0x0f]
		j += 2
	}
	return string(b[:])
}

// recordSize is an Event on the wire: id, three times, ok.
const recordSize = 16 + 3*8 + 1

// WriteEvents writes events in a fixed binary form, for a producer in another process to
// hand its timings back.
func WriteEvents(w io.Writer, events []Event) error {
	bw := bufio.NewWriter(w)
	var rec [recordSize]byte
	for _, ev := range events {
		copy(rec[:16], ev.ID[:])
		binary.LittleEndian.PutUint64(rec[16:], uint64(ev.Scheduled))
		binary.LittleEndian.PutUint64(rec[24:], uint64(ev.Start))
		binary.LittleEndian.PutUint64(rec[32:], uint64(ev.Commit))
		rec[40] = 0
		if ev.OK {
			rec[40] = 1
		}
		if _, err := bw.Write(rec[:]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// ReadEvents reads what WriteEvents wrote.
func ReadEvents(r io.Reader) ([]Event, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if len(raw)%recordSize != 0 {
		return nil, fmt.Errorf("%d bytes of producer events, not a multiple of %d", len(raw), recordSize)
	}
	out := make([]Event, len(raw)/recordSize)
	for i := range out {
		rec := raw[i*recordSize:]
		copy(out[i].ID[:], rec[:16])
		out[i].Scheduled = int64(binary.LittleEndian.Uint64(rec[16:]))
		out[i].Start = int64(binary.LittleEndian.Uint64(rec[24:]))
		out[i].Commit = int64(binary.LittleEndian.Uint64(rec[32:]))
		out[i].OK = rec[40] == 1
	}
	return out, nil
}
