package verify

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fluxora/fluxhook/stages/sign"
)

// Defaults for the zero values of Verifier's fields, the original receiver's limits.
const (
	// DefaultTolerance admits clock skew and a slow network but not a replay minutes later.
	DefaultTolerance = sign.DefaultTolerance
	// DefaultMaxBody is far above any event payload yet bounds what one request can make
	// the consumer buffer.
	DefaultMaxBody = 256 << 10
	// DefaultStoreSize is how many keys the default MemoryStore keeps, two per acknowledged
	// delivery (its id and its signature): more than a day of deliveries at one a second,
	// longer than the dispatcher's early retries are apart, in about twenty megabytes.
	DefaultStoreSize = 200_000
)

// The reasons a request is rejected. Match them with errors.Is on the error Verify, Claim or
// the middleware's ErrorHandler gets; the *Error around them carries the status to answer.
// The first five are package sign's own values, so code that matches sign.VerifyFluxora's
// errors matches these too.
var (
	// ErrNoSecret (500): no secret is currently valid; the consumer is misconfigured, and
	// the dispatcher should retry until it is fixed rather than give up.
	ErrNoSecret = sign.ErrNoSecret
	// ErrMissingHeader (401): a required header is absent or blank; the message names it.
	ErrMissingHeader = sign.ErrMissingHeader
	// ErrInvalidTimestamp (400): the timestamp is not a positive decimal integer.
	ErrInvalidTimestamp = sign.ErrInvalidTimestamp
	// ErrTimestampOutOfTolerance (401): the request was signed too long ago or too far
	// ahead, the mark of a replay or of a badly wrong clock.
	ErrTimestampOutOfTolerance = sign.ErrTimestampOutOfTolerance
	// ErrSignatureMismatch (401): no valid secret produces the signature; the body, the
	// timestamp or the secret is not what the sender used.
	ErrSignatureMismatch = sign.ErrSignatureMismatch
	// ErrBodyTooLarge (413): the body is over MaxBody; it is not read further.
	ErrBodyTooLarge = errors.New("verify: body larger than the limit")
	// ErrReadBody (400): the body could not be read (the client went away mid-request).
	ErrReadBody = errors.New("verify: reading the body")
	// ErrDuplicate (409): the delivery id was acknowledged before. A DedupStore returns it
	// from Claim.
	ErrDuplicate = errors.New("verify: delivery id already received")
	// ErrInProgress (409) is the ErrDuplicate of an id whose first request is still being
	// handled; it matches ErrDuplicate too. A DedupStore returns it from Claim when it can
	// tell the two apart.
	ErrInProgress = fmt.Errorf("%w (another request with it is still being handled)", ErrDuplicate)
	// ErrReplay (409, with Retry-After) is check 8: this signed request (the same timestamp
	// and body, so the same signature) was already acknowledged, or is being handled, under
	// another delivery id. The fluxora signature does not cover the id, so this is how a
	// captured request resent under a new id is recognised. The dispatcher never sends one
	// request under two ids; two distinct events with identical bodies signed in the same
	// second look alike, though, and the Retry-After makes the dispatcher send the second
	// again later, signed with a new timestamp, instead of taking the 409 for "delivered".
	ErrReplay = errors.New("verify: this signed request (same timestamp and body) was already received under another delivery id")
	// ErrStore (503): the DedupStore failed, so whether the id is new is unknown. The
	// answer is retryable: the dispatcher comes back later instead of the consumer
	// risking a duplicate.
	ErrStore = errors.New("verify: deduplication store failed")
)

// Error is a rejected request: the HTTP status that answers it, decided by the check that
// failed, so callers need no table of their own. Err matches one of the Err values.
type Error struct {
	// Status is 400, 401, 409, 413, 500 or 503.
	Status int
	// Err says which check failed and why.
	Err error
}

// Error is the cause's message: it names the check and the detail (header, bytes, seconds),
// which is what the sender records with a failed attempt.
func (e *Error) Error() string { return e.Err.Error() }

