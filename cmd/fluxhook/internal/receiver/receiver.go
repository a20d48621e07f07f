package receiver

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The headers fluxhook sends (REFERENCE.md, wire format).
const (
	HeaderDeliveryID = "x-fluxora-delivery-id"
	HeaderTimestamp  = "x-fluxora-timestamp"
	HeaderEvent      = "x-fluxora-event"
	HeaderSignature  = "x-fluxora-signature"
	// HeaderAttempt is fluxhook's own extra header: 1 for the first attempt.
	HeaderAttempt = "x-fluxora-attempt"
)

// Defaults for the zero values of Receiver's fields.
const (
	DefaultTolerance = 300 * time.Second
	DefaultMaxBody   = 256 << 10
	DefaultDedupSize = 100_000
	DefaultStatus    = http.StatusNoContent
)

// Delivery is one request that passed every check.
type Delivery struct {
	// ID is the x-fluxora-delivery-id header.
	ID string
	// Event is the x-fluxora-event header (not required by the checks; may be empty).
	Event string
	// Timestamp is the signed x-fluxora-timestamp, in Unix seconds.
	Timestamp int64
	// Attempt is the x-fluxora-attempt header, or 0 when it is absent or not a number.
	Attempt int
	// Secret is the index in Receiver.Secrets of the secret that verified the signature:
	// 0 for the current one, 1 or more for previous ones.
	Secret int
	// Header is the request's headers.
	Header http.Header
	// Body is the raw body, exactly as signed.
	Body []byte
	// ReceivedAt is when the request arrived (before reading the body).
	ReceivedAt time.Time
	// Status is the status the receiver answers with.
	Status int
	// Abandoned reports that the request's context ended during Delay (the client went
	// away, or the server is shutting down): the client may never see the answer, so the
	// delivery id is not remembered.
	Abandoned bool
}

// Rejection is one request that failed a check.
type Rejection struct {
	// Status is the answer: 400, 401, 409, 413 or 500.
	Status int
	// Reason says which check failed, e.g. "missing header x-fluxora-timestamp".
	Reason string
	// DeliveryID is the x-fluxora-delivery-id header, possibly empty.
	DeliveryID string
	// Event is the x-fluxora-event header, possibly empty.
	Event      string
	ReceivedAt time.Time
}

// Receiver verifies webhook requests. Configure its fields before serving the first request
// and do not change them afterwards; ServeHTTP is safe for concurrent use. The zero value
// rejects everything with 500 because it has no secret.
type Receiver struct {
	// Secrets are the accepted signing secrets: the current one first, then previous ones
	// (rotation). Empty strings are ignored.
	Secrets []string
	// Tolerance is how far the timestamp may be from now, either way; 0 means 300 s.
	Tolerance time.Duration
	// MaxBody is the largest accepted body in bytes; 0 means 256 KiB.
	MaxBody int64
	// DedupSize bounds the set of acknowledged delivery ids; the oldest are forgotten first.
	// 0 means 100,000.
	DedupSize int
	// Status is the answer to a request that passed every check; 0 means 204. Only a 2xx
	// answer marks the delivery id as seen, so that with a failure status the dispatcher's
	// retries are verified again rather than refused as duplicates.
	Status int
	// Delay is how long to wait before answering a verified request (a slow consumer). The
	// wait ends early when the client goes away.
	Delay time.Duration
	// OnDelivery, if set, is called for every verified request just before it is answered,
	// from the request's goroutine.
	OnDelivery func(Delivery)
	// OnReject, if set, is called for every rejected request, from the request's goroutine.
	OnReject func(Rejection)
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu   sync.Mutex
	seen map[string]struct{}
	ring []string // acknowledged ids in arrival order, for eviction
	next int      // ring index of the oldest id once the ring is full
}

