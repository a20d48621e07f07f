package api

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/events"
)

// defaultWindow is how far back a listing reaches without ?since: listings read the delivery
// log by time, and a range without a start would read all of it.
const defaultWindow = 24 * time.Hour

// maxWindow is how far back from its end (until, or now) a listing may reach: a page of events
// widens its window, and a page of an endpoint's deliveries walks its index, until it is full,
// so a sparse filter over a range of years would read the whole log, every partition the
// retention keeps, for one request. Older ranges are read a window of
// at most this at a time, with since and until.
const maxWindow = 31 * 24 * time.Hour

// eventView is an event in a listing: what the producer enqueued, without its payload.
type eventView struct {
	DeliveryID string    `json:"delivery_id"`
	EventType  string    `json:"event_type"`
	StreamID   *string   `json:"stream_id"`
	Tenant     *string   `json:"tenant"`
	EnqueuedAt time.Time `json:"enqueued_at"`
}

func eventViewOf(e events.Event) eventView {
	return eventView{DeliveryID: e.DeliveryID, EventType: e.EventType, StreamID: e.StreamID, Tenant: e.Tenant,
		EnqueuedAt: e.EnqueuedAt}
}

// eventDetail answers GET /v1/events/{delivery_id}: the event with its payload and where it
// went. deliveryDetail answers GET /v1/deliveries/{delivery_id}: the same event without its
// payload, each destination with every attempt.
type eventDetail struct {
	eventView
	RoutedAt     *time.Time        `json:"routed_at"`
	Payload      json.RawMessage   `json:"payload"`
	Destinations []destinationView `json:"destinations"`
}

type deliveryDetail struct {
	eventView
	RoutedAt     *time.Time            `json:"routed_at"`
	Destinations []destinationAttempts `json:"destinations"`
}

// destinationView is one destination of an event. A URL is shown by its origin alone
// (scheme://host:port): producers and operators put tokens in paths and queries, and a tenant
// key must not read the operator's WEBHOOK_URL in full.
type destinationView struct {
	// Destination is endpoint (managed), endpoint_url (the row's own URL) or webhook_url
	// (the dispatchers' WEBHOOK_URL).
	Destination   string          `json:"destination"`
	EndpointID    *string         `json:"endpoint_id"`
	Origin        *string         `json:"origin"`
	State         string          `json:"state"`
	AttemptCount  int             `json:"attempt_count"`
	LastStatus    *int            `json:"last_status"`
	LastAttemptAt *time.Time      `json:"last_attempt_at"`
	NextAttemptAt *time.Time      `json:"next_attempt_at"`
	DeadLetter    *deadLetterView `json:"dead_letter"`
}

type destinationAttempts struct {
	destinationView
	Attempts []attemptView `json:"attempts"`
}

type deadLetterView struct {
	ID         int64      `json:"id"`
	Reason     string     `json:"reason"`
	FailedAt   time.Time  `json:"failed_at"`
	ReplayedAt *time.Time `json:"replayed_at"`
}

type attemptView struct {
	Attempt     int       `json:"attempt"`
	ProcessedAt time.Time `json:"processed_at"`
	DurationMS  *int      `json:"duration_ms"`
	StatusCode  *int      `json:"status_code"`
	Error       *string   `json:"error"`
	// ResponseExcerpt is the start of the consumer's answer; always null until the log keeps
	// it (see rows.sql in sql/events).
	ResponseExcerpt *string `json:"response_excerpt"`
	Outcome         string  `json:"outcome"`
}

// origin is raw's scheme, host and port, the port spelled out even when it is the scheme's
// default, so that two URLs of one server read the same; nil for what is not a URL.
func origin(raw string) *string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Hostname() == "" {
		return nil
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[scheme]
	}
	o := scheme + "://" + host
	if port != "" {
		o = scheme + "://" + net.JoinHostPort(host, port)
	}
	return &o
}

