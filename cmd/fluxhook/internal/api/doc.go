// Package api is fluxhook's management API: the HTTP interface an application uses to manage
// its customers' endpoints and to answer "did my customer get event X, and what did their
// server say?", per tenant, with keys.
//
// It is served by `fluxhook serve` when API_ADDR is set and by `fluxhook api` alone. It reads
// and writes through the stores under sql/ (endpoints, events, apikeys, audit, dead letters),
// never through the dispatcher, which does not import it: the API can be scaled and secured
// apart from the dispatchers, and a slow API request cannot hold up a delivery.
//
// The contract is openapi.json, embedded and served at /v1/openapi.json; the tests validate
// every request and response they make against it, so the document and the code cannot drift.
//
// Isolation: every statement run for a tenant key carries the tenant in its WHERE clause, and
// an object of another tenant is answered 404, exactly as one that does not exist.
package api