// Unwrap lets errors.Is see the Err value behind the status.
func (e *Error) Unwrap() error { return e.Err }

// StatusOf is the status to answer err with: the *Error's own, or 500 for any other error (a
// failure of the consumer, not of the request).
func StatusOf(err error) int {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Status
	}
	return http.StatusInternalServerError
}

// Delivery is a request that passed the checks: what a handler needs to process it.
type Delivery struct {
	// ID is the x-fluxora-delivery-id, the same on every attempt and replay of an event:
	// the key for idempotent processing.
	ID string
	// Event is the x-fluxora-event header (unsigned; may be empty).
	Event string
	// Timestamp is when the sender signed the request (x-fluxora-timestamp).
	Timestamp time.Time
	// Attempt is the x-fluxora-attempt header (1 for the first try; unsigned), or 0 when it
	// is absent or not a number.
	Attempt int
	// Secret tells which secret verified the signature: 0 for Verifier.Secret, i+1 for
	// Verifier.Previous[i]. Above 0 means the sender still signs with an old secret.
	Secret int
	// Body is the raw body, exactly the bytes that were signed.
	Body []byte
	// Signature is the verified x-fluxora-signature, lower-case hex. Unlike ID it is covered
	// by the signature: it stands for this timestamp and body, so ClaimDelivery keys replays
	// on it.
	Signature string
}

// Previous is a secret being rotated out, accepted until the end of its grace window.
type Previous struct {
	// Secret is the old signing secret.
	Secret string
	// Until is when the secret stops verifying (the first instant it is refused), on the
	// Verifier's clock. The zero time means it is never accepted: a grace window must end.
	Until time.Time
}

// Verifier checks fluxhook's webhook requests. Set its fields before first use and do not
// change them afterwards; its methods are safe for concurrent use. The zero value rejects
// every request with 500, as a consumer with no secret must; call Validate at startup to fail
// early instead.
type Verifier struct {
	// Secret is the current signing secret, the dispatcher's WEBHOOK_SECRET.
	Secret string
	// Previous are older secrets still accepted during a rotation, each until its Until.
	Previous []Previous
	// Tolerance is how far the signed timestamp may be from now, either way, inclusive, in
	// whole seconds; 0 means DefaultTolerance.
	Tolerance time.Duration
	// MaxBody is the largest accepted body in bytes; 0 means DefaultMaxBody.
	MaxBody int64
	// Store remembers delivery ids and signatures for checks 7 and 8; nil means a
	// MemoryStore of DefaultStoreSize keys, private to this Verifier.
	Store DedupStore
	// IDOnly turns check 8 off: deliveries are deduplicated on their id alone, so a captured
	// request resent under a new id within the tolerance is handled again. It is for
	// consumers that receive many identical bodies each second and deduplicate on something
	// in the body themselves (or count duplicates, as a benchmark does).
	IDOnly bool
	// Now is Middleware's clock for the tolerance and the grace windows (Verify takes the
	// time as an argument instead); nil means time.Now.
	Now func() time.Time
	// ErrorHandler, if set, answers the requests Middleware rejects, in place of
	// WriteError: to log them, or to answer in another format. It must answer with the
	// error's StatusOf for the dispatcher to retry or give up as the reference says.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)
	// SettleError, if set, is told when the Store fails to settle a claim after the
	// handler has answered (there is no one left to answer); nil drops the error. Until the
	// store recovers, the id may be refused or accepted once more.
	SettleError func(r *http.Request, err error)

	memory MemoryStore // the default Store
}

// Validate reports the settings that make the Verifier reject everything or accept more
// than intended, naming each field, so that a consumer can refuse to start with them.
func (v *Verifier) Validate() error {
	var errs []error
	if v.Secret == "" {
		errs = append(errs, errors.New("verify: Secret is empty: set it to the dispatcher's WEBHOOK_SECRET"))
	}
	for i, p := range v.Previous {
		if p.Secret == "" {
			errs = append(errs, fmt.Errorf("verify: Previous[%d].Secret is empty", i))
		}
		if p.Until.IsZero() {
			errs = append(errs, fmt.Errorf("verify: Previous[%d].Until is not set: a previous secret needs the end of its grace window", i))
		}
	}
	if v.Tolerance < 0 {
		errs = append(errs, fmt.Errorf("verify: Tolerance %v is negative", v.Tolerance))
	}
	if v.MaxBody < 0 {
		errs = append(errs, fmt.Errorf("verify: MaxBody %d is negative", v.MaxBody))
	}
	return errors.Join(errs...)
}