func (s *Server) destinationOf(d events.Destination) destinationView {
	v := destinationView{EndpointID: d.EndpointID, State: d.State, AttemptCount: len(d.Attempts), NextAttemptAt: d.NextAttemptAt}
	switch {
	case d.EndpointID != nil:
		v.Destination = "endpoint"
	case d.URL != nil:
		v.Destination, v.Origin = "endpoint_url", origin(*d.URL)
	default:
		v.Destination = "webhook_url"
		if s.cfg.DefaultURL != "" {
			v.Origin = origin(s.cfg.DefaultURL)
		}
	}
	if n := len(d.Attempts); n > 0 {
		last := d.Attempts[n-1]
		v.LastStatus, v.LastAttemptAt = last.StatusCode, &last.ProcessedAt
	}
	if dl := d.DeadLetter; dl != nil {
		v.DeadLetter = &deadLetterView{ID: dl.ID, Reason: dl.Reason, FailedAt: dl.FailedAt, ReplayedAt: dl.ReplayedAt}
	}
	return v
}

// getDetail reads the event named by the path in the caller's scope: another tenant's is not
// found, as one that does not exist.
func (s *Server) getDetail(q *request, what string, payload bool) (events.Detail, error) {
	id := q.r.PathValue("delivery_id")
	d, err := events.Get(q.ctx, s.cfg.Pool, id, q.scope(), payload)
	if errors.Is(err, events.ErrNotFound) {
		return d, errNotFound(what, id)
	}
	return d, err
}

func (s *Server) getEvent(q *request) error {
	d, err := s.getDetail(q, "event", true)
	if err != nil {
		return err
	}
	out := eventDetail{eventView: eventViewOf(d.Event), RoutedAt: d.RoutedAt, Payload: d.Payload,
		Destinations: make([]destinationView, 0, len(d.Destinations))}
	for _, dst := range d.Destinations {
		out.Destinations = append(out.Destinations, s.destinationOf(dst))
	}
	writeJSON(q.w, http.StatusOK, out)
	return nil
}

func (s *Server) getDelivery(q *request) error {
	d, err := s.getDetail(q, "delivery", false)
	if err != nil {
		return err
	}
	out := deliveryDetail{eventView: eventViewOf(d.Event), RoutedAt: d.RoutedAt,
		Destinations: make([]destinationAttempts, 0, len(d.Destinations))}
	for _, dst := range d.Destinations {
		v := destinationAttempts{destinationView: s.destinationOf(dst), Attempts: make([]attemptView, 0, len(dst.Attempts))}
		for _, a := range dst.Attempts {
			v.Attempts = append(v.Attempts, attemptView{Attempt: a.Attempt, ProcessedAt: a.ProcessedAt, DurationMS: a.DurationMS,
				StatusCode: a.StatusCode, Error: a.Error, ResponseExcerpt: a.ResponseExcerpt, Outcome: a.Outcome})
		}
		out.Destinations = append(out.Destinations, v)
	}
	writeJSON(q.w, http.StatusOK, out)
	return nil
}

// window reads ?since and ?until, since defaulting to defaultWindow before until (or now), and
// at most maxWindow before until (or now, when until is later).
func (q *request) window() (since, until time.Time, err error) {
	if since, err = q.timeParam("since"); err != nil {
		return
	}
	if until, err = q.timeParam("until"); err != nil {
		return
	}
	// An absent since takes the default; a given one is held to maxWindow, 0001-01-01 (the
	// zero time) too.
	if q.r.URL.Query().Get("since") == "" {
		end := until
		if end.IsZero() {
			end = q.s.cfg.Now()
		}
		since = end.Add(-defaultWindow)
	}
	if !until.IsZero() && !since.Before(until) {
		return since, until, errInvalid("since", "since: must be before until")
	}
	end := q.s.cfg.Now()
	if !until.IsZero() && until.Before(end) {
		end = until
	}
	if end.Sub(since) > maxWindow {
		return since, until, errInvalid("since", "since: at most %d days before until (or now): a listing reads the delivery log by time; read an older range with since and until, %d days at a time",
			int(maxWindow.Hours()/24), int(maxWindow.Hours()/24))
	}
	return since, until, nil
}

// optional is the query parameter name, nil when absent or empty.
func (q *request) optional(name string) *string {
	if v := q.r.URL.Query().Get(name); v != "" {
		return &v
	}
	return nil
}