// ServeHTTP verifies the request and answers it.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	now := r.now()
	h := req.Header
	reject := func(status int, format string, args ...any) {
		reason := fmt.Sprintf(format, args...)
		if r.OnReject != nil {
			r.OnReject(Rejection{
				Status:     status,
				Reason:     reason,
				DeliveryID: h.Get(HeaderDeliveryID),
				Event:      h.Get(HeaderEvent),
				ReceivedAt: now,
			})
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, reason+"\n")
	}

	// 1. A secret is configured.
	keys := r.keys()
	if len(keys) == 0 {
		reject(http.StatusInternalServerError, "no webhook secret configured")
		return
	}
	// 2. Required headers, in order.
	id, ts, sig := h.Get(HeaderDeliveryID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	for _, hdr := range [...]struct{ name, value string }{
		{HeaderDeliveryID, id}, {HeaderTimestamp, ts}, {HeaderSignature, sig},
	} {
		if hdr.value == "" {
			reject(http.StatusUnauthorized, "missing header %s", hdr.name)
			return
		}
	}
	// 3. Body size.
	maxBody := r.MaxBody
	if maxBody <= 0 {
		maxBody = DefaultMaxBody
	}
	if req.ContentLength > maxBody {
		reject(http.StatusRequestEntityTooLarge, "body larger than %d bytes", maxBody)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, maxBody+1))
	if err != nil {
		reject(http.StatusBadRequest, "reading body: %v", err)
		return
	}
	if int64(len(body)) > maxBody {
		reject(http.StatusRequestEntityTooLarge, "body larger than %d bytes", maxBody)
		return
	}
	// 4. Timestamp syntax.
	unix, ok := parseTimestamp(ts)
	if !ok {
		reject(http.StatusBadRequest, "%s is not a positive integer: %q", HeaderTimestamp, ts)
		return
	}
	// 5. Timestamp freshness, inclusive.
	tolerance := r.Tolerance
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if skew := now.Unix() - unix; skew > int64(tolerance/time.Second) || skew < -int64(tolerance/time.Second) {
		reject(http.StatusUnauthorized, "%s %d is %d s from now, outside the tolerance of %d s",
			HeaderTimestamp, unix, skew, int64(tolerance/time.Second))
		return
	}
	// 6. Signature, against each secret.
	got := []byte(strings.ToLower(strings.TrimSpace(sig)))
	matched := -1
	for _, k := range keys { // every key, so the time taken does not depend on which matched
		if hmac.Equal([]byte(sign(k.secret, ts, body)), got) && matched < 0 {
			matched = k.index
		}
	}
	if matched < 0 {
		reject(http.StatusUnauthorized, "signature does not match")
		return
	}
	// Answer after the delay, then 7: the duplicate check comes last so that a delivery
	// answered with a failure or abandoned by the client is not remembered.
	if r.Delay > 0 {
		t := time.NewTimer(r.Delay)
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
		}
	}
	status := r.Status
	if status == 0 {
		status = DefaultStatus
	}
	abandoned := req.Context().Err() != nil
	ack := status >= 200 && status < 300 && !abandoned
	if !r.admit(id, ack) {
		reject(http.StatusConflict, "delivery %s already received", id)
		return
	}
	if r.OnDelivery != nil {
		attempt, _ := strconv.Atoi(h.Get(HeaderAttempt))
		r.OnDelivery(Delivery{
			ID:         id,
			Event:      h.Get(HeaderEvent),
			Timestamp:  unix,
			Attempt:    attempt,
			Secret:     matched,
			Header:     h,
			Body:       body,
			ReceivedAt: now,
			Status:     status,
			Abandoned:  abandoned,
		})
	}
	w.WriteHeader(status)
}

// Signature is the x-fluxora-signature of body signed at timestamp with secret: lower-case
// hex HMAC-SHA256 over timestamp + "." + body.
func Signature(secret string, timestamp int64, body []byte) string {
	return sign(secret, strconv.FormatInt(timestamp, 10), body)
}

func sign(secret, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

type key struct {
	secret string
	index  int // position in Secrets
}

// keys are the configured non-empty secrets with their positions.
func (r *Receiver) keys() []key {
	keys := make([]key, 0, len(r.Secrets))
	for i, s := range r.Secrets {
		if s != "" {
			keys = append(keys, key{s, i})
		}
	}
	return keys
}

func (r *Receiver) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// admit reports whether id has not been acknowledged yet and, when ack is set, records it.
func (r *Receiver) admit(id string, ack bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.seen[id]; dup {
		return false
	}
	if !ack {
		return true
	}
	size := r.DedupSize
	if size <= 0 {
		size = DefaultDedupSize
	}
	if r.seen == nil {
		r.seen = make(map[string]struct{})
	}
	if len(r.ring) < size {
		r.ring = append(r.ring, id)
	} else {
		delete(r.seen, r.ring[r.next])
		r.ring[r.next] = id
		r.next = (r.next + 1) % len(r.ring)
	}
	r.seen[id] = struct{}{}
	return true
}

// parseTimestamp accepts only a positive decimal integer: digits, no sign, no spaces.
func parseTimestamp(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n > 0
}
