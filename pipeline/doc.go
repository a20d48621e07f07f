// Package pipeline is fluxhook's generic staged runtime: capacity that drives claiming,
// coalescing wake-up signals, fixed worker pools and size-or-time batching, with a two-phase
// shutdown (stop taking work, drain what is in flight, then cancel).
//
// It knows nothing about webhooks. Every concurrent piece is a fixed set of long-lived
// goroutines connected by bounded channels: the work in flight is bounded by Slots, so a
// burst of events never becomes a burst of goroutines or of memory.
package pipeline
