package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/sql/audit"
	"github.com/fluxora/fluxhook/sql/deadletters"
)

// recoveryStaleAfter is how long a running recovery may go without progress before an API
// process starting up takes it over: well above a batch's duration (a few hundred replays).
const recoveryStaleAfter = 2 * time.Minute

// deadLetterError turns the dead-letter store's errors into the API's: invalid input names
// its field, another tenant's row is not found like a missing one.
func deadLetterError(err error, what, id string) error {
	var inv *deadletters.InvalidError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &inv):
		return errInvalid(inv.Field, "%s", inv.Error())
	case errors.Is(err, deadletters.ErrNotFound):
		return errNotFound(what, id)
	case errors.Is(err, deadletters.ErrEndpointNotFound):
		return errNotFound("endpoint", id)
	case errors.Is(err, deadletters.ErrEndpointDisabled):
		return errConflict("%s", strings.TrimPrefix(err.Error(), "endpoint disabled: "))
	}
	return err
}

// showOrigin shows a dead letter's row URL by its origin (scheme://host:port) alone, as the
// events and deliveries routes show it: producers put tokens in paths and queries, and a
// tenant key must not read them. null when the row had none, or one that is not a URL.
func showOrigin(d *deadletters.DeadLetter) {
	if d.EndpointURL != nil {
		d.EndpointURL = origin(*d.EndpointURL)
	}
}

func (s *Server) listDeadLetters(q *request) error {
	limit, err := q.limit()
	if err != nil {
		return err
	}
	query := q.r.URL.Query()
	f := deadletters.Filter{Tenant: q.scope(), EndpointID: query.Get("endpoint_id"), EventType: query.Get("event_type"),
		DeliveryID: query.Get("delivery_id"), ReasonContains: query.Get("reason_contains"), Limit: limit + 1}
	if t := q.tenantParam(); t != nil {
		if f.Tenant != nil && *t != *f.Tenant {
			writeJSON(q.w, http.StatusOK, page[deadletters.DeadLetter]{Data: []deadletters.DeadLetter{}})
			return nil
		}
		f.Tenant = t
	}
	if f.Since, err = q.timeParam("since"); err != nil {
		return err
	}
	if f.Until, err = q.timeParam("until"); err != nil {
		return err
	}
	switch v := query.Get("replayed"); v {
	case "":
	case "true":
		f.Replayed = deadletters.ReplayedOnly
	case "false":
		f.Replayed = deadletters.NotReplayed
	default:
		return errInvalid("replayed", "replayed: must be true or false, not %q", v)
	}
	if c := query.Get("cursor"); c != "" {
		if f.After, err = deadletters.ParseCursor(c); err != nil {
			return errBadCursor
		}
	}
	list, err := deadletters.List(q.ctx, s.cfg.Pool, f)
	if err != nil {
		return deadLetterError(err, "dead letter", "")
	}
	for i := range list {
		showOrigin(&list[i])
	}
	writeJSON(q.w, http.StatusOK, pageOf(list, limit, asIs, func(last deadletters.DeadLetter) *string {
		c := last.Cursor().String()
		return &c
	}))
	return nil
}

// deadLetterID reads the {id} of a dead-letter route: a positive integer, or not found.
func deadLetterID(q *request) (int64, string, error) {
	raw := q.r.PathValue("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 {
		return 0, raw, errNotFound("dead letter", raw)
	}
	return id, raw, nil
}

func (s *Server) getDeadLetter(q *request) error {
	id, raw, err := deadLetterID(q)
	if err != nil {
		return err
	}
	d, err := deadletters.Get(q.ctx, s.cfg.Pool, id, q.scope())
	if err != nil {
		return deadLetterError(err, "dead letter", raw)
	}
	showOrigin(&d)
	writeJSON(q.w, http.StatusOK, d)
	return nil
}

// replayResult is what a replay of one dead letter did.
type replayResult struct {
	Replayed   bool    `json:"replayed"`
	DeliveryID string  `json:"delivery_id"`
	SkipReason *string `json:"skip_reason"`
}

