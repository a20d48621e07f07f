package deadletters

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed queries/recovery_endpoint.sql
	recoveryEndpointSQL string
	//go:embed queries/recovery_start.sql
	recoveryStartSQL string
	//go:embed queries/recovery_get.sql
	recoveryGetSQL string
	//go:embed queries/recovery_lock.sql
	recoveryLockSQL string
	//go:embed queries/recovery_batch.sql
	recoveryBatchSQL string
	//go:embed queries/recovery_progress.sql
	recoveryProgressSQL string
	//go:embed queries/recovery_finish.sql
	recoveryFinishSQL string
	//go:embed queries/recovery_claim_stale.sql
	recoveryClaimStaleSQL string
	//go:embed queries/recovery_running.sql
	recoveryRunningSQL string
	//go:embed queries/recovery_cancel.sql
	recoveryCancelSQL string
)

// The states of a recovery job.
const (
	RecoveryRunning   = "running"
	RecoveryDone      = "done"
	RecoveryFailed    = "failed"
	RecoveryCancelled = "cancelled"
)

// RunningError is StartRecovery's refusal while a job of the endpoint is running: one runs per
// endpoint at a time. ID is that job, for the caller to follow or cancel; empty when the job
// is of another tenant than the caller's (the endpoint changed tenant since it started), whose
// id the caller must not learn.
type RunningError struct {
	EndpointID string
	ID         string
}

// Error names the running job when the caller may see it.
func (e *RunningError) Error() string {
	if e.ID == "" {
		return fmt.Sprintf("endpoint %s has a recovery running; start another once it ends", e.EndpointID)
	}
	return fmt.Sprintf("endpoint %s has recovery %s running; follow it, or cancel it before starting another", e.EndpointID, e.ID)
}

