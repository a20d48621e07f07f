// Package outbox is how an application hands fluxhook an event: it writes the event row in
// the application's own transaction.
//
// That is the whole point of a transactional outbox. If the event were published after the
// business write commits, a crash in between would lose it; if it were published before, a
// rollback would announce something that never happened. Writing the row with the same
// pgx.Tx as the business change makes both commit or neither, and fluxhook delivers whatever
// committed, at least once.
//
// Validation happens before anything is sent to the database, so a malformed event fails in
// the producer's code path with an error that says what is wrong (checked with
// errors.Is(err, ErrInvalidEvent)), rather than aborting the caller's transaction or turning
// into a dead letter later.
package outbox
