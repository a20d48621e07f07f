package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// notifyContext returns a context cancelled by the first SIGINT or SIGTERM, and a channel
// that receives every later one, so that serve can force its drain on a second signal.
func notifyContext() (context.Context, <-chan os.Signal, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	raw := make(chan os.Signal, 4)
	later := make(chan os.Signal, 4)
	signal.Notify(raw, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		first := true
		for {
			select {
			case s := <-raw:
				if first {
					first = false
					cancel()
					continue
				}
				select {
				case later <- s:
				default:
				}
			case <-done:
				return
			}
		}
	}()
	return ctx, later, func() {
		signal.Stop(raw)
		close(done)
		cancel()
	}
}
