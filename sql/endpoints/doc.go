// Package endpoints reads and writes webhook_endpoints: the consumers fluxhook fans events out
// to, each with its own URL, secret, event filter, tenant and lifecycle.
//
// The table is meant to be managed with plain SQL as well as with `fluxhook endpoints`, so
// everything here is an ordinary row: a secret is stored in clear unless
// WEBHOOK_ENCRYPTION_KEY is set, in which case this package seals it with AES-256-GCM
// ("enc:v1:<base64 of nonce and ciphertext>") and only a holder of the key can read it back. A
// secret inserted in clear by SQL still works; the dispatcher reads both forms.
package endpoints
