// Package settle writes the outcomes of attempts back to the outbox: one statement per batch
// moves settled rows out of the queue into the delivery log with their outcome, inserts the next attempt of retryable failures
// (with backoff and jitter), inserts dead letters, moves deferred rows' due time in place and
// shortens the lease of rows that were not attempted.
//
// Every write is fenced by the claim that leased the row (its instance and lease token): an
// outcome that arrives after the lease ran out and another claim took the row is refused and
// marked Stale, so only the current holder's outcome is ever written.
//
// A batch is all-or-nothing in the database, but a bad row must never hold the others back:
// when the batch statement fails, each row is settled on its own, and a row that still fails
// is dead-lettered with the error as its reason. That includes a row that was delivered: its
// reason says so, because the alternative, leaving it leased, would send it again after every
// lease, forever. A row the database refuses even as a dead letter is left leased (counted in
// Result.Unsettled) and the rest of the batch still settles. Only when the database itself is
// unreachable do rows stay unsettled; their lease then expires and they are delivered again
// (at-least-once), never lost.
package settle

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/stages/delivery"
)

var (
	//go:embed settle.sql
	settleSQL string
	//go:embed dead_letter.sql
	deadLetterSQL string
	//go:embed resume.sql
	resumeSQL string
	//go:embed dead_letter_endpoint.sql
	deadLetterEndpointSQL string
	//go:embed anchored.sql
	anchoredSQL string
)

