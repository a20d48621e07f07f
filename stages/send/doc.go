// Package send is the stage that makes the HTTP attempt: it POSTs a signed delivery to its
// consumer and turns whatever happens into a delivery.Outcome that settle can act on.
//
// It exists as its own package so that everything fluxhook believes about HTTP lives in one
// place: which URLs may be called (ValidateURL), which answers mean delivered, retry or give
// up (Classify), how long a consumer asked us to wait (ParseRetryAfter), and how one slow
// consumer is kept from starving the others.
//
// Isolation between consumers comes from a per-endpoint limit on requests in flight rather
// than from a queue per endpoint: when an endpoint is at its limit, Send does not wait but
// returns a Release outcome at once, and Saturated lists those endpoints so that the claim can
// leave their rows in the table. A row waiting for a slow consumer therefore never holds a
// pipeline slot that another consumer's row could use.
//
// One http.Transport serves every endpoint, with keep-alive and enough idle connections per
// host to reuse them under load. Redirects are never followed (a 3xx is permanent, as in the
// original dispatcher), response bodies are read up to a small limit and discarded, and
// response headers are bounded, so a hostile or broken consumer can cost us at most one
// request timeout and a few tens of kilobytes.
//
// Send spawns no goroutines of its own: callers run a fixed number of workers that call it,
// and the transport's per-connection goroutines are the only others involved.
package send
