// Package status reads the report behind `fluxhook status`: is delivery keeping up, and is
// anything stuck? Backlog, leases, retries, deferred rows, dead letters, managed endpoints,
// dispatcher instances and, from the shared Redis, the circuit breakers in trouble.
//
// It lives outside package main so that the command and the management API (internal/api)
// serve one report, read by one piece of code: an operator sees the same numbers from
// `fluxhook status --json` and from the API. Read gathers it; how it is printed is each
// caller's business.
//
// Everything comes from the database (and Redis) alone, in one read-only repeatable-read
// snapshot, so the report works while no dispatcher is running, which is when it is most
// needed. Report's JSON field names are an interface for monitoring scripts: add fields,
// never rename them.
package status
