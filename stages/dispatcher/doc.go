// Package dispatcher assembles the stages into a running webhook dispatcher:
//
//	wake ─► claim ─► prepare (validate, gate, sign) ─► send workers ─► settle
//
// It is the only package that knows every stage; each stage knows only the delivery type and
// its own concern. The pipeline is bounded by Slots: a row holds a slot from the moment it is
// claimed until its outcome is committed, and the claiming loop only claims as many rows as
// there are free slots, so the dispatcher's memory and goroutine count are fixed however large
// the backlog is.
//
// Shutdown is two-phase (Stop): stop claiming, let every claimed row go through send and
// settle, and only when the drain deadline passes cancel the requests still in flight; their
// rows are released and delivered again (at-least-once).
package dispatcher
