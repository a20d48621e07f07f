// Package receiver is a development webhook consumer: an http.Handler that verifies every
// request the way REFERENCE.md's "Consumer side" prescribes, in the same order and with the
// same answers, and reports each accepted delivery to a callback.
//
// `fluxhook receive` serves it for people trying fluxhook out; the demo and the end-to-end
// tests serve it to check that every request fluxhook sends is correctly signed. It computes
// the signature itself, independently of the dispatcher's sign stage, so that a bug there
// cannot hide behind the same bug here.
//
// The checks, in order:
//
//  1. a secret is configured (500 otherwise);
//  2. the x-fluxora-delivery-id, x-fluxora-timestamp and x-fluxora-signature headers are
//     present, in that order (401 naming the first missing one);
//  3. the body is at most MaxBody bytes (413);
//  4. the timestamp is a positive decimal integer (400);
//  5. |now − timestamp| ≤ Tolerance, inclusive (401);
//  6. the signature matches one of Secrets, compared in constant time after trimming and
//     lower-casing (401);
//  7. the delivery id has not been acknowledged before (409).
package receiver