// DefaultSchedule is the wait before each retry: about two days in all, like the peers that
// retry for one to eight days, where the original gave up after about 30 s.
var DefaultSchedule = []time.Duration{
	5 * time.Second, time.Minute, 5 * time.Minute, 30 * time.Minute,
	2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// DefaultJitter spreads retries of events that failed together by ±20%.
const DefaultJitter = 0.2

// Config configures a Settler.
type Config struct {
	// Schedule is the wait before retry n (Schedule[n-1]); its length is the number of
	// retries, so an event gets len(Schedule)+1 attempts. Nil means DefaultSchedule.
	Schedule []time.Duration
	// Jitter is the fraction by which each wait is randomly lengthened or shortened.
	// Zero means DefaultJitter; negative means none (tests).
	Jitter float64
	// InstanceID fences every settle, with each row's lease token: a row is only written by
	// the claim that leased it.
	InstanceID string
}

// Settler writes outcomes.
type Settler struct {
	pool     *pgxpool.Pool
	schedule []time.Duration
	maxStep  time.Duration
	jitter   float64
	instance string
}

// New returns a Settler writing through pool.
func New(pool *pgxpool.Pool, cfg Config) *Settler {
	s := &Settler{pool: pool, schedule: cfg.Schedule, jitter: cfg.Jitter, instance: cfg.InstanceID}
	if s.schedule == nil {
		s.schedule = DefaultSchedule
	}
	if s.jitter == 0 {
		s.jitter = DefaultJitter
	}
	if s.jitter < 0 {
		s.jitter = 0
	}
	for _, d := range s.schedule {
		s.maxStep = max(s.maxStep, d)
	}
	return s
}

// Result counts what one Settle call wrote.
type Result struct {
	// Settled counts rows moved to the delivery log (delivered, retried, dead-lettered); Requeued the
	// retry rows inserted; Deferred the rows whose due time moved; Released the leases
	// shortened.
	Settled, Requeued, DeadLettered, Deferred, Released int
	// Unparked counts the ordered rows parked behind a head this batch delivered or
	// dead-lettered that came due with it (settle.sql's successor): the stream's next row,
	// which a claim should look for now.
	Unparked int
	// Stale is the number of outcomes refused because the row's lease was no longer theirs
	// (their Outcome.Stale is set).
	Stale int
	// Fallback is the number of rows settled one by one after the batch statement failed.
	Fallback int
	// Unsettled is the number of rows of the fallback that the database refused both to
	// settle and to dead-letter: they stay leased and come back after their lease. Their
	// Outcome is marked Unsettled, with both errors in its Reason.
	Unsettled int
}

// columns are the destinations of the settle statements' one result row, in its order, the
// ids of the rows written going to written.
func (r *Result) columns(written *[]int64) []any {
	return []any{&r.Settled, &r.Requeued, &r.DeadLettered, &r.Deferred, &r.Released, &r.Unparked, written}
}

// Settle writes the outcomes of batch. Rows whose Outcome is Retry are turned into a retry or,
// when the schedule is exhausted, a dead letter; the row's Outcome is updated to say which,
// so that callers (logs, the gate) see the final decision. It returns an error only when
// rows could not be settled at all (their leases will expire and they will be re-delivered).
func (s *Settler) Settle(ctx context.Context, batch []*delivery.Delivery) (Result, error) {
	return s.settle(ctx, batch, true)
}

// SettleRefused settles batch after the database refused its batch statement with err where
// Settle did not run it (sent in a pipeline with a claim): a lock timeout goes straight to
// settling around the locked rows, without waiting for them once more; any other error
// settles as Settle does.
func (s *Settler) SettleRefused(ctx context.Context, batch []*delivery.Delivery, err error) (Result, error) {
	if fluxsql.IsLockTimeout(err) {
		return s.settleAround(ctx, batch, err)
	}
	return s.Settle(ctx, batch)
}

// settle runs the batch statement for batch, and on a refusal settles around the rows locked
// elsewhere (when around is set and the refusal was a lock timeout) or row by row.
func (s *Settler) settle(ctx context.Context, batch []*delivery.Delivery, around bool) (Result, error) {
	if len(batch) == 0 {
		return Result{}, nil
	}
	var r Result
	var written []int64
	sql, args := s.statement(batch)
	err := s.pool.QueryRow(ctx, sql, args...).Scan(r.columns(&written)...)
	if err == nil {
		r.Stale = markStale(batch, written)
		return r, nil
	}
	if !isStatementError(err) || len(batch) == 1 && ctx.Err() != nil {
		return Result{}, fmt.Errorf("settle: %w", err)
	}
	if around && fluxsql.IsLockTimeout(err) {
		return s.settleAround(ctx, batch, err)
	}
	// The batch was rejected by the database because of (probably) one row: settle each row
	// on its own so the bad one cannot hold back the rest.
	return s.settleEach(ctx, batch, err)
}

// settleAround settles batch, whose statement waited its lock_timeout for a row that a session
// outside fluxhook holds (settle.sql), without waiting for any locked row again: one look
// finds the rows locked now, which are left to their lease (Unsettled, the reason naming the
// session), and the others are settled as a batch. Waiting a second for each locked row in
// turn held every settle of the instance for as many seconds as the session held rows, long
// enough for unrelated rows' leases to run out.
func (s *Settler) settleAround(ctx context.Context, batch []*delivery.Delivery, cause error) (Result, error) {
	ids := make([]int64, len(batch))
	for i, d := range batch {
		ids[i] = d.ID
	}
	locked, err := fluxsql.LockedOutboxRows(ctx, s.pool, ids)
	if err != nil || len(locked) == 0 {
		// The look failed, or the lock is gone already: row by row, as for any refusal.
		return s.settleEach(ctx, batch, cause)
	}
	var total Result
	rest := make([]*delivery.Delivery, 0, len(batch)-len(locked))
	for _, d := range batch {
		if !locked[d.ID] {
			rest = append(rest, d)
			continue
		}
		s.leaveLocked(ctx, d, cause)
		total.Unsettled++
	}
	r, err := s.settle(ctx, rest, false)
	r.Unsettled += total.Unsettled
	return r, err
}

// Queue adds the batch statement Settle would run to b (deciding each row's outcome as Settle
// does), so that it can share a round trip with other statements; *r holds its counts once
// the batch has run. There is no row-by-row fallback here: statements of one pgx.Batch run in
// one implicit transaction, and a failure undoes them all (BenchmarkSettleThenClaim in
// stages/claim measures what sharing the round trip would save).
func (s *Settler) Queue(b *pgx.Batch, batch []*delivery.Delivery, r *Result) {
	sql, args := s.statement(batch)
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		var written []int64
		if err := row.Scan(r.columns(&written)...); err != nil {
			return err
		}
		r.Stale = markStale(batch, written)
		return nil
	})
}

// Statement returns the batch statement Settle would run for batch (deciding each row's
// outcome as Settle does), its arguments, and the function that reads its result, for a caller
// that sends it in a pipeline of its own. There is no row-by-row fallback there: after an error
// the caller settles the batch again with Settle, which has one.
func (s *Settler) Statement(batch []*delivery.Delivery) (string, []any, func(pgx.Rows) (Result, error)) {
	sql, args := s.statement(batch)
	return sql, args, func(rows pgx.Rows) (Result, error) {
		defer rows.Close()
		var r Result
		var written []int64
		if !rows.Next() {
			rows.Close()
			return Result{}, cmpOr(rows.Err(), errors.New("settle: the statement returned no row"))
		}
		if err := rows.Scan(r.columns(&written)...); err != nil {
			return Result{}, err
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return Result{}, err
		}
		r.Stale = markStale(batch, written)
		return r, nil
	}
}