func (s *Server) listEvents(q *request) error {
	limit, err := q.limit()
	if err != nil {
		return err
	}
	since, until, err := q.window()
	if err != nil {
		return err
	}
	lq := events.ListQuery{Scope: q.scope(), Tenant: q.tenantParam(), EventType: q.optional("event_type"),
		StreamID: q.optional("stream_id"), Since: since, Until: until, Limit: limit + 1, Now: s.cfg.Now()}
	var c struct {
		EnqueuedAt time.Time `json:"e"`
		ID         string    `json:"d"`
	}
	if ok, err := q.cursor(&c); err != nil {
		return err
	} else if ok {
		if c.EnqueuedAt.IsZero() || !events.ValidID(c.ID) {
			return errBadCursor
		}
		lq.AfterEnqueuedAt, lq.AfterID = c.EnqueuedAt, c.ID
	}
	list, err := events.List(q.ctx, s.cfg.Pool, lq)
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, pageOf(list, limit, eventViewOf, func(last events.Event) *string {
		c.EnqueuedAt, c.ID = last.EnqueuedAt, last.DeliveryID
		return encodeCursor(c)
	}))
	return nil
}

// endpointDelivery is one row of an endpoint's deliveries: a settled attempt, or the one
// pending.
type endpointDelivery struct {
	DeliveryID    string     `json:"delivery_id"`
	EventType     string     `json:"event_type"`
	Attempt       int        `json:"attempt"`
	Status        string     `json:"status"`
	ProcessedAt   *time.Time `json:"processed_at"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	StatusCode    *int       `json:"status_code"`
	Error         *string    `json:"error"`
	DurationMS    *int       `json:"duration_ms"`
	EnqueuedAt    time.Time  `json:"enqueued_at"`
}

// deliveryStatuses are the values of ?status of an endpoint's deliveries.
var deliveryStatuses = []string{events.OutcomeDelivered, events.OutcomeFailed, events.StatePending, events.OutcomeDeadLettered}

func (s *Server) listEndpointDeliveries(q *request) error {
	id := q.r.PathValue("id")
	limit, err := q.limit()
	if err != nil {
		return err
	}
	since, until, err := q.window()
	if err != nil {
		return err
	}
	status := q.optional("status")
	if status != nil && !slices.Contains(deliveryStatuses, *status) {
		return errInvalid("status", "status: must be one of %s, not %q", strings.Join(deliveryStatuses, ", "), *status)
	}
	eq := events.EndpointQuery{EndpointID: id, Scope: q.scope(), Status: status, EventType: q.optional("event_type"),
		Since: since, Until: until, Limit: limit + 1}
	var c struct {
		At time.Time `json:"t"`
		ID int64     `json:"i"`
	}
	if ok, err := q.cursor(&c); err != nil {
		return err
	} else if ok {
		if c.At.IsZero() {
			return errBadCursor
		}
		eq.AfterAt, eq.AfterID = c.At, c.ID
	}
	if !events.ValidID(id) {
		return storeError(endpoints.ErrNotFound, id)
	}
	list, err := events.EndpointDeliveries(q.ctx, s.cfg.Pool, eq)
	if err != nil {
		return err
	}
	// A page is empty when the endpoint is not in the scope: only then is it looked up, so
	// that a page costs one statement.
	if len(list) == 0 {
		if err := s.endpointInScope(q, id); err != nil {
			return err
		}
	}
	out := pageOf(list, limit, func(d events.Delivery) endpointDelivery {
		return endpointDelivery{DeliveryID: d.DeliveryID, EventType: d.EventType, Attempt: d.Attempt,
			Status: d.Status, ProcessedAt: d.ProcessedAt, NextAttemptAt: d.DueAt, StatusCode: d.StatusCode, Error: d.Error,
			DurationMS: d.DurationMS, EnqueuedAt: d.EnqueuedAt}
	}, func(last events.Delivery) *string {
		c.At, c.ID = last.At, last.ID
		return encodeCursor(c)
	})
	writeJSON(q.w, http.StatusOK, out)
	return nil
}

// endpointInScope answers 404 unless the endpoint id exists in the caller's scope, without
// locking it: a read must neither wait behind nor hold up a change to the endpoint.
func (s *Server) endpointInScope(q *request, id string) error {
	if !events.ValidID(id) {
		return storeError(endpoints.ErrNotFound, id)
	}
	var found bool
	err := s.cfg.Pool.QueryRow(q.ctx, `SELECT EXISTS (SELECT 1 FROM webhook_endpoints WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2))`,
		id, q.scope()).Scan(&found)
	if err != nil {
		return err
	}
	if !found {
		return errNotFound("endpoint", id)
	}
	return nil
}