func (s *Server) replayDeadLetter(q *request) error {
	id, raw, err := deadLetterID(q)
	if err != nil {
		return err
	}
	var in struct {
		Force bool `json:"force"`
	}
	if q.r.ContentLength != 0 {
		if err := q.decode(&in); err != nil {
			return err
		}
	}
	var out replayResult
	err = pgx.BeginFunc(q.ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		o, err := deadletters.Replay(q.ctx, tx, deadletters.Selection{Tenant: q.scope(), IDs: []int64{id}},
			deadletters.Options{Force: in.Force})
		if err != nil {
			return deadLetterError(err, "dead letter", raw)
		}
		switch {
		case len(o.Replayed) == 1:
			out = replayResult{Replayed: true, DeliveryID: o.Replayed[0].DeliveryID}
			return audit.RecordAll(q.ctx, tx, deadletters.AuditReplays(o, q.actor(), deadletters.Options{Force: in.Force}))
		case len(o.Skipped) == 1:
			reason := string(o.Skipped[0].Reason)
			out = replayResult{DeliveryID: o.Skipped[0].DeliveryID, SkipReason: &reason}
			return nil
		}
		return errNotFound("dead letter", raw)
	})
	if err != nil {
		return err
	}
	if !out.Replayed {
		hint := ""
		if *out.SkipReason == string(deadletters.SkipAlreadyReplayed) {
			hint = `; send {"force": true} to replay it again`
		}
		return errConflict("dead letter %s was not replayed: %s%s", raw, *out.SkipReason, hint)
	}
	writeJSON(q.w, http.StatusOK, out)
	return nil
}

func (s *Server) startRecovery(q *request) error {
	endpointID := q.r.PathValue("id")
	var in struct {
		Since *time.Time `json:"since"`
	}
	if err := q.decode(&in); err != nil {
		return err
	}
	if in.Since == nil {
		return errInvalid("since", "since: required, an RFC 3339 time: the dead letters that failed since then are replayed")
	}
	var r deadletters.Recovery
	err := pgx.BeginFunc(q.ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		var running *deadletters.RunningError
		r, err = deadletters.StartRecovery(q.ctx, tx, endpointID, *in.Since, q.actor(), q.scope())
		switch {
		case errors.As(err, &running) && running.ID != "":
			q.w.Header().Set("Location", "/v1/recoveries/"+running.ID)
			return errConflict("endpoint %s has recovery %s running: GET /v1/recoveries/%s follows it, POST /v1/recoveries/%s/cancel stops it; one recovery runs per endpoint",
				running.EndpointID, running.ID, running.ID, running.ID)
		case errors.As(err, &running):
			return errConflict("%v", running)
		case err != nil:
			return deadLetterError(err, "endpoint", endpointID)
		}
		return audit.Record(q.ctx, tx, audit.Change{Actor: q.actor(), Tenant: r.Tenant, Action: "recovery.start",
			ObjectType: "recovery", ObjectID: r.ID, After: r})
	})
	if err != nil {
		return err
	}
	s.background(func(ctx context.Context) {
		if _, err := deadletters.RunRecovery(ctx, s.cfg.Pool, r.ID); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("recovery failed", zap.String("recovery_id", r.ID), zap.String("endpoint_id", r.EndpointID), zap.Error(err))
		}
	})
	q.w.Header().Set("Location", "/v1/recoveries/"+r.ID)
	writeJSON(q.w, http.StatusAccepted, r)
	return nil
}

// cancelRecovery stops a running recovery at its next batch; one that has ended is answered as
// it is, so that a cancel sent twice, or racing the job's end, is not an error.
func (s *Server) cancelRecovery(q *request) error {
	id := q.r.PathValue("id")
	var r deadletters.Recovery
	err := pgx.BeginFunc(q.ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		before, err := deadletters.GetRecovery(q.ctx, tx, id, q.scope())
		if err != nil {
			return deadLetterError(err, "recovery", id)
		}
		var cancelled bool
		r, cancelled, err = deadletters.CancelRecovery(q.ctx, tx, id, q.scope())
		if err != nil || !cancelled {
			return deadLetterError(err, "recovery", id)
		}
		return audit.Record(q.ctx, tx, audit.Change{Actor: q.actor(), Tenant: r.Tenant, Action: "recovery.cancel",
			ObjectType: "recovery", ObjectID: r.ID, Before: before, After: r})
	})
	if err != nil {
		return err
	}
	return s.writeRecovery(q, http.StatusOK, r)
}

func (s *Server) getRecovery(q *request) error {
	id := q.r.PathValue("id")
	r, err := deadletters.GetRecovery(q.ctx, s.cfg.Pool, id, q.scope())
	if err != nil {
		return deadLetterError(err, "recovery", id)
	}
	return s.writeRecovery(q, http.StatusOK, r)
}

// writeRecovery answers with r, its created_by as the caller may read it (a tenant reads
// "operator" for a job an operator started: see audit.VisibleActor).
func (s *Server) writeRecovery(q *request, status int, r deadletters.Recovery) error {
	by, err := audit.VisibleActor(q.ctx, s.cfg.Pool, q.scope(), r.CreatedBy)
	if err != nil {
		return err
	}
	r.CreatedBy = by
	writeJSON(q.w, status, r)
	return nil
}