// cmpOr returns err when it is not nil, else otherwise.
func cmpOr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// markStale marks the outcome of every row of batch that the statement did not write (its
// id is not in written) as stale, and returns how many there were.
func markStale(batch []*delivery.Delivery, written []int64) int {
	if len(written) == len(batch) {
		return 0 // every row written: the common case costs no lookup
	}
	wrote := make(map[int64]bool, len(written))
	for _, id := range written {
		wrote[id] = true
	}
	n := 0
	for _, d := range batch {
		if !wrote[d.ID] {
			d.Outcome.Stale = true
			n++
		}
	}
	return n
}

// settleDeliveredSQL is settle.sql up to its delivered:end marker (the fenced DELETE and the
// log row) with the other kinds' counts 0, for a batch whose every outcome is a delivery, the
// common case. PostgreSQL sets up every data-modifying CTE of a statement on each execution,
// whether or not a row reaches it, and under live traffic a batch is one or two delivered
// rows: with this statement for them, PostgreSQL's CPU per event at 1,000 events/s went from
// 583–603 µs to 535–539 (`fluxhook bench --workload steady --rate 1000`). Only kind 1 is
// written: a row of another kind sent here by mistake is reported stale and comes back with
// its lease, never deleted without its retry or dead letter.
var settleDeliveredSQL = func() string {
	const marker = "-- delivered:end"
	end := strings.Index(settleSQL, marker)
	const kinds = "i.kind IN (1, 2, 3)"
	if end < 0 || strings.Count(settleSQL[:end], kinds) != 1 {
		panic("fluxhook: settle.sql lost its delivered:end marker or its settled kinds")
	}
	return strings.Replace(settleSQL[:end], kinds, "i.kind = 1", 1) +
		")\nSELECT (SELECT count(*) FROM settled), 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, ARRAY(SELECT id FROM settled)\n"
}()

// settleDeliveredOrderedSQL is settleDeliveredSQL with settle.sql's successor part, for a batch
// of deliveries alone of which some are ordered: a delivered head lets the row parked behind
// it go. The full statement did that at twice the cost (4-row batches: 272 µs a settle
// unordered, 532 µs ordered).
var settleDeliveredOrderedSQL = func() string {
	begin := strings.Index(settleSQL, "-- successor:begin")
	end := strings.Index(settleSQL, "-- successor:end")
	if begin < 0 || end < begin {
		panic("fluxhook: settle.sql lost its successor markers")
	}
	prefix := settleDeliveredSQL[:strings.LastIndex(settleDeliveredSQL, ")\nSELECT ")]
	return prefix + "), successor AS (\n" + settleSQL[begin:end] + ")\n" +
		"SELECT (SELECT count(*) FROM settled), 0::bigint, 0::bigint, 0::bigint, 0::bigint, " +
		"(SELECT count(*) FROM successor), ARRAY(SELECT id FROM settled)\n"
}()

// statement decides each row's outcome and returns the batch statement and its arguments:
// settleDeliveredSQL when every row was delivered (the common case, at a fraction of the
// server's work), settleDeliveredOrderedSQL when some of them are ordered (a delivered head
// lets the next row of its stream go), settle.sql otherwise.
func (s *Settler) statement(batch []*delivery.Delivery) (string, []any) {
	args := s.args(batch)
	ordered := false
	for _, d := range batch {
		if d.Outcome.Kind != delivery.Delivered {
			return settleSQL, args
		}
		ordered = ordered || d.OrderKey != 0
	}
	if ordered {
		return settleDeliveredOrderedSQL, args
	}
	return settleDeliveredSQL, args
}

// args decides each row's outcome and returns the batch statement's arguments: one array per
// column, a row per element.
func (s *Settler) args(batch []*delivery.Delivery) []any {
	for _, d := range batch {
		s.decide(d)
	}
	return s.columns(batch)
}

