// Package deadletters reads, replays, purges and recovers webhook_dead_letter: the events
// fluxhook gave up on (attempts exhausted, a permanent answer, an invalid row), kept until
// someone deals with them.
//
// It is the one implementation behind `fluxhook dlq list|show|replay|purge` and the management
// API's dead-letter routes, so that a replay means the same thing from either: the same
// delivery id as a new first attempt, never twice for one dead letter unless forced, never
// across tenants, an ordered stream's event back in its place.
//
// Every function takes the caller's tenant as a scope: nil for an operator or an admin key,
// who see every tenant; a tenant's name for a tenant's key, which then sees that tenant's rows
// only. The scope is a condition of the SQL itself, not a check made afterwards, and another
// tenant's row is reported exactly as a missing one (ErrNotFound), so that an id guessed
// across tenants tells nothing.
//
// A recovery (StartRecovery, RunRecovery, GetRecovery, ResumeStale) replays every dead letter
// of an endpoint since a time as a background job with progress, in batches of one
// transaction each. Safe to run twice: each batch goes through Replay, which skips what was
// replayed already under the rows' locks.
//
// The functions write no audit records: their callers do, knowing who asked.
//
// The statements are in queries/, one file each. Those taking a Filter are templates
// (queries/filter.sql) that write only the conditions of the fields set, so that each shape
// of filter gets a plan that uses its indexes.
package deadletters
