// Package bench is `fluxhook bench`: the end-to-end benchmark a user runs to see fluxhook's
// throughput, latency and cost on their own machine, next to the performance budget
// (docs/benchmarks.md). It is a package of its own, behind Run, because it is as large as all
// the other commands together and shares nothing with them but the command-line plumbing
// (internal/cli): package main stays the CLI's wiring.
//
// Everything runs side by side on one machine, each part in its own process: PostgreSQL (a
// throwaway cluster, or a fresh database on the server in DATABASE_URL), the consumer (the
// fluxhook binary as `bench internal-consumer`: the verifying receiver, recording arrivals),
// the dispatcher (the binary as `serve`, default configuration, restarted for every workload
// so that its CPU and peak RSS belong to that workload alone), and the producer (the bench's
// own process). So Run must run inside the fluxhook binary: it starts os.Executable() for the
// consumer and the dispatcher. With --baseline river, River tuned runs after each drain, idle
// and steady run, its dispatcher and its producer from riverbaseline, a program the bench
// builds for the run so that River stays out of the fluxhook binary; package produce times
// both producers alike.
package bench