// columns returns the batch statement's arguments for outcomes already decided.
func (s *Settler) columns(batch []*delivery.Delivery) []any {
	n := len(batch)
	ids := make([]int64, n)
	kinds := make([]int16, n)
	statuses := make([]int32, n)
	errs := make([]string, n)
	durations := make([]int32, n)
	delays := make([]int64, n)
	reasons := make([]string, n)
	tokens := make([]int64, n)
	orderKeys := make([]int64, n)
	excerpts := make(pgtype.FlatArray[*string], n)
	for i, d := range batch {
		o := d.Outcome
		ids[i] = d.ID
		kinds[i] = int16(o.Kind)
		if o.Kind == delivery.Permanent && d.StopStream && d.OrderKey != 0 {
			kinds[i] = stopKind
		}
		orderKeys[i] = d.OrderKey
		statuses[i] = int32(o.Status)
		errs[i] = o.Error
		durations[i] = int32(o.Duration.Milliseconds())
		delays[i] = o.Delay.Milliseconds()
		reasons[i] = o.Reason
		tokens[i] = d.LeaseToken
		excerpts[i] = excerpt(&d.Outcome)
	}
	return []any{ids, kinds, statuses, errs, durations, delays, reasons, s.instance, tokens, orderKeys, excerpts}
}

// excerpt is o's Excerpt as a nullable text: nil, which pgx sends as NULL, when none was kept
// (o.Excerpted false). A pointer into o rather than a copy of the string; collected in a
// pgtype.FlatArray, which pgx walks without reflection (a []*string would take its reflection
// path). o outlives the statement, and settle does not change o.Excerpt meanwhile.
func excerpt(o *delivery.Outcome) *string {
	if !o.Excerpted {
		return nil
	}
	return &o.Excerpt
}

// stopKind is settle.sql's kind for the dead letter of an ordered row whose consumer stops
// the stream (delivery.Delivery.StopStream): the row stays, parked, in front of its stream.
const stopKind = 6

// decide turns a Retry outcome into the next attempt's delay or, after the last scheduled
// retry, a dead letter. It also fills in dead-letter reasons for Permanent outcomes.
func (s *Settler) decide(d *delivery.Delivery) {
	s.decideKind(d)
	// An ordered stream that skips its dead letters moves on: the dead letter says so.
	if o := &d.Outcome; o.Kind == delivery.Permanent && d.OrderKey != 0 && !d.StopStream &&
		!strings.HasSuffix(o.Reason, skippedSuffix) {
		o.Reason += "; skipped in stream " + strconv.Quote(d.StreamID) + skippedSuffix
	}
}

// skippedSuffix ends the reason of an ordered delivery dead-lettered by a consumer whose
// streams skip their dead letters (ordering_failure 'skip').
const skippedSuffix = "'s order: its later events went on"

// decideKind is decide without the ordered stream's note.
func (s *Settler) decideKind(d *delivery.Delivery) {
	o := &d.Outcome
	switch o.Kind {
	case delivery.Retry:
		if d.Attempt > len(s.schedule) {
			o.Kind = delivery.Permanent
			o.Reason = fmt.Sprintf("attempts exhausted after %d attempts; last: %s", d.Attempt, describe(*o))
			return
		}
		o.Delay = s.Backoff(d.Attempt, o.Delay)
	case delivery.Permanent:
		if o.Reason == "" {
			o.Reason = "permanent failure: " + describe(*o)
		}

	case delivery.Undecided:
		// A stage forgot to decide: never lose the row, retry it soon without using an attempt.
		o.Kind = delivery.Release
		o.Delay = time.Second
	}
}

// Resumption says which deferred rows Resume brings forward, and to when.
type Resumption struct {
	// Keys are the claim keys (delivery.Endpoint.Key) of every endpoint sharing the breaker:
	// rows without an endpoint_url and rows naming the configured URL share one.
	Keys []string
	// Reasons are the deferral reasons to bring forward.
	Reasons []string
	// In is how long from now the rows come due; a row due sooner keeps its time.
	In time.Duration
	// Limit brings forward at most this many rows, soonest due first; 0: all of them.
	Limit int
	// Reason is the deferral reason the rows keep; "" clears it (due now, nothing held them).
	Reason string
}