// Verify runs checks 1 to 6 on a request whose body the caller has read, answering with the
// first failing check's *Error. It keeps no state, so it does not look for duplicates: follow
// it with ClaimDelivery and SettleDelivery, or use Middleware, which does all of it.
func (v *Verifier) Verify(h http.Header, body []byte, now time.Time) (Delivery, error) {
	keys, err := v.checkHeaders(h, now)
	if err != nil {
		return Delivery{}, err
	}
	if limit := v.maxBody(); int64(len(body)) > limit {
		return Delivery{}, tooLarge(limit)
	}
	return v.checkSignature(h, body, now, keys)
}

// ClaimDelivery runs checks 7 and 8 on a Delivery that Verify accepted: it holds d.ID (Claim)
// and then d.Signature for the calling request until SettleDelivery. It fails with 409
// ErrDuplicate if the id was acknowledged or is held, with 409 ErrReplay if the same signed
// request was acknowledged or is held under another id, and with 503 if the store fails;
// on failure nothing stays held. Call SettleDelivery exactly once after a nil error. With
// IDOnly, or a Delivery without a Signature (not from Verify), only the id is claimed.
func (v *Verifier) ClaimDelivery(ctx context.Context, d Delivery) error {
	if err := v.Claim(ctx, d.ID); err != nil {
		return err
	}
	if v.IDOnly || d.Signature == "" {
		return nil
	}
	err := v.dedup().Claim(ctx, signatureKey(d.Signature))
	if err == nil {
		return nil
	}
	var refused error
	if errors.Is(err, ErrDuplicate) {
		refused = &Error{Status: http.StatusConflict, Err: fmt.Errorf("%w (this one's id: %.64q)", ErrReplay, d.ID)}
	} else {
		refused = &Error{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("%w: %w", ErrStore, err)}
	}
	if rerr := v.Settle(ctx, d.ID, false); rerr != nil {
		return errors.Join(refused, fmt.Errorf("%w: releasing the id: %w", ErrStore, rerr))
	}
	return refused
}

// SettleDelivery ends the claims ClaimDelivery took for d. Pass acknowledged true only when
// the request was answered with a 2xx that reached the sender: then the id and the signature
// are remembered, and later requests with either are refused; otherwise both are released,
// so the sender's retry is handled again.
func (v *Verifier) SettleDelivery(ctx context.Context, d Delivery, acknowledged bool) error {
	err := v.Settle(ctx, d.ID, acknowledged)
	if v.IDOnly || d.Signature == "" {
		return err
	}
	return errors.Join(err, v.dedup().Settle(ctx, signatureKey(d.Signature), acknowledged))
}

// signatureKey is the store key of a verified signature. Its prefix keeps it apart from the
// dispatcher's delivery ids (UUIDs); a request whose id is made to look like one is refused
// anyway, as only verified signatures are ever stored.
func signatureKey(sig string) string { return "x-fluxora-signature:" + sig }

// Claim is check 7 alone: it holds id for the calling request until Settle, failing with 409
// if id was acknowledged or is held by another request, and with 503 if the store fails. It
// does not recognise a captured request resent under a new id (check 8): prefer
// ClaimDelivery. Call Settle exactly once after a nil error.
func (v *Verifier) Claim(ctx context.Context, id string) error {
	err := v.dedup().Claim(ctx, id)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrDuplicate):
		return &Error{Status: http.StatusConflict, Err: fmt.Errorf("%w: %.64q", err, id)}
	default:
		return &Error{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("%w: %w", ErrStore, err)}
	}
}

