package main

import (
	"context"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/bench"
)

func init() {
	commands["bench"] = command{
		summary: "Measure throughput, latency and cost against the performance budget (starts what it needs)",
		run:     runBench,
	}
}

// runBench hands `fluxhook bench` to package bench (internal/bench), with what it may touch of
// the process and the names of serve's settings that it may pass on to its dispatchers.
func runBench(ctx context.Context, env *environment, args []string) error {
	var notSecret []string
	for _, s := range settings {
		if !s.secret {
			notSecret = append(notSecret, s.env)
		}
	}
	return bench.Run(ctx, bench.Env{
		Stdout: env.stdout, Stderr: env.stderr, Getenv: env.getenv, Signals: env.signals,
		ServeVariables: notSecret,
	}, args)
}
