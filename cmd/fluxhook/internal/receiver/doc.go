// Package receiver is a development webhook consumer: an http.Handler that verifies every
// request the way the original receiver does (docs/wire-format.md), in the same order and with the
// same answers, and reports each accepted delivery or rejection to a callback.
//
// `fluxhook receive` serves it for people trying fluxhook out; the demo and the end-to-end
// tests serve it to check that every request fluxhook sends is correctly signed. It is the
// public consumer package, stages/sign/verify, with what a development tool adds: a chosen
// answer status and delay (to watch retries and the circuit breaker), callbacks for printing,
// and a plain list of secrets. The checks, their order and the HMAC are verify's (and through
// it package sign's), so what a consumer team runs and what the demo shows cannot differ.
// The signature itself is pinned by testdata/signatures.json, computed with openssl apart
// from the Go code, so sharing it with the signer does not let a signing bug hide.
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
//  7. the delivery id has not been acknowledged before, nor is being answered right now (409).
package receiver
