// Package verify is for the teams that receive fluxhook's webhooks: it decides whether a
// request really comes from the dispatcher, is fresh, and is not a delivery already handled,
// and answers the ones that are not with the status the dispatcher expects.
//
// The checks and their answers are the original Fluxora receiver's (docs/wire-format.md, "Consumer
// side"), in its order, so that a consumer written against the original answers the same:
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
//     else 409.
//
// Checks 1 to 6 are stateless: [Verifier.Verify] runs them on headers and a body the caller
// has already read. Check 7 needs memory of past deliveries, kept in a [DedupStore]
// ([MemoryStore], bounded, by default); [Verifier.Claim] and [Verifier.Settle] run it.
// [Verifier.Middleware] does all seven around an http.Handler: it reads the body with the size
// limit, answers rejections itself, and hands the handler the body (restored, readable again)
// and the verified [Delivery] (see [FromContext]).
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
// The delivery id is not covered by the signature (only the timestamp and the body are, by the
// wire format), so deduplication protects against the dispatcher's own retries and replays,
// not against someone who captured a request and resends it under a new id; the tolerance
// bounds how long such a capture is usable.
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