// Resume brings the rows r names forward and returns how many there were. The dispatcher
// calls it when a half-open probe ends: after a success, rows held behind the breaker need not
// wait out the delay the gate gave them (all of them, due now); after a probe that did not
// close the circuit, one of them must be there to probe when the next probe may go, instead
// of every row waiting for the ended probe's expiry (one row, whatever the backlog).
func (s *Settler) Resume(ctx context.Context, r Resumption) (int64, error) {
	tag, err := s.pool.Exec(ctx, resumeSQL, r.Keys, r.Reasons, max(r.In, 0).Milliseconds(), r.Limit, r.Reason)
	if err != nil {
		return 0, fmt.Errorf("resuming deferred rows: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeadLetterEndpoint moves the pending deliveries of the managed endpoint id that no live
// lease holds to the dead-letter table with reason, and returns how many it moved. The
// dispatcher calls it when an endpoint is disabled: its deliveries wait there, replayable once
// it is enabled again, instead of retrying against a consumer that is gone.
func (s *Settler) DeadLetterEndpoint(ctx context.Context, id, reason string) (int64, error) {
	tag, err := s.pool.Exec(ctx, deadLetterEndpointSQL, id, reason)
	if err != nil {
		return 0, fmt.Errorf("dead-lettering endpoint %s's deliveries: %w", id, err)
	}
	return tag.RowsAffected(), nil
}

// Backoff is the wait before the attempt after attempt (1-based), jittered, lengthened to
// retryAfter when the consumer asked for more (Retry-After), capped at the schedule's largest
// step so a consumer cannot push an event past the horizon.
func (s *Settler) Backoff(attempt int, retryAfter time.Duration) time.Duration {
	base := s.schedule[min(attempt, len(s.schedule))-1]
	wait := base
	if s.jitter > 0 {
		wait = time.Duration(float64(base) * (1 + s.jitter*(2*rand.Float64()-1)))
	}
	if retryAfter > wait {
		wait = min(retryAfter, s.maxStep)
	}
	return wait
}

func describe(o delivery.Outcome) string {
	switch {
	case o.Error != "":
		return o.Error
	case o.Status != 0:
		return fmt.Sprintf("HTTP %d", o.Status)
	default:
		return "no response"
	}
}

// isStatementError reports whether err came from the database rejecting the statement (as
// opposed to the connection failing), the case where settling rows one by one can help. A
// server that reports its own connection ending (class 08, or 57: shut down, terminated by an
// administrator) rejected nothing about the rows: that is a connection failure, returned as
// an error, and the rows come back through their leases.
func isStatementError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch code := pgErr.Code; {
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "57"):
		return false
	}
	return true
}

// isRowError reports whether err is about the data of the row itself: a data exception
// (class 22), an integrity constraint (23) or an error raised by a PL/pgSQL trigger the
// operator added (P0). Only such errors justify dead-lettering a row in the fallback. Every
// other error (permissions, serialization failures, a server shutting down) is transient or
// about the whole database: the row must come back through its lease, not be dead-lettered,
// or an event that a permission glitch hit between two statements would be lost to the
// dead-letter table.
func isRowError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "P0":
		return true
	}
	return false
}

// leaveLocked leaves d, whose row a session outside fluxhook holds (settle.sql), to its lease:
// it is delivered again once that session lets it go, and the reason, which the log carries,
// names the session.
func (s *Settler) leaveLocked(ctx context.Context, d *delivery.Delivery, cause error) {
	d.Outcome.Unsettled = true
	d.Outcome.Reason = "the row was locked by another session for over a second" + s.lockHolder(ctx, d.ID) + ": " + cause.Error()
}

// lockHolder names, as " (held by pid N, ...)", the session whose transaction holds row id
// locked, so that the operator reading the log knows which session to end; "" when it cannot
// be told (the lock is gone, or shared by several: the row's xmax is then a multixact). A role
// without pg_read_all_stats still sees another session's pid, user and application name.
func (s *Settler) lockHolder(ctx context.Context, id int64) string {
	var pid int32
	var user, app, since string
	err := s.pool.QueryRow(ctx, `
		SELECT a.pid, coalesce(a.usename::text, ''), coalesce(a.application_name, ''),
		       coalesce(pg_catalog.to_char(a.xact_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), '')
		FROM webhook_outbox o
		JOIN pg_catalog.pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = o.xmax AND l.granted
		JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
		WHERE o.id = $1 AND l.mode = 'ExclusiveLock'
		LIMIT 1`, id).Scan(&pid, &user, &app, &since)
	if err != nil {
		return ""
	}
	out := fmt.Sprintf(" (held by pid %d, user %q, application %q", pid, user, app)
	if since != "" {
		out += ", in a transaction since " + since
	}
	return out + ")"
}

