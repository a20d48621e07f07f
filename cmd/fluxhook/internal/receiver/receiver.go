package receiver

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/fluxora/fluxhook/stages/sign"
	"github.com/fluxora/fluxhook/stages/sign/verify"
)

// The headers fluxhook sends (docs/wire-format.md).
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
	DefaultTolerance = verify.DefaultTolerance
	DefaultMaxBody   = verify.DefaultMaxBody
	DefaultDedupSize = verify.DefaultStoreSize
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
	// Reason says which check failed, e.g. "sign: missing header x-fluxora-timestamp".
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
	// (rotation), accepted for as long as the receiver runs. Empty strings are ignored.
	Secrets []string
	// Tolerance is how far the timestamp may be from now, either way; 0 means 300 s.
	Tolerance time.Duration
	// MaxBody is the largest accepted body in bytes; 0 means 256 KiB.
	MaxBody int64
	// DedupSize bounds the set of acknowledged keys, two per delivery (its id and its
	// signature, see verify's check 8); the oldest are forgotten first. 0 means 200,000.
	DedupSize int
	// IDOnly deduplicates on the delivery id alone (verify.Verifier.IDOnly): identical
	// bodies signed in the same second under different ids are then all handled, as a
	// benchmark sending one payload thousands of times a second needs.
	IDOnly bool
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

	once    sync.Once
	handler http.Handler // verify's middleware around answer
}

// previousUntil keeps a previous secret valid for the receiver's whole life: a development
// receiver is restarted to end a rotation, unlike a consumer with a grace window.
var previousUntil = time.Date(9999, time.December, 31, 0, 0, 0, 0, time.UTC)

// ServeHTTP verifies the request and answers it.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.once.Do(r.init)
	ctx := context.WithValue(req.Context(), receivedKey{}, r.now())
	r.handler.ServeHTTP(w, req.WithContext(ctx))
}

// Signature is the x-fluxora-signature of body signed at timestamp with secret: lower-case
// hex HMAC-SHA256 over timestamp + "." + body.
func Signature(secret string, timestamp int64, body []byte) string {
	return sign.FluxoraSignature([]byte(secret), strconv.FormatInt(timestamp, 10), body)
}

type receivedKey struct{}

// init builds the verifier from the fields, once they are final.
func (r *Receiver) init() {
	v := &verify.Verifier{
		Tolerance:    r.Tolerance,
		MaxBody:      r.MaxBody,
		Store:        verify.NewMemoryStore(r.DedupSize),
		IDOnly:       r.IDOnly,
		Now:          r.now,
		ErrorHandler: r.reject,
	}
	for i, s := range r.Secrets {
		if i == 0 {
			v.Secret = s
			continue
		}
		v.Previous = append(v.Previous, verify.Previous{Secret: s, Until: previousUntil})
	}
	r.handler = v.Middleware(http.HandlerFunc(r.answer))
}

// answer is the "application" behind the verifier: wait, report, answer with Status. The
// middleware remembers the id only if that is a 2xx and the client is still there.
func (r *Receiver) answer(w http.ResponseWriter, req *http.Request) {
	d, _ := verify.FromContext(req.Context())
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
	if r.OnDelivery != nil {
		r.OnDelivery(Delivery{
			ID:         d.ID,
			Event:      d.Event,
			Timestamp:  d.Timestamp.Unix(),
			Attempt:    d.Attempt,
			Secret:     d.Secret,
			Header:     req.Header,
			Body:       d.Body,
			ReceivedAt: received(req),
			Status:     status,
			Abandoned:  req.Context().Err() != nil,
		})
	}
	w.WriteHeader(status)
}

func (r *Receiver) reject(w http.ResponseWriter, req *http.Request, err error) {
	if r.OnReject != nil {
		r.OnReject(Rejection{
			Status:     verify.StatusOf(err),
			Reason:     err.Error(),
			DeliveryID: req.Header.Get(HeaderDeliveryID),
			Event:      req.Header.Get(HeaderEvent),
			ReceivedAt: received(req),
		})
	}
	verify.WriteError(w, err)
}

func received(req *http.Request) time.Time {
	t, _ := req.Context().Value(receivedKey{}).(time.Time)
	return t
}

func (r *Receiver) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
