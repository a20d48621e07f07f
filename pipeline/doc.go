// Package pipeline is fluxhook's generic staged runtime. It knows nothing about webhooks.
//
// Group owns a pipeline's long-lived goroutines in three roles: sources that take work in,
// stages (fixed pools of workers) that pass it on through the caller's bounded channels, and
// one sink that finishes it. Its Stop is the two-phase shutdown: stop the sources and let
// what was taken drain through every stage, each stage's output closed once its workers have
// returned; if the caller's deadline passes first, cancel the stages' blocking work, give the
// sink a bounded time to finish what comes back, and only then cancel the sink.
//
// Slots is the capacity from taking an item to finishing it: a source takes only as many
// items as are free, so a burst of events never becomes a burst of goroutines or of memory.
// Signal coalesces wake-ups; Batch and BatchUntil batch a sink's input naturally. None of
// them adds a goroutine or an allocation per item.
package pipeline