// Recovery is a job replaying every dead letter of an endpoint since a time
// (webhook_recoveries, schema 17), as the API's GET shows it.
type Recovery struct {
	ID         string `json:"id"`
	EndpointID string `json:"endpoint_id"`
	// Tenant is the endpoint's tenant when the job started (nil for none): who sees the job,
	// and the scope of its replays.
	Tenant *string   `json:"tenant"`
	Since  time.Time `json:"since"`
	// State is RecoveryRunning, RecoveryDone, RecoveryFailed (Error says why) or
	// RecoveryCancelled.
	State string `json:"state"`
	// Total is the dead letters not yet replayed when the job started; Done those it has
	// dealt with since, replayed or skipped; Replayed, of those, the events it enqueued
	// again. A dead letter purged while the job runs is not dealt with: a finished job may
	// show Done below Total.
	Total      int        `json:"total"`
	Done       int        `json:"done"`
	Replayed   int        `json:"replayed"`
	Error      *string    `json:"error"`
	CreatedBy  string     `json:"created_by"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// scanRecovery reads the columns recovery_get.sql and recovery_start.sql return.
func scanRecovery(row pgx.Row) (Recovery, error) {
	var r Recovery
	err := row.Scan(&r.ID, &r.EndpointID, &r.Tenant, &r.Since, &r.State, &r.Total, &r.Done, &r.Replayed, &r.Error,
		&r.CreatedBy, &r.CreatedAt, &r.UpdatedAt, &r.FinishedAt)
	r.Since, r.CreatedAt, r.UpdatedAt = r.Since.UTC(), r.CreatedAt.UTC(), r.UpdatedAt.UTC()
	if r.FinishedAt != nil {
		t := r.FinishedAt.UTC()
		r.FinishedAt = &t
	}
	return r, err
}

// DB is what a recovery runs through: a pool (a batch per transaction, and reads).
type DB interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// StartRecovery records a running job that will replay, to endpointID, every dead letter of
// that endpoint that failed since then and not yet replayed, and counts them (Total). Run it
// with RunRecovery, in the background: the caller answers with the job at once. actor is who
// asked (an API key's id, a CLI user), kept in created_by.
//
// The endpoint must exist in the caller's tenant (another tenant's is ErrEndpointNotFound, as
// a missing one) and be enabled (ErrEndpointDisabled): replayed to a disabled endpoint, the
// events would only be dead-lettered again. since must not be in the future and actor not
// empty (InvalidError). While a job of the endpoint runs, no other starts: RunningError names
// it.
func StartRecovery(ctx context.Context, q Querier, endpointID string, since time.Time, actor string, tenant *string) (Recovery, error) {
	id, ok := CanonicalUUID(endpointID)
	switch {
	case !ok:
		return Recovery{}, invalid("endpoint_id", "%q is not a UUID", endpointID)
	case since.IsZero():
		return Recovery{}, invalid("since", "is required")
	case since.After(time.Now()):
		return Recovery{}, invalid("since", "%s is in the future", since.Format(time.RFC3339))
	case strings.TrimSpace(actor) == "":
		return Recovery{}, invalid("created_by", "is required")
	}
	var endpointTenant *string
	var enabled bool
	err := q.QueryRow(ctx, recoveryEndpointSQL, id, tenant).Scan(&endpointTenant, &enabled)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Recovery{}, fmt.Errorf("%w: %s", ErrEndpointNotFound, id)
	case err != nil:
		return Recovery{}, fmt.Errorf("reading endpoint %s: %w", id, err)
	case !enabled:
		return Recovery{}, fmt.Errorf("%w: %s: enable it before recovering its dead letters, or they would only be dead-lettered again", ErrEndpointDisabled, id)
	}
	// Either the insert makes the job, or a job is running, or one was running at the insert
	// and ended since: then try again. A job ends after a batch at the soonest, so a few
	// tries are plenty.
	for range 3 {
		r, err := scanRecovery(q.QueryRow(ctx, recoveryStartSQL, id, endpointTenant, since, actor))
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Recovery{}, fmt.Errorf("starting recovery of endpoint %s: %w", id, err)
		}
		var running string
		var runningTenant *string
		err = q.QueryRow(ctx, recoveryRunningSQL, id).Scan(&running, &runningTenant)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue
		case err != nil:
			return Recovery{}, fmt.Errorf("reading the running recovery of endpoint %s: %w", id, err)
		case tenant != nil && (runningTenant == nil || *runningTenant != *tenant):
			running = ""
		}
		return Recovery{}, &RunningError{EndpointID: id, ID: running}
	}
	return Recovery{}, fmt.Errorf("starting recovery of endpoint %s: its recoveries kept starting and ending; try again", id)
}

// CancelRecovery cancels the running job id (of tenant, when set; another tenant's is a
// NotFoundError, as a missing one) and returns it, cancelled, and true. The job stops at its
// next batch: the batch in progress, if any, commits first (this waits for it), and the dead
// letters it replayed stay replayed. A job that is not running (done, failed, cancelled) is
// returned as it is, and false.
func CancelRecovery(ctx context.Context, q Querier, id string, tenant *string) (Recovery, bool, error) {
	canonical, ok := CanonicalUUID(id)
	if !ok {
		return Recovery{}, false, &NotFoundError{Recovery: id}
	}
	r, err := scanRecovery(q.QueryRow(ctx, recoveryCancelSQL, canonical, tenant))
	if err == nil {
		return r, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Recovery{}, false, fmt.Errorf("cancelling recovery %s: %w", canonical, err)
	}
	r, err = GetRecovery(ctx, q, canonical, tenant)
	return r, false, err
}

// GetRecovery returns the job with that id. One of another tenant than tenant (when set), a
// missing one and a malformed id are the same NotFoundError.
func GetRecovery(ctx context.Context, q Querier, id string, tenant *string) (Recovery, error) {
	canonical, ok := CanonicalUUID(id)
	if !ok {
		return Recovery{}, &NotFoundError{Recovery: id}
	}
	r, err := scanRecovery(q.QueryRow(ctx, recoveryGetSQL, canonical, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return Recovery{}, &NotFoundError{Recovery: canonical}
	}
	if err != nil {
		return Recovery{}, fmt.Errorf("reading recovery %s: %w", canonical, err)
	}
	return r, nil
}

// ErrRecoveryFailed is matched by Run's error for a job that ended failed (Recovery.Error
// says why; the Recovery is returned with it). Starting a new job is safe: it skips what this
// one replayed.
var ErrRecoveryFailed = errors.New("recovery failed")

// DefaultBatchSize is how many dead letters a recovery replays per transaction unless
// Runner.BatchSize says otherwise: large enough that a batch's fixed cost (a few statements)
// is small beside its replays, small enough that its locks and its outbox insert stay brief.
const DefaultBatchSize = 500

// Runner runs recovery jobs. Its zero value runs them with the defaults.
type Runner struct {
	// BatchSize is how many dead letters each transaction replays; zero means
	// DefaultBatchSize.
	BatchSize int
	// AfterBatch, when set, is called after each batch commits, with the job as it then
	// stands: for progress in logs or metrics (or a test's hook).
	AfterBatch func(Recovery)
}

// RunRecovery is Runner.Run with the defaults.
func RunRecovery(ctx context.Context, db DB, id string) (Recovery, error) {
	return Runner{}.Run(ctx, db, id)
}

// ResumeStale is Runner.ResumeStale with the defaults.
func ResumeStale(ctx context.Context, db DB, olderThan time.Duration) ([]Recovery, error) {
	return Runner{}.ResumeStale(ctx, db, olderThan)
}

// Run runs the job with that id until it is done, and returns it as it ends. Each batch is a
// transaction that locks the job, replays the next dead letters through Replay and moves the
// job's done count and cursor, all committed together. So:
//
//   - it is resumable: a job whose process died stays 'running' with the cursor of its last
//     committed batch, and Run called again (by ResumeStale, say) goes on from there;
//   - it is safe twice: Run called twice on one job takes its batches in turn, and two jobs
//     over the same dead letters each skip what the other replayed (SkipAlreadyReplayed),
//     so no event is enqueued twice.
//
// Dead letters that failed after the job started (its own replays failing again, say) are
// not its business: it ends. A job already ended is returned as it is (failed with its error).
//
// A job cancelled (CancelRecovery) stops before its next batch and is returned as it is.
//
// When ctx ends, Run returns its error and the job stays 'running', to be resumed. Any other
// error ends the job as 'failed' with that error, as does its endpoint being removed or
// disabled meanwhile, and Run's error then matches ErrRecoveryFailed; a new job can take
// over, safely.
func (rn Runner) Run(ctx context.Context, db DB, id string) (Recovery, error) {
	canonical, ok := CanonicalUUID(id)
	if !ok {
		return Recovery{}, &NotFoundError{Recovery: id}
	}
	size := rn.BatchSize
	if size <= 0 {
		size = DefaultBatchSize
	}
	for {
		finished, err := rn.batch(ctx, db, canonical, size)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrNotFound) {
				return Recovery{}, err
			}
			if _, ferr := db.Exec(ctx, recoveryFinishSQL, canonical, RecoveryFailed, err.Error()); ferr != nil {
				return Recovery{}, errors.Join(err, fmt.Errorf("recording the failure of recovery %s: %w", canonical, ferr))
			}
			r, gerr := GetRecovery(ctx, db, canonical, nil)
			return r, errors.Join(fmt.Errorf("%w: %w", ErrRecoveryFailed, err), gerr)
		}
		r, err := GetRecovery(ctx, db, canonical, nil)
		if err != nil {
			return Recovery{}, err
		}
		if finished {
			if r.State == RecoveryFailed && r.Error != nil {
				return r, fmt.Errorf("%w: recovery %s: %s", ErrRecoveryFailed, canonical, *r.Error)
			}
			return r, nil
		}
		if rn.AfterBatch != nil {
			rn.AfterBatch(r)
		}
	}
}

// batch runs one batch of the job in its own transaction, and reports whether the job has
// ended (done, failed by another, or ended here because its endpoint is gone).
func (rn Runner) batch(ctx context.Context, db DB, id string, size int) (finished bool, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var endpointID, state string
		var tenant *string
		var since, started time.Time
		var cursorAt *time.Time
		var cursorID *int64
		err := tx.QueryRow(ctx, recoveryLockSQL, id).Scan(&endpointID, &tenant, &since, &state, &started, &cursorAt, &cursorID)
		if errors.Is(err, pgx.ErrNoRows) {
			return &NotFoundError{Recovery: id}
		}
		if err != nil {
			return fmt.Errorf("locking recovery %s: %w", id, err)
		}
		if state != RecoveryRunning {
			finished = true
			return nil
		}
		var enabled bool
		var endpointTenant *string
		err = tx.QueryRow(ctx, recoveryEndpointSQL, endpointID, tenant).Scan(&endpointTenant, &enabled)
		gone := ""
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			gone = fmt.Sprintf("endpoint %s was removed (or given to another tenant) while its dead letters were recovered", endpointID)
		case err != nil:
			return fmt.Errorf("reading endpoint %s: %w", endpointID, err)
		case !enabled:
			gone = fmt.Sprintf("endpoint %s was disabled while its dead letters were recovered; enable it and start a new recovery", endpointID)
		}
		if gone != "" {
			finished = true
			if _, err := tx.Exec(ctx, recoveryFinishSQL, id, RecoveryFailed, gone); err != nil {
				return fmt.Errorf("ending recovery %s: %w", id, err)
			}
			return nil
		}
		// The first batch starts at since: no dead letter has an id below 1.
		after, afterID := since, int64(0)
		if cursorAt != nil && cursorID != nil {
			after, afterID = *cursorAt, *cursorID
		}
		rows, _ := tx.Query(ctx, recoveryBatchSQL, endpointID, since, started, after, afterID, tenant, size)
		type candidate struct {
			id       int64
			failedAt time.Time
		}
		batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
			var c candidate
			return c, r.Scan(&c.id, &c.failedAt)
		})
		if err != nil {
			return fmt.Errorf("reading the next dead letters of recovery %s: %w", id, err)
		}
		if len(batch) == 0 {
			finished = true
			if _, err := tx.Exec(ctx, recoveryFinishSQL, id, RecoveryDone, nil); err != nil {
				return fmt.Errorf("ending recovery %s: %w", id, err)
			}
			return nil
		}
		ids := make([]int64, len(batch))
		for i, c := range batch {
			ids[i] = c.id
		}
		out, err := replay(ctx, tx, Selection{Tenant: tenant, IDs: ids}, Options{}, true)
		if err != nil {
			return fmt.Errorf("recovery %s: %w", id, err)
		}
		last := batch[len(batch)-1]
		if _, err := tx.Exec(ctx, recoveryProgressSQL, id, len(batch), len(out.Replayed), last.failedAt, last.id); err != nil {
			return fmt.Errorf("recording the progress of recovery %s: %w", id, err)
		}
		return nil
	})
	return finished, err
}

// ResumeStale claims the jobs left 'running' by a process that died (not moved for
// olderThan: pick it well above a batch's duration, a few minutes) and runs each to its end,
// one after the other, returning them as they ended. An API process calls it at start, in a
// goroutine of its own with a context it cancels at shutdown (a job interrupted so stays
// resumable): processes starting together each claim different jobs, never one twice.
//
// The jobs it claimed and could not finish are in the joined error.
func (rn Runner) ResumeStale(ctx context.Context, db DB, olderThan time.Duration) ([]Recovery, error) {
	if olderThan <= 0 {
		return nil, invalid("older_than", "must be positive, got %s", olderThan)
	}
	rows, _ := db.Query(ctx, recoveryClaimStaleSQL, olderThan.Microseconds())
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("claiming stale recoveries: %w", err)
	}
	var out []Recovery
	var errs []error
	for _, id := range ids {
		r, err := rn.Run(ctx, db, id)
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}