// isEncodingError reports whether err is the database refusing text it cannot store in its
// encoding (character_not_in_repertoire, which invalid byte sequences raise too, and
// untranslatable_character): what a consumer's answer, valid UTF-8, can still cause in a
// database that is not UTF-8, on a connection whose client_encoding is UTF8.
func isEncodingError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "22021", "22P05":
		return true
	}
	return false
}

// settleEach settles the rows of a rejected batch one at a time. A row error (see isRowError)
// only ever affects its own row: the loop goes on to the next row whatever the row's kind, so
// one bad row can neither hold back nor roll back the others. Any other error is about the
// database, not the row, so the remaining rows are left to their leases rather than tried
// one by one against a database that is failing.
func (s *Settler) settleEach(ctx context.Context, batch []*delivery.Delivery, batchErr error) (Result, error) {
	var total Result
	for _, d := range batch {
		var r Result
		var written []int64
		one := []*delivery.Delivery{d}
		err := s.pool.QueryRow(ctx, settleSQL, s.columns(one)...).Scan(r.columns(&written)...)
		if d.Outcome.Excerpt != "" && isEncodingError(err) {
			// The consumer's answer is kept at best: text the database cannot store (a
			// character its encoding lacks, in a database that is not UTF-8) must not cost
			// the row its settle, nor a delivered row a dead letter.
			d.Outcome.Excerpt = ""
			d.Outcome.Excerpted = false
			err = s.pool.QueryRow(ctx, settleSQL, s.columns(one)...).Scan(r.columns(&written)...)
		}
		switch {
		case err == nil:
			r.Stale = markStale(one, written)
		case fluxsql.IsLockTimeout(err):
			s.leaveLocked(ctx, d, err)
			r = Result{Unsettled: 1}
		default:
			if !isRowError(err) {
				return total, fmt.Errorf("settle: %w (after the batch failed: %v)", err, batchErr)
			}
			if r, err = s.deadLetter(ctx, d, err); err != nil {
				return total, err
			}
		}
		total.Settled += r.Settled
		total.Requeued += r.Requeued
		total.DeadLettered += r.DeadLettered
		total.Deferred += r.Deferred
		total.Released += r.Released
		total.Unparked += r.Unparked
		total.Stale += r.Stale
		total.Unsettled += r.Unsettled
		total.Fallback++
	}
	return total, nil
}

// deadLetter is the last resort for a row whose own settlement failed with rowErr. A delivered
// row is dead-lettered too, with a reason that says the consumer has it (a replay would be a
// duplicate, which consumers deduplicate on the delivery id): left leased instead, it would be
// sent again after every lease and fail again, forever. If the database refuses the dead
// letter as well (a trigger that rejects every update of the row), the row is counted as
// unsettled and left to its lease; only an error about the database itself is returned.
func (s *Settler) deadLetter(ctx context.Context, d *delivery.Delivery, rowErr error) (Result, error) {
	o := d.Outcome
	// Every reason starts "settle failed" so that the metrics file it under that class.
	reason := "settle failed: " + rowErr.Error()
	if o.Kind == delivery.Delivered {
		reason = fmt.Sprintf("settle failed: delivered (HTTP %d) but could not be settled: %v", o.Status, rowErr)
	}
	tag, err := s.pool.Exec(ctx, deadLetterSQL, d.ID, reason, o.Status, o.Error, s.instance, d.LeaseToken, excerpt(&o))
	if err != nil {
		if isRowError(err) {
			// The outcome keeps its Kind (what the attempt told about the endpoint, which the
			// breaker still learns) and says it was not written.
			d.Outcome.Unsettled = true
			d.Outcome.Reason = fmt.Sprintf("settle and dead letter refused: %v; then %v", rowErr, err)
			return Result{Unsettled: 1}, nil
		}
		return Result{}, fmt.Errorf("settle: dead-lettering row %d: %w", d.ID, err)
	}
	if tag.RowsAffected() == 0 {
		// The lease is no longer this attempt's: the current holder settles the row.
		d.Outcome.Stale = true
		return Result{Stale: 1}, nil
	}
	d.Outcome.Kind = delivery.Permanent
	d.Outcome.Reason = reason
	return Result{Settled: 1, DeadLettered: 1}, nil
}

