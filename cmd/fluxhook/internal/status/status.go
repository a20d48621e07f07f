package status

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

//go:embed queries/status_outbox.sql
var statusOutboxSQL string

//go:embed queries/status_managed.sql
var statusManagedSQL string

//go:embed queries/status_deferred.sql
var statusDeferredSQL string

//go:embed queries/status_dead_letter_totals.sql
var statusDeadLetterTotalsSQL string

//go:embed queries/status_dead_letter_reasons.sql
var statusDeadLetterReasonsSQL string

//go:embed queries/status_dispatchers.sql
var statusDispatchersSQL string

// Report is `fluxhook status --json`. Its field names are an interface for monitoring
// scripts: add fields, never rename them.
type Report struct {
	SchemaVersion int       `json:"schema_version"`
	DatabaseTime  time.Time `json:"database_time"`
	// Backlog: due, unprocessed and not held by a live lease.
	Backlog int64 `json:"backlog"`
	// OldestDueAgeSeconds: how long the oldest backlog row has been due; 0 without a backlog.
	OldestDueAgeSeconds float64 `json:"oldest_due_age_seconds"`
	// InFlight: unprocessed rows under a live lease (being sent).
	InFlight int64 `json:"in_flight"`
	// RetriesPending: unprocessed rows past their first attempt, due or not.
	RetriesPending int64 `json:"retries_pending"`
	// Scheduled: unprocessed rows not yet due (retries and delayed events).
	Scheduled int64 `json:"scheduled"`
	// Deferred: scheduled rows the gate held back, by the reason stored on them.
	Deferred []DeferredReason `json:"deferred_by_reason"`
	// OldestUndeliveredAgeSeconds: since the first enqueue of the oldest event not yet
	// delivered (scheduled retries and deferred rows included); 0 when nothing is pending.
	OldestUndeliveredAgeSeconds float64 `json:"oldest_undelivered_age_seconds"`
	ProcessedLastHour           int64   `json:"processed_last_hour"`
	// ProcessedLastHourCapped: more rows than ProcessedLastHour were processed in the last
	// hour; status stops counting at Options.CountCap so that it stays fast at any rate.
	ProcessedLastHourCapped bool               `json:"processed_last_hour_capped"`
	DeadLetters             int64              `json:"dead_letters"`
	DeadLettersNotReplayed  int64              `json:"dead_letters_not_replayed"`
	DeadLettersByReason     []DeadLetterReason `json:"dead_letters_by_reason"`
	Dispatchers             []Dispatcher       `json:"dispatchers"`
	// NotifySecondsLeft: how long producers' inserts keep sending NOTIFY (some dispatcher is
	// idle and renews it); 0 when every dispatcher is busy or none runs.
	NotifySecondsLeft float64 `json:"notify_seconds_left"`
	// Endpoints are the managed endpoints (webhook_endpoints), with their pending deliveries
	// and lifecycle.
	Endpoints []Endpoint `json:"endpoints"`
	// UnroutedLastHour counts the events of the last hour that matched no endpoint (and had
	// no default consumer): recorded in the delivery log, not delivered.
	UnroutedLastHour int64 `json:"unrouted_last_hour"`
	// UnroutedLastHourCapped: at least UnroutedLastHour; counted among the rows
	// ProcessedLastHour counted, which stopped at its cap.
	UnroutedLastHourCapped bool `json:"unrouted_last_hour_capped"`
	// Breakers lists endpoints whose circuit is not plainly closed (read from REDIS_URL).
	Breakers     []Breaker `json:"breakers"`
	BreakersNote string    `json:"breakers_note"`
	// BreakersUnavailable is why the breaker state could not be read (Redis down), empty
	// when it was read; the rest of the report is complete either way.
	BreakersUnavailable string `json:"breakers_unavailable,omitempty"`
	// OutboxIDSequenceCache is the outbox id sequence's CACHE: ordered delivery needs 1.
	OutboxIDSequenceCache int64 `json:"outbox_id_sequence_cache"`
	// StreamRowsBeyondSequence counts unprocessed stream rows whose id lies beyond the id
	// sequence (supplied by a producer): under ordered delivery each waits until the sequence
	// reaches it, so anything above 0 is stuck there.
	StreamRowsBeyondSequence int64 `json:"stream_rows_beyond_sequence"`
}

// Endpoint is one managed endpoint as status shows it: never its secret, its URL without the
// query string (which may carry a token), so that the report can be shown to anyone who may
// see delivery health.
type Endpoint struct {
	ID             string     `json:"id"`
	URL            string     `json:"url"`
	Tenant         string     `json:"tenant"`
	Enabled        bool       `json:"enabled"`
	DisabledReason string     `json:"disabled_reason"`
	Pending        int64      `json:"pending"`
	LastSuccessAt  *time.Time `json:"last_success_at"`
	FailingSince   *time.Time `json:"failing_since"`
}

