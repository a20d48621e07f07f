// Package endpoints reads and writes webhook_endpoints: the consumers fluxhook fans events out
// to, each with its own URL, secret, event filter, tenant and lifecycle.
//
// The table is meant to be managed with plain SQL as well as with `fluxhook endpoints`, so
// everything here is an ordinary row: a secret or custom header value is stored in clear
// unless WEBHOOK_ENCRYPTION_KEY is set, in which case this package seals it with AES-256-GCM
// ("enc:v2:<base64 of nonce and ciphertext>") and only a holder of the key can read it back. A
// sealed value is bound, through GCM's additional data, to its endpoint and field (see
// Binding), so that SQL copying it elsewhere does not make it usable there. A value inserted
// in clear by SQL still works, and so does a secret sealed by an older version ("enc:v1:",
// unbound) until Reseal binds it; the dispatcher reads every form.
package endpoints