// Settle ends the claim on id. Pass acknowledged true only when the request was answered
// with a 2xx that reached the sender: then id is remembered and later requests with it get
// 409; otherwise it is released, so the sender's retry is handled again.
func (v *Verifier) Settle(ctx context.Context, id string, acknowledged bool) error {
	return v.dedup().Settle(ctx, id, acknowledged)
}

// key is a secret valid now and its Delivery.Secret number.
type key struct {
	secret []byte
	index  int
}

// keys are the secrets valid at now: Secret, then each Previous still in its grace window.
func (v *Verifier) keys(now time.Time) []key {
	keys := make([]key, 0, 1+len(v.Previous))
	if v.Secret != "" {
		keys = append(keys, key{[]byte(v.Secret), 0})
	}
	for i, p := range v.Previous {
		if p.Secret != "" && now.Before(p.Until) {
			keys = append(keys, key{[]byte(p.Secret), i + 1})
		}
	}
	return keys
}

// requiredHeaders are checked for presence in this order (check 2).
var requiredHeaders = [...]string{sign.HeaderDeliveryID, sign.HeaderTimestamp, sign.HeaderSignature}

// checkHeaders runs checks 1 and 2, the ones that come before the body is read, and returns
// the secrets valid at now. A blank header counts as missing, as in sign.VerifyFluxora.
func (v *Verifier) checkHeaders(h http.Header, now time.Time) ([]key, error) {
	keys := v.keys(now)
	if len(keys) == 0 {
		return nil, &Error{Status: http.StatusInternalServerError, Err: ErrNoSecret}
	}
	for _, name := range requiredHeaders {
		if strings.TrimSpace(h.Get(name)) == "" {
			return nil, &Error{Status: http.StatusUnauthorized, Err: fmt.Errorf("%w %s", ErrMissingHeader, strings.ToLower(name))}
		}
	}
	return keys, nil
}

// checkSignature runs checks 4 to 6 through sign.VerifyFluxora, one secret at a time so as
// to know which one matched. Every secret is tried even after a match, so the time taken
// does not tell which one it was.
func (v *Verifier) checkSignature(h http.Header, body []byte, now time.Time, keys []key) (Delivery, error) {
	matched := -1
	for _, k := range keys {
		err := sign.VerifyFluxora(h, body, now, v.Tolerance, k.secret)
		switch {
		case err == nil:
			if matched < 0 {
				matched = k.index
			}
		case errors.Is(err, ErrSignatureMismatch):
		case errors.Is(err, ErrInvalidTimestamp):
			return Delivery{}, &Error{Status: http.StatusBadRequest, Err: err}
		default: // out of tolerance; checks 1 and 2 have passed already
			return Delivery{}, &Error{Status: http.StatusUnauthorized, Err: err}
		}
	}
	if matched < 0 {
		return Delivery{}, &Error{Status: http.StatusUnauthorized, Err: ErrSignatureMismatch}
	}
	unix, _ := strconv.ParseInt(h.Get(sign.HeaderTimestamp), 10, 64) // valid: VerifyFluxora accepted it
	attempt, _ := strconv.Atoi(h.Get(sign.HeaderAttempt))
	return Delivery{
		ID:        h.Get(sign.HeaderDeliveryID),
		Event:     h.Get(sign.HeaderEvent),
		Timestamp: time.Unix(unix, 0),
		Attempt:   attempt,
		Secret:    matched,
		Body:      body,
		Signature: strings.ToLower(strings.TrimSpace(h.Get(sign.HeaderSignature))), // equals the HMAC: verified
	}, nil
}

func tooLarge(limit int64) error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Err: fmt.Errorf("%w of %d bytes", ErrBodyTooLarge, limit)}
}

func (v *Verifier) maxBody() int64 {
	if v.MaxBody > 0 {
		return v.MaxBody
	}
	return DefaultMaxBody
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

func (v *Verifier) dedup() DedupStore {
	if v.Store != nil {
		return v.Store
	}
	return &v.memory
}