// DeferredReason counts the scheduled rows the gate held back for one reason: why delivery is
// waiting matters more to an operator than that it is.
type DeferredReason struct {
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
	// NextDueSeconds: how long until the first of them comes due again; -1 when none comes
	// due by itself (the heads of ordered streams stopped at a dead letter).
	NextDueSeconds float64 `json:"next_due_seconds"`
}

// DeadLetterReason counts the dead letters with one reason (the ten most common are
// reported), and how many of them are not replayed yet: what to fix before replaying.
type DeadLetterReason struct {
	Reason      string `json:"reason"`
	Count       int64  `json:"count"`
	NotReplayed int64  `json:"not_replayed"`
}

// Dispatcher is one registered dispatcher instance: whether it runs, and whether producers
// notify for it.
type Dispatcher struct {
	InstanceID string `json:"instance_id"`
	// Armed: waiting for work, so producers NOTIFY for it. Never true for a stale instance.
	Armed     bool      `json:"armed"`
	StartedAt time.Time `json:"started_at"`
	// SeenAt is the instance's last heartbeat; SeenAgeSeconds its age.
	SeenAt         time.Time `json:"seen_at"`
	SeenAgeSeconds float64   `json:"seen_age_seconds"`
	// Stale: no heartbeat for longer than DispatcherStaleAfter. The instance has most likely
	// stopped without unregistering (kill -9, a lost host); its row stays until a live peer's
	// heartbeat deletes it, 5 minutes after its last one.
	Stale bool `json:"stale"`
}

// DispatcherStaleAfter is how long without a heartbeat makes an instance stale; exported so
// that a printed report can say what stale means. A live instance beats every
// min(WEBHOOK_POLL_INTERVAL_MS, 30 s) (stages/dispatcher maintain); status cannot know each
// instance's poll interval (the schema does not record it), so the bound is three of the
// longest interval: a live instance that missed two heartbeats in a row is not yet stale,
// whatever its configuration. With the default 10 s interval a dead instance is marked within
// 90 s of its last heartbeat, instead of looking armed for the 5 minutes until a peer deletes
// its row.
const DispatcherStaleAfter = 3 * 30 * time.Second

// DefaultCountCap is where status stops counting the last hour's delivery log rows unless
// Options.CountCap says otherwise: a million rows is under a second's read, an hour at 10,000
// events/s is 36 million.
const DefaultCountCap = 1_000_000

// Options says where Read finds what the database does not hold. The zero value reads
// PostgreSQL only (breakers reported as in-process) with DefaultCountCap.
type Options struct {
	// RedisURL is the Redis holding the shared breaker state (REDIS_URL); empty when the
	// state lives inside each dispatcher, which the report then says.
	RedisURL string
	// WebhookURL is the configured default consumer (WEBHOOK_URL), whose breaker is read
	// with the managed endpoints'; empty for none.
	WebhookURL string
	// CountCap bounds the last hour's delivery-log rows counted, so that a report stays fast
	// at any rate; 0 means DefaultCountCap.
	CountCap int64
}

// Read reads the complete report in one read-only repeatable-read snapshot of pool, so that
// every number is as of the same instant. Redis down does not fail it: the breakers are then
// empty and BreakersUnavailable says why, because that is exactly when the operator needs the
// rest of the picture. Read does not check the schema version; callers that need the current
// schema check it first (as `fluxhook status` does).
func Read(ctx context.Context, pool *pgxpool.Pool, opts Options) (Report, error) {
	if opts.CountCap < 0 {
		return Report{}, fmt.Errorf("status: Options.CountCap is %d, want 0 (the default) or more", opts.CountCap)
	}
	if opts.CountCap == 0 {
		opts.CountCap = DefaultCountCap
	}
	var rep Report
	// One read-only snapshot: every number is as of the same instant, and now() is the same
	// in every query.
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		rep, err = readStatus(ctx, tx, opts.CountCap)
		if err != nil {
			return err
		}
		var berr error
		rep.Breakers, rep.BreakersNote, berr = readBreakers(ctx, tx, opts.RedisURL, opts.WebhookURL)
		if berr != nil {
			// Redis down is exactly when the operator needs the rest of the picture: report
			// everything PostgreSQL knows and say why the breakers are missing.
			rep.Breakers = []Breaker{}
			rep.BreakersUnavailable = berr.Error()
			rep.BreakersNote = "breaker state unavailable: " + berr.Error()
		}
		return nil
	})
	if err != nil {
		return Report{}, err
	}
	return rep, nil
}

