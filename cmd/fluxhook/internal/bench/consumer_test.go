package bench

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// The consumer's arrival log keeps its records in blocks (see arrivalLog); reading from any
// offset, across block boundaries, must give every record from there on, in order.
func TestArrivalLogReadsAcrossBlocks(t *testing.T) {
	t.Parallel()
	var l arrivalLog
	total := 2*arrivalChunk + 5
	l.mu.Lock()
	for i := range total {
		l.push(arrivalRecord{ns: int64(i), ep: uint16(i % 7)})
	}
	l.mu.Unlock()
	if got := l.stats().Received; got != total {
		t.Fatalf("stats: %d received, want %d", got, total)
	}
	for _, from := range []int{0, 1, arrivalChunk - 1, arrivalChunk, arrivalChunk + 1, 2 * arrivalChunk, total - 1, total, total + 10} {
		var buf bytes.Buffer
		if err := l.writeArrivals(&buf, from); err != nil {
			t.Fatal(err)
		}
		want := max(total-from, 0)
		if buf.Len() != want*arrivalRecordSize {
			t.Fatalf("from %d: %d bytes, want %d records", from, buf.Len(), want)
		}
		for i := range want {
			rec := buf.Bytes()[i*arrivalRecordSize:]
			ns := int(binary.LittleEndian.Uint64(rec[16:24]))
			ep := int(binary.LittleEndian.Uint16(rec[24:26]))
			if ns != from+i || ep != (from+i)%7 {
				t.Fatalf("from %d: record %d is (%d, %d), want (%d, %d)", from, i, ns, ep, from+i, (from+i)%7)
			}
		}
	}
	l.reset()
	if got := l.stats().Received; got != 0 {
		t.Errorf("after reset: %d received", got)
	}
}