// Anchored is one event routed in memory whose first deliveries came back (see anchored.sql):
// its row in the queue, still leased by the claim that took it, is the only record of its
// deliveries until SettleAnchored replaces it.
type Anchored struct {
	// EventID and LeaseToken are the event row's id and its claim's token (the fence).
	EventID, LeaseToken int64
	// NewToken leases the event's new delivery rows; unique per event of one call.
	NewToken int64
	// Endpoints is how many endpoints the event went to (its log row says so).
	Endpoints int
	// Delivered are this batch's delivered deliveries of the event, which go to the log.
	Delivered []*delivery.Delivery
	// Rows are the endpoint ids of its deliveries that become rows of the queue: those that
	// came back with another outcome and those still in flight.
	Rows []string
}

// AnchoredResult is what SettleAnchored wrote.
type AnchoredResult struct {
	// Written holds the NewToken of each event written; the others' leases were lost, or
	// (Failed) the database refused them.
	Written map[int64]bool
	// AsRows holds the NewToken of each written event whose deliveries all became rows,
	// delivered ones included, because logging them was refused (see SettleAnchored): the
	// caller settles those through Settle like the others.
	AsRows map[int64]bool
	// Failed holds, by NewToken, the events the database refused even as rows alone: they
	// stay leased and come back, whole, after their lease.
	Failed map[int64]error
	// Rows maps each new delivery row, by its event's NewToken and its endpoint id, to its id.
	Rows map[AnchoredRow]int64
	// Refused is why the database refused the batch's statement, when it did (each event
	// was then written on its own).
	Refused error
}

// AnchoredRow names a delivery row SettleAnchored made: its event's NewToken and its endpoint.
type AnchoredRow struct {
	Token    int64
	Endpoint string
}

// SettleAnchored writes, in one statement, the events of batch that were routed in memory:
// each leaves the queue for the delivery log, its delivered deliveries are logged, and its
// other deliveries become leased rows of the queue (see anchored.sql). lease is the new rows'
// lease. An event whose lease was lost is left alone (its NewToken not in Written).
//
// One bad event must not hold back the rest, nor come back for ever with the whole batch:
// when the database refuses the statement (not a lost connection), each event is written on
// its own, and an event refused alone has all its deliveries made rows (AsRows), which Settle
// then writes or dead-letters one by one like any row. The returned error is the batch's
// when nothing could be tried alone.
func (s *Settler) SettleAnchored(ctx context.Context, batch []Anchored, lease time.Duration) (AnchoredResult, error) {
	res := AnchoredResult{Written: make(map[int64]bool, len(batch)), AsRows: map[int64]bool{}, Failed: map[int64]error{},
		Rows: map[AnchoredRow]int64{}}
	err := s.settleAnchored(ctx, batch, lease, &res)
	if err == nil || !isStatementError(err) || len(batch) == 1 && ctx.Err() != nil {
		return res, err
	}
	res.Refused = err
	if fluxsql.IsLockTimeout(err) {
		// As settleAround: the events whose rows are locked now are left to their lease, and
		// the others written as a batch, without waiting for a locked row again.
		if batch = s.anchoredAround(ctx, batch, err, &res); len(batch) == 0 {
			return res, nil
		}
		if err = s.settleAnchored(ctx, batch, lease, &res); err == nil || !isStatementError(err) {
			return res, err
		}
	}
	for _, a := range batch {
		if err := s.settleAnchored(ctx, []Anchored{a}, lease, &res); err == nil {
			continue
		} else if !isStatementError(err) || fluxsql.IsLockTimeout(err) {
			res.Failed[a.NewToken] = err
			continue
		}
		rows := a
		rows.Delivered, rows.Rows = nil, slices.Concat(a.Rows, endpointIDs(a.Delivered))
		if err := s.settleAnchored(ctx, []Anchored{rows}, lease, &res); err != nil {
			res.Failed[a.NewToken] = err
			continue
		}
		res.AsRows[a.NewToken] = true
	}
	return res, nil
}

// anchoredAround records in res.Failed the events of batch whose rows another session holds
// locked now (the anchored statement waited its lock_timeout, cause, for one) and returns the
// others. When none can be told locked (the look failed, the lock is gone), it returns batch.
func (s *Settler) anchoredAround(ctx context.Context, batch []Anchored, cause error, res *AnchoredResult) []Anchored {
	ids := make([]int64, len(batch))
	for i, a := range batch {
		ids[i] = a.EventID
	}
	locked, err := fluxsql.LockedOutboxRows(ctx, s.pool, ids)
	if err != nil || len(locked) == 0 {
		return batch
	}
	rest := make([]Anchored, 0, len(batch))
	for _, a := range batch {
		if locked[a.EventID] {
			res.Failed[a.NewToken] = fmt.Errorf("the event's row was locked by another session for over a second%s: %w",
				s.lockHolder(ctx, a.EventID), cause)
			continue
		}
		rest = append(rest, a)
	}
	return rest
}