// capped turns a count of at most limit+1 rows into what status reports: the count, or limit
// and true when there were more.
func capped(n, limit int64) (int64, bool) {
	if n > limit {
		return limit, true
	}
	return n, false
}

// readStatus reads the report in tx, counting the last hour's log rows up to countCap.
func readStatus(ctx context.Context, tx pgx.Tx, countCap int64) (Report, error) {
	rep := Report{DeadLettersByReason: []DeadLetterReason{}, Dispatchers: []Dispatcher{}, Deferred: []DeferredReason{},
		Endpoints: []Endpoint{}}
	var err error
	if rep.SchemaVersion, err = fluxsql.CurrentVersion(ctx, tx); err != nil {
		return rep, err
	}
	if err := tx.QueryRow(ctx, statusOutboxSQL, countCap+1).Scan(&rep.DatabaseTime, &rep.Backlog, &rep.OldestDueAgeSeconds,
		&rep.InFlight, &rep.RetriesPending, &rep.Scheduled, &rep.ProcessedLastHour, &rep.UnroutedLastHour,
		&rep.OldestUndeliveredAgeSeconds); err != nil {
		return rep, fmt.Errorf("reading the outbox: %w", err)
	}
	// Both counts come from the same countCap+1 rows: past the cap, the unrouted ones are
	// those among the rows counted, so at least that many.
	rep.ProcessedLastHour, rep.ProcessedLastHourCapped = capped(rep.ProcessedLastHour, countCap)
	rep.UnroutedLastHourCapped = rep.ProcessedLastHourCapped
	rows, _ := tx.Query(ctx, statusDeferredSQL)
	deferred, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeferredReason, error) {
		var d DeferredReason
		return d, r.Scan(&d.Reason, &d.Count, &d.NextDueSeconds)
	})
	if err != nil {
		return rep, fmt.Errorf("reading deferred rows: %w", err)
	}
	rep.Deferred = append(rep.Deferred, deferred...)
	rows, _ = tx.Query(ctx, statusManagedSQL)
	managed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Endpoint, error) {
		var m Endpoint
		return m, r.Scan(&m.ID, &m.URL, &m.Tenant, &m.Enabled, &m.DisabledReason, &m.Pending, &m.LastSuccessAt, &m.FailingSince)
	})
	if err != nil {
		return rep, fmt.Errorf("reading endpoints: %w", err)
	}
	rep.Endpoints = append(rep.Endpoints, managed...)
	if err := tx.QueryRow(ctx, statusDeadLetterTotalsSQL).Scan(&rep.DeadLetters, &rep.DeadLettersNotReplayed); err != nil {
		return rep, fmt.Errorf("reading dead letters: %w", err)
	}
	rows, _ = tx.Query(ctx, statusDeadLetterReasonsSQL)
	reasons, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterReason, error) {
		var d DeadLetterReason
		return d, r.Scan(&d.Reason, &d.Count, &d.NotReplayed)
	})
	if err != nil {
		return rep, fmt.Errorf("reading dead-letter reasons: %w", err)
	}
	rep.DeadLettersByReason = append(rep.DeadLettersByReason, reasons...)
	rows, _ = tx.Query(ctx, statusDispatchersSQL, DispatcherStaleAfter.Milliseconds())
	instances, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Dispatcher, error) {
		var d Dispatcher
		return d, r.Scan(&d.InstanceID, &d.Armed, &d.StartedAt, &d.SeenAt, &d.SeenAgeSeconds, &d.Stale)
	})
	if err != nil {
		return rep, fmt.Errorf("reading dispatchers: %w", err)
	}
	rep.Dispatchers = append(rep.Dispatchers, instances...)
	ids, err := fluxsql.CheckOutboxIDs(ctx, tx)
	if err != nil {
		return rep, err
	}
	rep.OutboxIDSequenceCache, rep.StreamRowsBeyondSequence = ids.SequenceCache, ids.BeyondSequence
	if err := tx.QueryRow(ctx, `SELECT greatest(coalesce(pg_catalog.pg_sequence_last_value('webhook_outbox_notify_until'::pg_catalog.regclass), 0)
		- (extract(epoch FROM clock_timestamp()) * 1000)::bigint, 0) / 1000.0`).Scan(&rep.NotifySecondsLeft); err != nil {
		return rep, fmt.Errorf("reading the NOTIFY switch: %w", err)
	}
	rep.DatabaseTime = rep.DatabaseTime.UTC()
	for i := range rep.Dispatchers {
		rep.Dispatchers[i].StartedAt = rep.Dispatchers[i].StartedAt.UTC()
		rep.Dispatchers[i].SeenAt = rep.Dispatchers[i].SeenAt.UTC()
	}
	return rep, nil
}
