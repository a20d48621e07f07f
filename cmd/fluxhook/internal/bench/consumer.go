package bench

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
	"strings"
	"sync"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/receiver"
)

// benchConsumerMode is the hidden first argument of `fluxhook bench` that runs the consumer.
const benchConsumerMode = "internal-consumer"

// benchSecretEnv passes the signing secret to the consumer child (not on its command line,
// where ps would show it).
const benchSecretEnv = "FLUXHOOK_BENCH_SECRET"

// benchEndpointSecretsEnv passes the fanout workload's endpoints' secrets to the consumer
// child, comma-separated: the i-th (from 0) verifies the requests to /ep/<i>, and nothing else
// does, so that a delivery signed with another endpoint's secret (or sent to another
// endpoint's path) is rejected, not counted.
const benchEndpointSecretsEnv = "FLUXHOOK_BENCH_ENDPOINT_SECRETS"

// maxFanoutEndpoints bounds --fanout-endpoints (the consumer's paths).
const maxFanoutEndpoints = 1000

// arrivalRecordSize is the wire size of one arrival: 16 bytes of delivery id, 8 of time, 2 of
// the path it arrived on.
const arrivalRecordSize = 26

// arrival is one verified request at the consumer.
type arrivalRecord struct {
	id [16]byte
	ns int64 // wall clock, Unix nanoseconds, taken when the request arrived
	// ep is the path: 0 for /hook (WEBHOOK_URL), i+1 for the fanout endpoint /ep/<i>. A
	// managed endpoint's delivery carries its event's delivery id, shared by every endpoint
	// the event went to: (id, ep) is one delivery.
	ep uint16
}

// key is what one delivery is told apart by.
func (a arrivalRecord) key() arrivalKey { return arrivalKey{a.id, a.ep} }

// arrivalKey is one (event, path) delivery.
type arrivalKey struct {
	id [16]byte
	ep uint16
}

// arrivalChunk is how many arrivals one block of the log holds.
const arrivalChunk = 1 << 16

// arrivalLog is the consumer's record of verified deliveries and rejections. Arrivals are kept
// in fixed blocks, never in one growing slice: a slice of millions of records grows by a
// quarter at a time, copying all of them with the lock held, and every request waited for it.
// In a 30-minute soak that was a stall of 0.3–0.9 s at minutes 10, 12, 15, 19, 24 and 29 (each
// growth a quarter later than the last), which the soak read as the dispatcher's p99.
type arrivalLog struct {
	mu       sync.Mutex
	chunks   [][]arrivalRecord // each of capacity arrivalChunk; only the last is not full
	n        int
	rejected int
	lastNS   int64
	badID    int
}

func (l *arrivalLog) add(d receiver.Delivery, ep uint16) {
	id, ok := parseUUID(d.ID)
	ns := d.ReceivedAt.UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !ok {
		l.badID++
		return
	}
	l.push(arrivalRecord{id: id, ns: ns, ep: ep})
	l.lastNS = max(l.lastNS, ns)
}

// push appends one record; l.mu is held.
func (l *arrivalLog) push(r arrivalRecord) {
	if len(l.chunks) == 0 || len(l.chunks[len(l.chunks)-1]) == arrivalChunk {
		l.chunks = append(l.chunks, make([]arrivalRecord, 0, arrivalChunk))
	}
	last := &l.chunks[len(l.chunks)-1]
	*last = append(*last, r)
	l.n++
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
	return consumerStats{Received: l.n, Rejected: l.rejected + l.badID, LastNS: l.lastNS}
}

func (l *arrivalLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.chunks, l.n = nil, 0
	l.rejected, l.badID, l.lastNS = 0, 0, 0
}