// endpointIDs returns the endpoint ids of ds.
func endpointIDs(ds []*delivery.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.EndpointID
	}
	return out
}

// settleAnchored runs anchored.sql for batch, adding what it wrote to res.
func (s *Settler) settleAnchored(ctx context.Context, batch []Anchored, lease time.Duration, res *AnchoredResult) error {
	ids := make([]int64, len(batch))
	tokens := make([]int64, len(batch))
	newTokens := make([]int64, len(batch))
	counts := make([]int32, len(batch))
	var evTokens []int64
	var eps []string
	var delivered []int16
	var statuses, durations []int32
	var errs []string
	var excerpts pgtype.FlatArray[*string]
	for i, a := range batch {
		ids[i], tokens[i], newTokens[i], counts[i] = a.EventID, a.LeaseToken, a.NewToken, int32(a.Endpoints)
		for _, d := range a.Delivered {
			evTokens, eps, delivered = append(evTokens, a.NewToken), append(eps, d.EndpointID), append(delivered, 1)
			statuses = append(statuses, int32(d.Outcome.Status))
			durations = append(durations, int32(d.Outcome.Duration.Milliseconds()))
			errs = append(errs, d.Outcome.Error)
			excerpts = append(excerpts, excerpt(&d.Outcome))
		}
		for _, ep := range a.Rows {
			evTokens, eps, delivered = append(evTokens, a.NewToken), append(eps, ep), append(delivered, 0)
			statuses, durations, errs = append(statuses, 0), append(durations, 0), append(errs, "")
			excerpts = append(excerpts, nil)
		}
	}
	rows, err := s.pool.Query(ctx, anchoredSQL, ids, tokens, s.instance, evTokens, eps, delivered, statuses,
		newTokens, lease.Milliseconds(), durations, errs, counts, excerpts)
	if err != nil {
		return fmt.Errorf("settle of events routed in memory: %w", err)
	}
	defer rows.Close()
	written := map[int64]bool{}
	made := map[AnchoredRow]int64{}
	var kind, ep string
	var key, id int64
	for rows.Next() {
		if err := rows.Scan(&kind, &key, &ep, &id); err != nil {
			return fmt.Errorf("settle of events routed in memory: scanning: %w", err)
		}
		if kind == "e" {
			written[key] = true
		} else {
			made[AnchoredRow{Token: key, Endpoint: ep}] = id
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("settle of events routed in memory: %w", err)
	}
	// Only a statement that committed counts: its rows were all read without error.
	maps.Copy(res.Written, written)
	maps.Copy(res.Rows, made)
	return nil
}

// Warm runs the settle statements (settle.sql, settleDeliveredSQL and settleDeliveredOrderedSQL), and with anchored the
// statement that settles events routed in memory, with nothing to settle. That writes nothing
// and takes no grant a settle does not (an empty run calls no nextval), and leaves on one of
// the pool's connections the statements parsed and described (pgx keeps them) and the
// backend's catalog caches filled: what the first settle after a start otherwise pays for
// while every slot of the pipeline waits for it, on a machine busy with the first batch's
// requests. PostgreSQL plans a prepared
// statement afresh on each of its first runs either way.
func (s *Settler) Warm(ctx context.Context, anchored bool) error {
	var errs []error
	if anchored {
		rows, err := s.pool.Query(ctx, anchoredSQL, []int64{}, []int64{}, s.instance, []int64{}, []string{}, []int16{},
			[]int32{}, []int64{}, int64(0), []int32{}, []string{}, []int32{}, pgtype.FlatArray[*string]{})
		if err == nil {
			rows.Close()
			err = rows.Err()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("settle of events routed in memory: %w", err))
		}
	}
	for _, st := range []struct{ name, sql string }{{"settle", settleSQL}, {"settle of deliveries alone", settleDeliveredSQL},
		{"settle of ordered deliveries alone", settleDeliveredOrderedSQL}} {
		var r Result
		var written []int64
		if err := s.pool.QueryRow(ctx, st.sql, s.columns(nil)...).Scan(r.columns(&written)...); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", st.name, err))
		}
	}
	return errors.Join(errs...)
}
