// Package verify is for the teams that receive fluxhook's webhooks: it decides whether a
// request really comes from the dispatcher, is fresh, and is not a delivery already handled,
// and answers the ones that are not with the status the dispatcher expects.
//
// Checks 1 to 7 and their answers are the original Fluxora receiver's (docs/wire-format.md),
// in its order, so that a consumer written against the original answers the same; check 8 is
// fluxhook's addition against replays (see "What the middleware promises"):
//
//  1. a secret is configured, else 500 (the consumer's own misconfiguration);
//  2. the x-fluxora-delivery-id, x-fluxora-timestamp and x-fluxora-signature headers are
//     present, in that order, else 401 naming the first missing one;
//  3. the body is at most MaxBody bytes (256 KiB by default), else 413;
//  4. the timestamp is a positive decimal integer, else 400;
//  5. |now − timestamp| ≤ Tolerance (300 s by default, inclusive), else 401;
//  6. the signature, trimmed and lower-cased, equals the HMAC under the current secret or an
//     unexpired previous one, compared in constant time, else 401;
//  7. the delivery id has not been acknowledged before (nor is being handled right now),
//     else 409;
//  8. the same signed request (the same signature, so the same timestamp and body) has not
//     been acknowledged (nor is being handled) under another delivery id, else 409 with
//     Retry-After: 1.
//
// Checks 1 to 6 are stateless: [Verifier.Verify] runs them on headers and a body the caller
// has already read. Checks 7 and 8 need memory of past deliveries, kept in a [DedupStore]
// ([MemoryStore], bounded, by default); [Verifier.ClaimDelivery] and
// [Verifier.SettleDelivery] run them. [Verifier.Middleware] does all eight around an
// http.Handler: it reads the body with the size limit, answers rejections itself, and hands
// the handler the body (restored, readable again) and the verified [Delivery] (see
// [FromContext]).
//
// # When an id counts as seen
//
// An id is remembered only once the handler has answered it with a 2xx to a client still
// waiting for the answer, because that is exactly when the dispatcher considers the delivery
// done. After a failure status, or when the client gave up (its timeout), the dispatcher
// retries with the same id, and that retry must be handled again rather than refused as a
// duplicate: under the fluxora scheme the dispatcher takes a 409 for "already delivered"
// (WEBHOOK_409_DELIVERED) and would settle as delivered an event the consumer never
// acknowledged. While a request is being handled its id is claimed, so a second request with
// the same id gets 409 at once instead of running the handler twice; the dispatcher recognises
// that answer ("still being handled") and retries it later. It only sends such an overlapping
// retry when the first attempt outlived its timeout (30 s by default): keep handlers well
// under the timeout, queueing slow work.
//
// # What the middleware promises
//
// The fluxora signature covers the timestamp and the body, not the delivery id, so the id
// alone cannot tell a replay from a new delivery: someone who captured a request could resend
// it under fresh ids. Check 8 closes that: the signature is remembered with the id, and the
// same signed request under another id is refused. Every attempt is signed anew, with its own
// timestamp, so the dispatcher's retries and replays are not affected. Together, within the
// tolerance window and while the store remembers both keys:
//
//   - the handler acknowledges a delivery id at most once: a retry of an acknowledged
//     delivery gets 409, which the dispatcher settles as delivered;
//   - the handler acknowledges a signed request (timestamp and body) at most once, whatever
//     id it comes with: a captured request resent under a new id gets 409 ErrReplay;
//   - a delivery the handler did not acknowledge (failure status, panic, client gone) is
//     handled again when the dispatcher retries it.
//
// After the tolerance, check 5 refuses any capture. What the middleware cannot do under this
// scheme is tell which id a request was really sent with: an attacker who captures an attempt
// and gets it to the consumer first, under another id, has it handled under that id, and the
// dispatcher's next attempt of the real id (signed later) is then handled too. Handlers that
// must never process an event twice should deduplicate on an identifier inside the body,
// which the signature covers. Two distinct events with identical bodies, signed in the same
// second, also look like a replay: the second gets 409 with Retry-After, which the dispatcher
// retries (signed at a later second) instead of counting it delivered; consumers that receive
// many identical bodies per second can set [Verifier.IDOnly] and deduplicate on the body.
//
// The store must remember a signature while its timestamp can still pass check 5, up to twice
// the tolerance after it was acknowledged (when the sender's clock is ahead): MemoryStore
// forgets the oldest keys first, so size it for the deliveries of that window (two keys
// each). Under the standard scheme (Standard Webhooks) the id is signed, so deduplicating on
// it is enough there; this package verifies the fluxora scheme only.
//
// # Rotating the secret
//
// Set Secret to the new secret and list the old one in Previous with the end of its grace
// window; after Until it no longer verifies anything, so a forgotten old secret does not stay
// valid for ever. [Delivery].Secret tells which one verified each request, so you can see when
// the sender has switched over.
//
// The HMAC itself is the signer's (sign.VerifyFluxora and sign.FluxoraSignature in
// github.com/fluxora/fluxhook/stages/sign): one definition for both sides of the wire, pinned
// by the vectors in testdata/signatures.json, which were computed apart from the Go code.
package verify
