package main

// The consumer side of `fluxhook bench`: a child process (`fluxhook bench internal-consumer`)
// that runs the verifying receiver and records every arrival, so that the consumer's CPU and
// the benchmark's bookkeeping stay out of both the dispatcher's process and the producer's.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/receiver"
)

// benchConsumerMode is the hidden first argument of `fluxhook bench` that runs the consumer.
const benchConsumerMode = "internal-consumer"

// benchSecretEnv passes the signing secret to the consumer child (not on its command line,
// where ps would show it).
const benchSecretEnv = "FLUXHOOK_BENCH_SECRET"

// arrivalRecordSize is the wire size of one arrival: 16 bytes of delivery id, 8 of time.
const arrivalRecordSize = 24

// arrival is one verified request at the consumer.
type arrivalRecord struct {
	id [16]byte
	ns int64 // wall clock, Unix nanoseconds, taken when the request arrived
}

// arrivalLog is the consumer's record of verified deliveries and rejections.
type arrivalLog struct {
	mu       sync.Mutex
	arrivals []arrivalRecord
	rejected int
	lastNS   int64
	badID    int
}

func (l *arrivalLog) add(d receiver.Delivery) {
	id, ok := parseUUID(d.ID)
	ns := d.ReceivedAt.UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !ok {
		l.badID++
		return
	}
	l.arrivals = append(l.arrivals, arrivalRecord{id: id, ns: ns})
	l.lastNS = max(l.lastNS, ns)
}

func (l *arrivalLog) reject() {
	l.mu.Lock()
	l.rejected++
	l.mu.Unlock()
}

// consumerStats is the answer of GET /stats.
type consumerStats struct {
	Received int   `json:"received"` // verified requests, duplicates included
	Rejected int   `json:"rejected"` // requests that failed verification (or a bad delivery id)
	LastNS   int64 `json:"last_ns"`
}

func (l *arrivalLog) stats() consumerStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return consumerStats{Received: len(l.arrivals), Rejected: l.rejected + l.badID, LastNS: l.lastNS}
}

func (l *arrivalLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.arrivals = nil
	l.rejected, l.badID, l.lastNS = 0, 0, 0
}

// writeArrivals streams arrivals[from:] as fixed-size little-endian records.
func (l *arrivalLog) writeArrivals(w io.Writer, from int) error {
	l.mu.Lock()
	recs := l.arrivals[min(from, len(l.arrivals)):]
	l.mu.Unlock() // arrivals only grows by append; the slice header above stays valid
	bw := bufio.NewWriterSize(w, 64<<10)
	var buf [arrivalRecordSize]byte
	for _, r := range recs {
		copy(buf[:16], r.id[:])
		binary.LittleEndian.PutUint64(buf[16:], uint64(r.ns))
		if _, err := bw.Write(buf[:]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// runBenchConsumer serves the verifying receiver on 127.0.0.1 and the bench's control
// endpoints. It prints "listening ADDR" on stdout once it accepts requests, and exits when its
// standard input closes (the bench went away, however it ended) or on SIGINT/SIGTERM.
func runBenchConsumer(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("bench "+benchConsumerMode, env, "fluxhook bench "+benchConsumerMode)
	if err := noArguments(fs, args); err != nil {
		return err
	}
	secret := env.getenv(benchSecretEnv)
	if secret == "" {
		return usageError("%s is not set", benchSecretEnv)
	}
	log := &arrivalLog{}
	recv := &receiver.Receiver{
		Secrets: []string{secret},
		// The bench counts duplicates itself; remembering ids would answer a redelivery 409,
		// which the dispatcher dead-letters, hiding the duplicate.
		DedupSize:  1,
		Status:     http.StatusNoContent,
		OnDelivery: log.add,
		OnReject:   func(receiver.Rejection) { log.reject() },
	}
	mux := http.NewServeMux()
	mux.Handle("POST /hook", recv)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(log.stats())
	})
	mux.HandleFunc("GET /arrivals", func(w http.ResponseWriter, r *http.Request) {
		from, _ := strconv.Atoi(r.URL.Query().Get("from"))
		w.Header().Set("Content-Type", "application/octet-stream")
		_ = log.writeArrivals(w, max(from, 0))
	})
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, r *http.Request) {
		log.reset()
		w.WriteHeader(http.StatusNoContent)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(env.stdout, "listening %s\n", ln.Addr())

	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	select {
	case <-ctx.Done():
	case <-stdinClosed:
	case err := <-served:
		return err
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// parseUUID parses the canonical 36-character text form.
func parseUUID(s string) ([16]byte, bool) {
	var out [16]byte
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return out, false
	}
	var hexDigits [32]byte
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '-' {
			continue
		}
		hexDigits[n] = s[i]
		n++
	}
	if _, err := hex.Decode(out[:], hexDigits[:]); err != nil {
		return out, false
	}
	return out, true
}

// formatUUID is the canonical text form of id.
func formatUUID(id [16]byte) string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}
