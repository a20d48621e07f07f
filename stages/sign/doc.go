// Package sign turns a claimed delivery into the exact request headers a consumer checks
// before it trusts the body.
//
// Signing is the contract with consumers: they authenticate every webhook by recomputing the
// HMAC over what they received, so the headers and the signed bytes must match the original
// Fluxora dispatcher byte for byte (docs/wire-format.md). A change here that looks
// harmless on our side (another separator, upper-case hex, a body re-serialised on retry) makes
// every consumer reject every delivery. The test vectors in testdata/signatures.json pin the
// format down; the same file feeds the fuzz corpus.
//
// Two schemes are offered. Fluxora (the default) is the original's: x-fluxora-* headers and a
// hex HMAC-SHA256 over "timestamp.body". Standard follows Standard Webhooks (webhook-id,
// webhook-timestamp, webhook-signature over "id.timestamp.body"), so consumers can use an
// off-the-shelf verifier; during a secret rotation it sends one signature per key, which
// that scheme allows and the Fluxora header does not.
//
// Signing sits on the hot path of every delivery, so a Signer derives its HMAC keys once, in
// New, and reuses keyed hashes from a pool: no per-request key setup, and a handful of small
// allocations per request (the header map and its values). The consumer side, VerifyFluxora,
// lives here too, so that signer and verifier cannot drift apart.
package sign