// writeArrivals streams arrivals[from:] as fixed-size little-endian records.
func (l *arrivalLog) writeArrivals(w io.Writer, from int) error {
	l.mu.Lock()
	// The blocks' headers as of now: a block only grows by append within its capacity, and
	// the records below each header's length never change.
	chunks := make([][]arrivalRecord, len(l.chunks))
	copy(chunks, l.chunks)
	l.mu.Unlock()
	bw := bufio.NewWriterSize(w, 64<<10)
	var buf [arrivalRecordSize]byte
	from = max(from, 0)
	for _, c := range chunks {
		if from >= len(c) {
			from -= len(c)
			continue
		}
		for _, r := range c[from:] {
			copy(buf[:16], r.id[:])
			binary.LittleEndian.PutUint64(buf[16:24], uint64(r.ns))
			binary.LittleEndian.PutUint16(buf[24:26], r.ep)
			if _, err := bw.Write(buf[:]); err != nil {
				return err
			}
		}
		from = 0
	}
	return bw.Flush()
}

// runBenchConsumer serves the verifying receiver on 127.0.0.1 and the bench's control
// endpoints: POST /hook verified with the bench's WEBHOOK_SECRET, and POST /ep/<i> with the
// i-th secret of FLUXHOOK_BENCH_ENDPOINT_SECRETS, each path its own receiver. It prints
// "listening ADDR" on stdout once it accepts requests, and exits when its standard input
// closes (the bench went away, however it ended) or on SIGINT/SIGTERM.
func runBenchConsumer(ctx context.Context, env Env, args []string) error {
	fs := cli.NewFlagSet("bench "+benchConsumerMode, env.Stdout, env.Stderr, "fluxhook bench "+benchConsumerMode)
	if err := cli.NoArguments(fs, args); err != nil {
		return err
	}
	secret := env.Getenv(benchSecretEnv)
	if secret == "" {
		return cli.UsageError("%s is not set", benchSecretEnv)
	}
	var epSecrets []string
	if raw := env.Getenv(benchEndpointSecretsEnv); raw != "" {
		epSecrets = strings.Split(raw, ",")
		if len(epSecrets) > maxFanoutEndpoints {
			return cli.UsageError("%s: %d secrets, at most %d", benchEndpointSecretsEnv, len(epSecrets), maxFanoutEndpoints)
		}
		for i, s := range epSecrets {
			if s == "" {
				return cli.UsageError("%s: secret %d is empty", benchEndpointSecretsEnv, i)
			}
		}
	}
	log := &arrivalLog{}
	mux := benchConsumerMux(secret, epSecrets, log)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(env.Stdout, "listening %s\n", ln.Addr())

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

// benchConsumerMux is the consumer's handler: POST /hook verified with secret, POST /ep/<i>
// with epSecrets[i] (each path its own receiver, so a request signed with another endpoint's
// secret is rejected), and the control endpoints GET /stats, GET /arrivals, POST /reset.
func benchConsumerMux(secret string, epSecrets []string, log *arrivalLog) *http.ServeMux {
	verifying := func(secret string, ep uint16) *receiver.Receiver {
		return &receiver.Receiver{
			Secrets: []string{secret},
			// The bench counts duplicates itself; remembering ids would answer a redelivery
			// 409, which the dispatcher dead-letters, hiding the duplicate.
			DedupSize: 1,
			// The producers workload sends one payload thousands of times a second: with
			// the signature remembered too, same-second twins would be answered 409.
			IDOnly:     true,
			Status:     http.StatusNoContent,
			OnDelivery: func(d receiver.Delivery) { log.add(d, ep) },
			OnReject:   func(receiver.Rejection) { log.reject() },
		}
	}
	mux := http.NewServeMux()
	mux.Handle("POST /hook", verifying(secret, 0))
	for i, s := range epSecrets {
		mux.Handle("POST "+fanoutPath(i), verifying(s, uint16(i+1)))
	}
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
	return mux
}

// fanoutPath is the consumer's path for the i-th (from 0) fanout endpoint.
func fanoutPath(i int) string { return "/ep/" + strconv.Itoa(i) }

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
