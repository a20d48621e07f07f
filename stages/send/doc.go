// Package send is the stage that makes the HTTP attempt: it POSTs a signed delivery to its
// consumer and turns whatever happens into a delivery.Outcome that settle can act on.
//
// It exists as its own package so that everything fluxhook believes about HTTP lives in one
// place: which URLs may be called (ValidateURL), which answers mean delivered, retry or give
// up (Classify), how long a consumer asked us to wait (ParseRetryAfter), and how one slow
// consumer is kept from starving the others.
//
// Isolation between consumers comes from a per-endpoint limit on requests in flight rather
// than from a queue per endpoint: when an endpoint is at its limit, Send waits only briefly
// (SaturatedWait) for a slot and otherwise returns a Release outcome, and Saturated lists the
// endpoints whose waiting requests would not get a slot in time at the rate they have been
// finishing, so that the claim can leave their rows in the table. A row waiting for a slow
// consumer therefore never holds a pipeline slot for long that another consumer's row could
// use, while a fast consumer at its limit keeps getting rows.
//
// One http.Transport serves every endpoint, with keep-alive and enough idle connections per
// host to reuse them under load. Redirects are never followed (a 3xx is an answer like any
// other non-2xx, retried on the schedule), response bodies are read up to a small limit and discarded, and
// response headers are bounded, so a hostile or broken consumer can cost us at most one
// request timeout and a few tens of kilobytes.
//
// The Transport dials through an SSRF guard (guard.go). A URL whose host is localhost, a name
// under it (RFC 6761) or a loopback IP reaches loopback without any lookup. Any other host is
// resolved with Config.Resolver when a connection is dialled, every address is classified,
// and only permitted ones are dialled, by IP, so that a second DNS answer cannot swap the address
// (TLS still verifies the URL's host name). Refused are: private (10/8, 172.16/12,
// 192.168/16, fc00::/7), loopback, link-local (169.254/16, fe80::/10) and the cloud metadata
// addresses, shared CGNAT space (100.64/10), IETF protocol assignments, documentation and
// benchmarking ranges, reserved (240/4) and deprecated or tunnelling IPv6 forms (IPv4-
// compatible, Teredo, site-local), and, with no way to allow them, unspecified, multicast and
// broadcast addresses; IPv4-mapped, NAT64 and 6to4 addresses are judged by the IPv4 address
// they carry. Config.AllowedNetworks (WEBHOOK_ALLOWED_NETWORKS) allows the others for the URLs
// the operator configured (WEBHOOK_URL, managed endpoints). A row's endpoint_url is written by a
// producer, and a restricted managed endpoint's URL by a tenant, so they are dialled by a
// transport of their own under Config.RowURLNetworks (WEBHOOK_ROW_URL_NETWORKS) alone, without
// the loopback allowance of a URL naming localhost: by default they reach public addresses
// only (see delivery.Endpoint.RowURL). A refusal
// makes no connection and is a Permanent outcome whose reason names the address and the
// setting: it is a policy decision only the operator can change, and after they do, the dead
// letter can be replayed. A failed lookup is a Retry, since names do come back. The base
// net.Dialer's Control hook checks the same policy on each socket before connect(2), as
// defence in depth.
//
// Send spawns no goroutines of its own: callers run a fixed number of workers that call it,
// and the transport's per-connection goroutines are the only others involved.
package send
