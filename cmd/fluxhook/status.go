package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

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

func init() {
	commands["status"] = command{summary: "backlog, leases, retries, dead letters and dispatchers (--json for monitoring)", run: runStatus}
}

// statusReport is `fluxhook status --json`. Its field names are an interface for monitoring
// scripts: add fields, never rename them.
type statusReport struct {
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
	Deferred []deferredReason `json:"deferred_by_reason"`
	// OldestUndeliveredAgeSeconds: since the first enqueue of the oldest event not yet
	// delivered (scheduled retries and deferred rows included); 0 when nothing is pending.
	OldestUndeliveredAgeSeconds float64 `json:"oldest_undelivered_age_seconds"`
	ProcessedLastHour           int64   `json:"processed_last_hour"`
	// ProcessedLastHourCapped: more rows than ProcessedLastHour were processed in the last
	// hour; status stops counting at statusCountCap so that it stays fast at any rate.
	ProcessedLastHourCapped bool                 `json:"processed_last_hour_capped"`
	DeadLetters             int64                `json:"dead_letters"`
	DeadLettersNotReplayed  int64                `json:"dead_letters_not_replayed"`
	DeadLettersByReason     []deadLetterReason   `json:"dead_letters_by_reason"`
	Dispatchers             []dispatcherInstance `json:"dispatchers"`
	// NotifySecondsLeft: how long producers' inserts keep sending NOTIFY (some dispatcher is
	// idle and renews it); 0 when every dispatcher is busy or none runs.
	NotifySecondsLeft float64 `json:"notify_seconds_left"`
	// Endpoints are the managed endpoints (webhook_endpoints), with their pending deliveries
	// and lifecycle.
	Endpoints []managedStatus `json:"endpoints"`
	// UnroutedLastHour counts the events of the last hour that matched no endpoint (and had
	// no default consumer): recorded in the delivery log, not delivered.
	UnroutedLastHour int64 `json:"unrouted_last_hour"`
	// UnroutedLastHourCapped: at least UnroutedLastHour; counted among the rows
	// ProcessedLastHour counted, which stopped at its cap.
	UnroutedLastHourCapped bool `json:"unrouted_last_hour_capped"`
	// Breakers lists endpoints whose circuit is not plainly closed (read from REDIS_URL).
	Breakers     []breakerStatus `json:"breakers"`
	BreakersNote string          `json:"breakers_note"`
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

// managedStatus is one managed endpoint as status shows it: never its secret, its URL without
// the query string.
type managedStatus struct {
	ID             string     `json:"id"`
	URL            string     `json:"url"`
	Tenant         string     `json:"tenant"`
	Enabled        bool       `json:"enabled"`
	DisabledReason string     `json:"disabled_reason"`
	Pending        int64      `json:"pending"`
	LastSuccessAt  *time.Time `json:"last_success_at"`
	FailingSince   *time.Time `json:"failing_since"`
}

type deferredReason struct {
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
	// NextDueSeconds: how long until the first of them comes due again; -1 when none comes
	// due by itself (the heads of ordered streams stopped at a dead letter).
	NextDueSeconds float64 `json:"next_due_seconds"`
}

type deadLetterReason struct {
	Reason      string `json:"reason"`
	Count       int64  `json:"count"`
	NotReplayed int64  `json:"not_replayed"`
}

type dispatcherInstance struct {
	InstanceID string `json:"instance_id"`
	// Armed: waiting for work, so producers NOTIFY for it. Never true for a stale instance.
	Armed     bool      `json:"armed"`
	StartedAt time.Time `json:"started_at"`
	// SeenAt is the instance's last heartbeat; SeenAgeSeconds its age.
	SeenAt         time.Time `json:"seen_at"`
	SeenAgeSeconds float64   `json:"seen_age_seconds"`
	// Stale: no heartbeat for longer than dispatcherStaleAfter. The instance has most likely
	// stopped without unregistering (kill -9, a lost host); its row stays until a live peer's
	// heartbeat deletes it, 5 minutes after its last one.
	Stale bool `json:"stale"`
}

// dispatcherStaleAfter is how long without a heartbeat makes an instance stale. A live
// instance beats every min(WEBHOOK_POLL_INTERVAL_MS, 30 s) (stages/dispatcher maintain);
// status cannot know each instance's poll interval (the schema does not record it), so the
// bound is three of the longest interval: a live instance that missed two heartbeats in a
// row is not yet stale, whatever its configuration. With the default 10 s interval a dead
// instance is marked within 90 s of its last heartbeat, instead of looking armed for the
// 5 minutes until a peer deletes its row.
const dispatcherStaleAfter = 3 * 30 * time.Second

// runStatus answers "is delivery keeping up, and is anything stuck?" from the database alone,
// so it works while no dispatcher is running, which is when it is most needed.
func runStatus(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet("status", env, "fluxhook status [--json]")
	dbURL := databaseURLFlag(fs, env)
	asJSON := fs.Bool("json", false, "print one JSON object with stable snake_case fields")
	redisURL := fs.String("redis-url", "", "Redis holding the shared breaker state (env REDIS_URL)")
	webhookURL := fs.String("webhook-url", "", "the configured consumer URL, to include its breaker (env WEBHOOK_URL)")
	if err := noArguments(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	pool, err := connectCurrent(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	var rep statusReport
	// One read-only snapshot: every number is as of the same instant, and now() is the same
	// in every query.
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rep, err = readStatus(ctx, tx, statusCountCap)
		if err != nil {
			return err
		}
		var berr error
		rep.Breakers, rep.BreakersNote, berr = readBreakers(ctx, tx, orEnv(*redisURL, env, "REDIS_URL"), orEnv(*webhookURL, env, "WEBHOOK_URL"))
		if berr != nil {
			// Redis down is exactly when the operator needs the rest of the picture: print
			// everything PostgreSQL knows and say why the breakers are missing (exit 0).
			rep.Breakers = []breakerStatus{}
			rep.BreakersUnavailable = berr.Error()
			rep.BreakersNote = "breaker state unavailable: " + berr.Error()
		}
		return nil
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, rep)
	}
	return printStatus(env.stdout, rep)
}

// statusCountCap is where status stops counting the last hour's delivery log rows: a
// million rows is under a second's read, an hour at 10,000 events/s is 36 million.
const statusCountCap = 1_000_000

// capped turns a count of at most limit+1 rows into what status reports: the count, or limit
// and true when there were more.
func capped(n, limit int64) (int64, bool) {
	if n > limit {
		return limit, true
	}
	return n, false
}

// readStatus reads the report in tx, counting the last hour's log rows up to countCap.
func readStatus(ctx context.Context, tx pgx.Tx, countCap int64) (statusReport, error) {
	rep := statusReport{DeadLettersByReason: []deadLetterReason{}, Dispatchers: []dispatcherInstance{}, Deferred: []deferredReason{},
		Endpoints: []managedStatus{}}
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
	deferred, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deferredReason, error) {
		var d deferredReason
		return d, r.Scan(&d.Reason, &d.Count, &d.NextDueSeconds)
	})
	if err != nil {
		return rep, fmt.Errorf("reading deferred rows: %w", err)
	}
	rep.Deferred = append(rep.Deferred, deferred...)
	rows, _ = tx.Query(ctx, statusManagedSQL)
	managed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (managedStatus, error) {
		var m managedStatus
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
	reasons, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadLetterReason, error) {
		var d deadLetterReason
		return d, r.Scan(&d.Reason, &d.Count, &d.NotReplayed)
	})
	if err != nil {
		return rep, fmt.Errorf("reading dead-letter reasons: %w", err)
	}
	rep.DeadLettersByReason = append(rep.DeadLettersByReason, reasons...)
	rows, _ = tx.Query(ctx, statusDispatchersSQL, dispatcherStaleAfter.Milliseconds())
	instances, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dispatcherInstance, error) {
		var d dispatcherInstance
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
	if err := tx.QueryRow(ctx, `SELECT greatest(coalesce(pg_sequence_last_value('webhook_outbox_notify_until'), 0)
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

func printStatus(w io.Writer, rep statusReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "schema version\t%d\n", rep.SchemaVersion)
	fmt.Fprintf(tw, "database time\t%s\n", formatTime(rep.DatabaseTime))
	fmt.Fprintf(tw, "backlog\t%d\tdue, waiting to be claimed\n", rep.Backlog)
	fmt.Fprintf(tw, "oldest due age\t%s\n", formatSeconds(rep.OldestDueAgeSeconds))
	fmt.Fprintf(tw, "in-flight leases\t%d\n", rep.InFlight)
	fmt.Fprintf(tw, "retries pending\t%d\n", rep.RetriesPending)
	fmt.Fprintf(tw, "scheduled\t%d\tnot yet due (retries, deferred and delayed rows)\n", rep.Scheduled)
	for _, d := range rep.Deferred {
		if d.NextDueSeconds < 0 {
			fmt.Fprintf(tw, "  deferred\t%d\t%s\n", d.Count, printable(d.Reason))
			continue
		}
		fmt.Fprintf(tw, "  deferred\t%d\t%s; next due in %s\n", d.Count, printable(d.Reason), formatSeconds(d.NextDueSeconds))
	}
	fmt.Fprintf(tw, "oldest undelivered\t%s\tsince the first enqueue of the oldest event not yet delivered\n", formatSeconds(rep.OldestUndeliveredAgeSeconds))
	fmt.Fprintf(tw, "processed last hour\t%s\n", cappedCount("more than", rep.ProcessedLastHour, rep.ProcessedLastHourCapped))
	fmt.Fprintf(tw, "dead letters\t%d\t%d not replayed\n", rep.DeadLetters, rep.DeadLettersNotReplayed)
	if rep.StreamRowsBeyondSequence > 0 {
		fmt.Fprintf(tw, "rows beyond id sequence\t%d\tstream rows with ids supplied by a producer: ordered delivery holds each until the sequence reaches it; let the sequence draw ordered events' ids\n",
			rep.StreamRowsBeyondSequence)
	}
	if rep.OutboxIDSequenceCache > 1 {
		fmt.Fprintf(tw, "id sequence cache\t%d\tordered delivery needs 1: ALTER SEQUENCE webhook_outbox_id_seq CACHE 1\n", rep.OutboxIDSequenceCache)
	}
	if rep.NotifySecondsLeft > 0 {
		fmt.Fprintf(tw, "producers notify\tyes\tfor %s more: a dispatcher is waiting for work\n", formatSeconds(rep.NotifySecondsLeft))
	} else {
		fmt.Fprintf(tw, "producers notify\tno\tevery dispatcher is busy, or none is running\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.DeadLettersByReason) > 0 {
		fmt.Fprintln(w, "\ndead letters by reason (top 10):")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  COUNT\tNOT REPLAYED\tREASON")
		for _, r := range rep.DeadLettersByReason {
			fmt.Fprintf(tw, "  %d\t%d\t%s\n", r.Count, r.NotReplayed, printable(r.Reason))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Endpoints) > 0 || rep.UnroutedLastHour > 0 {
		fmt.Fprintf(w, "\nendpoints (%d; events matching none in the last hour: %s):\n", len(rep.Endpoints),
			cappedCount("at least", rep.UnroutedLastHour, rep.UnroutedLastHourCapped))
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tURL\tTENANT\tENABLED\tPENDING\tLAST SUCCESS\tFAILING SINCE\tDISABLED REASON")
		when := func(t *time.Time) string {
			if t == nil {
				return "-"
			}
			return formatTime(t.UTC())
		}
		for _, e := range rep.Endpoints {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.ID, printable(e.URL), printable(e.Tenant), yesNo(e.Enabled),
				e.Pending, when(e.LastSuccessAt), when(e.FailingSince), printable(e.DisabledReason))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\ndispatchers:")
	if len(rep.Dispatchers) == 0 {
		fmt.Fprintln(w, "  none registered")
	} else {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  INSTANCE\tARMED\tSTALE\tSTARTED\tLAST SEEN")
		stale := false
		for _, d := range rep.Dispatchers {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s ago\n", printable(d.InstanceID), yesNo(d.Armed), yesNo(d.Stale),
				formatTime(d.StartedAt), formatSeconds(d.SeenAgeSeconds))
			stale = stale || d.Stale
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if stale {
			fmt.Fprintf(w, "  stale: no heartbeat for over %s (live instances beat at least every 30s): probably stopped without\n"+
				"  unregistering; a running instance deletes the row 5 minutes after its last heartbeat\n", dispatcherStaleAfter)
		}
	}
	return printBreakers(w, rep.Breakers, rep.BreakersNote)
}

// orEnv is a flag's value, or the environment variable's when the flag is unset.
func orEnv(flagValue string, env *environment, name string) string {
	if flagValue != "" {
		return flagValue
	}
	return env.getenv(name)
}

func formatTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") }

// formatSeconds rounds an age for people: tenths of a second below a minute, seconds above.
func formatSeconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// cappedCount prints a count that stopped at its cap as "more than N" or "at least N" (bound
// says which the count is).
func cappedCount(bound string, n int64, capped bool) string {
	if capped {
		return fmt.Sprintf("%s %d (status counts no further)", bound, n)
	}
	return strconv.FormatInt(n, 10)
}
