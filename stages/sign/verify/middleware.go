package verify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Middleware puts the eight checks in front of next, so that next sees only verified,
// first-time deliveries: it reads the body (at most MaxBody bytes), answers a rejected
// request itself (ErrorHandler, or WriteError), and calls next with the body restored and
// the Delivery in the request's context (FromContext). The id and the signature are
// remembered when next answers with a 2xx while the client is still there, and released
// otherwise (another status, a panic, a client gone), so that the sender's retry is handled
// again.
func (v *Verifier) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, err := v.verifyRequest(w, r)
		if err == nil {
			err = v.ClaimDelivery(r.Context(), d)
		}
		if err != nil {
			v.reject(w, r, err)
			return
		}

		acknowledged := false
		defer func() {
			// Not the request's context, which ends with the client: the store must
			// still hear about it.
			if err := v.SettleDelivery(context.WithoutCancel(r.Context()), d, acknowledged); err != nil && v.SettleError != nil {
				v.SettleError(r, err)
			}
		}()
		r = r.WithContext(context.WithValue(r.Context(), deliveryKey{}, d))
		r.Body = io.NopCloser(bytes.NewReader(d.Body))
		r.ContentLength = int64(len(d.Body))
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		acknowledged = sw.answered()/100 == 2 && r.Context().Err() == nil
	})
}

// verifyRequest runs checks 1 to 6 on r, reading the body only once the headers passed, and
// never more than the limit.
func (v *Verifier) verifyRequest(w http.ResponseWriter, r *http.Request) (Delivery, error) {
	now := v.now()
	keys, err := v.checkHeaders(r.Header, now)
	if err != nil {
		return Delivery{}, err
	}
	limit := v.maxBody()
	if r.ContentLength > limit {
		return Delivery{}, tooLarge(limit)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if _, over := errors.AsType[*http.MaxBytesError](err); over {
		return Delivery{}, tooLarge(limit)
	}
	if err != nil {
		return Delivery{}, &Error{Status: http.StatusBadRequest, Err: fmt.Errorf("%w: %w", ErrReadBody, err)}
	}
	return v.checkSignature(r.Header, body, now, keys)
}

func (v *Verifier) reject(w http.ResponseWriter, r *http.Request, err error) {
	if v.ErrorHandler != nil {
		setRetryAfter(w, err) // so that a custom answer keeps a genuine twin from being taken for delivered

		v.ErrorHandler(w, r, err)
		return
	}
	WriteError(w, err)
}

// WriteError is the default answer to a rejected request: the error's status and its
// message as plain text, which the dispatcher records with a failed attempt, and for
// ErrReplay a Retry-After header. Custom ErrorHandlers can call it after logging.
func WriteError(w http.ResponseWriter, err error) {
	setRetryAfter(w, err)
	http.Error(w, err.Error(), StatusOf(err))
}

// setRetryAfter marks ErrReplay's 409 as "come back later": the dispatcher reads a fluxora
// 409 as "already delivered" unless it carries Retry-After, and a second, distinct event
// with the same body signed in the same second must be sent again (with a new timestamp),
// not given up. One second is enough for the new timestamp to differ.
func setRetryAfter(w http.ResponseWriter, err error) {
	if errors.Is(err, ErrReplay) {
		w.Header().Set("Retry-After", "1")
	}
}

type deliveryKey struct{}

// FromContext is how a handler behind Middleware gets the verified delivery; ok is false when
// the request did not come through Middleware.
func FromContext(ctx context.Context) (d Delivery, ok bool) {
	d, ok = ctx.Value(deliveryKey{}).(Delivery)
	return d, ok
}

// statusWriter records the status next answers with, to decide whether the id is
// acknowledged. Unwrap keeps http.ResponseController features (deadlines, hijacking)
// available to next.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // 1xx are interim answers
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Flush keeps streaming handlers working through the wrapper.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// answered is the status the client gets: net/http sends 200 for a handler that wrote nothing.
func (w *statusWriter) answered() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}
