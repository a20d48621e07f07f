package main

import "github.com/fluxora/fluxhook/cmd/fluxhook/internal/status"

// The report's types moved to internal/status; these are the names package main's status
// tests decode `fluxhook status --json` into, kept so that the tests that hold the command's
// output to its old behaviour read exactly as they did before the move.
type (
	statusReport     = status.Report
	deadLetterReason = status.DeadLetterReason
	breakerStatus    = status.Breaker
)
