package deadletters

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/audit"
)

// Selection says which dead letters Replay and Purge act on: by reference (IDs and
// DeliveryIDs), or every row Matching matches; never both, never neither.
type Selection struct {
	// Tenant, when set, is the caller's tenant: other tenants' rows are not selected (a
	// reference to one is not found), enforced in the SQL. nil is every tenant.
	Tenant *string
	// IDs are row ids. A row named here is replayed even if a later dead letter of the same
	// delivery supersedes it: naming it is asking for it.
	IDs []int64
	// DeliveryIDs select every dead letter of each event (UUIDs, any case).
	DeliveryIDs []string
	// Matching selects every row it matches. It must set a condition besides Tenant: all
	// dead letters at once is never what was meant. Limit, After and IncludePayload do not
	// apply.
	Matching *Filter
}

// check returns an InvalidError for a selection that is not one: both kinds or neither,
// malformed references.
func (s Selection) check(verb string) error {
	switch {
	case s.Matching != nil && (len(s.IDs) > 0 || len(s.DeliveryIDs) > 0):
		return invalid("selection", "give ids or delivery ids, or a filter, not both")
	case s.Matching == nil && len(s.IDs) == 0 && len(s.DeliveryIDs) == 0:
		return invalid("selection", "nothing to %s: give ids, delivery ids or a filter", verb)
	case s.Matching != nil && (s.Matching.Limit != 0 || !s.Matching.After.IsZero()):
		return invalid("selection", "a filter to %s takes no limit or cursor: it acts on every row it matches", verb)
	}
	for _, id := range s.IDs {
		if id <= 0 {
			return invalid("ids", "%d is not a dead-letter id", id)
		}
	}
	for _, d := range s.DeliveryIDs {
		if _, ok := CanonicalUUID(d); !ok {
			return invalid("delivery_ids", "%q is not a UUID", d)
		}
	}
	return nil
}

// refArgs returns the selection's references, deduplicated and canonical, as lock.sql and
// purge.sql take them.
func (s Selection) refArgs() (ids []int64, deliveries []string, args pgx.NamedArgs) {
	for _, id := range s.IDs {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, d := range s.DeliveryIDs {
		c, _ := CanonicalUUID(d)
		if !slices.Contains(deliveries, c) {
			deliveries = append(deliveries, c)
		}
	}
	args = pgx.NamedArgs{"ids": nonNil(ids), "delivery_ids": nonNil(deliveries)}
	if s.Tenant != nil {
		args["scope"] = *s.Tenant
	}
	return ids, deliveries, args
}

// Options tune Replay.
type Options struct {
	// Force replays rows already replayed, which are otherwise skipped.
	Force bool
	// DryRun locks and sorts the rows as a replay would, and writes nothing: the Outcome is
	// what the replay would do.
	DryRun bool
	// ToEndpoint, a managed endpoint's id, sends every selected event there instead of to
	// its own destination, each event once, and only those of that endpoint's tenant. The
	// endpoint must exist (in the caller's scope) and be enabled: ErrEndpointNotFound,
	// ErrEndpointDisabled. "" sends each to its own.
	ToEndpoint string
}

// ErrEndpointNotFound and ErrEndpointDisabled are matched by the error for an endpoint that a
// replay or recovery cannot send to: one that does not exist in the caller's scope (another
// tenant's is not found either), or one that is disabled, where the events would only be
// dead-lettered again. Nothing was replayed.
var (
	ErrEndpointNotFound = errors.New("endpoint not found")
	ErrEndpointDisabled = errors.New("endpoint disabled")
)

// Ref names a dead letter: its row id and its event's delivery id.
type Ref struct {
	ID         int64  `json:"id"`
	DeliveryID string `json:"delivery_id"`
}

// Row is a dead letter as Replay found it, locked, before replaying it or not.
type Row struct {
	Ref
	EventType string `json:"event_type"`
	// EndpointID is the dead letter's own managed endpoint, nil for none.
	EndpointID *string `json:"endpoint_id"`
	// Tenant is the event's tenant, nil for none.
	Tenant *string `json:"tenant"`
	// ReplayedAt is when it was last replayed before this replay, nil for never.
	ReplayedAt *time.Time `json:"replayed_at"`
}

// SkipReason says why Replay left a selected dead letter alone.
type SkipReason string

// The reasons, in the order the CLI reports them.
const (
	// SkipAlreadyReplayed: it was replayed before (ReplayedAt); Options.Force replays it.
	SkipAlreadyReplayed SkipReason = "already_replayed"
	// SkipSuperseded: selected by delivery id or filter, not by its row id, while a later
	// dead letter of the same delivery to the same destination (SupersededBy) stands for
	// it: replaying both would send the event there twice. Naming it by id replays it.
	SkipSuperseded SkipReason = "superseded"
	// SkipEndpointRemoved: its managed endpoint no longer exists; replayed there the event
	// would only fail again. Options.ToEndpoint sends it elsewhere.
	SkipEndpointRemoved SkipReason = "endpoint_removed"
	// SkipSameEvent: with ToEndpoint, another dead letter of the same event (one per endpoint
	// of a fan-out) already goes there in this replay: one event goes to one endpoint once.
	SkipSameEvent SkipReason = "same_event"
	// SkipOtherTenant: with ToEndpoint, the event's tenant is not that endpoint's. Events
	// never cross tenants.
	SkipOtherTenant SkipReason = "other_tenant"
	// SkipEndpointOtherTenant: its own managed endpoint now belongs to another tenant
	// (EndpointTenant); the event never goes there again. ToEndpoint sends it to an endpoint
	// of its tenant. Only an unscoped caller (the CLI, an admin key) is told so: for a
	// tenant's caller the endpoint is gone from its tenant, and the reason is
	// SkipEndpointRemoved, exactly as for one removed, so that it never learns that its old
	// endpoint lives on under someone else.
	SkipEndpointOtherTenant SkipReason = "endpoint_other_tenant"
	// SkipURLTooLong: its endpoint_url (a producer's own URL) is longer than the outbox takes
	// since schema 21 (outbox.MaxEndpointURLBytes); only a dead letter written before can hold
	// one. Options.ToEndpoint replays it to a managed endpoint instead.
	SkipURLTooLong SkipReason = "url_too_long"
)

// SkipReasons lists every SkipReason in the order the CLI reports them.
var SkipReasons = []SkipReason{SkipAlreadyReplayed, SkipSuperseded, SkipEndpointRemoved, SkipSameEvent,
	SkipOtherTenant, SkipEndpointOtherTenant, SkipURLTooLong}

// Skip is a selected dead letter that Replay left alone, and why.
type Skip struct {
	Row
	Reason SkipReason `json:"reason"`
	// SupersededBy is, for SkipSuperseded, the later dead letter that stands for this one.
	SupersededBy *int64 `json:"superseded_by,omitempty"`
	// EndpointTenant is, for SkipEndpointOtherTenant (which only an unscoped caller gets),
	// the endpoint's tenant now (nil for none).
	EndpointTenant *string `json:"endpoint_tenant,omitempty"`
}

// Target is the endpoint Options.ToEndpoint named.
type Target struct {
	ID     string  `json:"id"`
	Tenant *string `json:"tenant"`
	// Ordered: the endpoint orders streams, so replayed events keep their order keys.
	Ordered bool `json:"ordered"`
}

// Outcome is what Replay did, or with DryRun would do: the rows replayed (each re-enqueued
// with its delivery id as a new first attempt, and marked replayed) and the rows skipped,
// each in row id order.
type Outcome struct {
	Replayed []Row  `json:"replayed"`
	Skipped  []Skip `json:"skipped"`
	// Target is Options.ToEndpoint's endpoint, nil without it.
	Target *Target `json:"target,omitempty"`
	DryRun bool    `json:"dry_run"`
}

// Rows returns every row the selection found, replayed or skipped, in row id order.
func (o *Outcome) Rows() []Row {
	rows := make([]Row, 0, len(o.Replayed)+len(o.Skipped))
	rows = append(rows, o.Replayed...)
	for _, s := range o.Skipped {
		rows = append(rows, s.Row)
	}
	slices.SortFunc(rows, func(a, b Row) int { return cmp.Compare(a.ID, b.ID) })
	return rows
}

// SkippedFor returns the rows skipped for reason, in row id order.
func (o *Outcome) SkippedFor(reason SkipReason) []Skip {
	var out []Skip
	for _, s := range o.Skipped {
		if s.Reason == reason {
			out = append(out, s)
		}
	}
	return out
}

// locked is a row of lock.sql.
type locked struct {
	Row
	supersededBy        *int64
	endpointRemoved     bool
	endpointOtherTenant bool
	endpointTenant      *string
	urlTooLong          bool
}

// Replay re-enqueues the selected dead letters, in tx, as `fluxhook dlq replay` does: each as
// a new first attempt of the same event (same delivery id, payload and enqueue time, so that
// consumers deduplicate it), due now, to its own destination or to opts.ToEndpoint, and marks
// it replayed. An ordered stream's event goes back to its place at the head of its stream,
// and a stream stopped at this dead letter goes on from it.
//
// The rows are locked until tx ends, so that concurrent replays of one dead letter (two
// operators, two recovery jobs) re-enqueue it once: the later one finds it replayed. What is
// skipped, and why, is in the Outcome (see SkipReason). A referenced row or delivery id that
// does not exist in the selection's tenant fails the whole replay with a NotFoundError,
// before anything is written; so do ErrEndpointNotFound and ErrEndpointDisabled for
// ToEndpoint. On any error the caller must roll tx back.
func Replay(ctx context.Context, tx pgx.Tx, sel Selection, opts Options) (Outcome, error) {
	if err := sel.check("replay"); err != nil {
		return Outcome{}, err
	}
	return replay(ctx, tx, sel, opts, false)
}

// replay is Replay. With candidates, sel.IDs are rows a recovery's batch read, not rows a
// caller named: a superseded one is skipped as with a filter, and one gone meanwhile (purged)
// is no error.
func replay(ctx context.Context, tx pgx.Tx, sel Selection, opts Options, candidates bool) (Outcome, error) {
	var text string
	var args pgx.NamedArgs
	var ids []int64
	var deliveries []string
	if sel.Matching != nil {
		if sel.Matching.empty() {
			return Outcome{}, invalid("selection", "a filter to replay needs a condition besides the tenant: replaying every dead letter at once is never what was meant")
		}
		s, a, err := sel.Matching.conditions(sel.Tenant)
		if err != nil {
			return Outcome{}, err
		}
		text, args = render("lock.sql", s), a
	} else {
		ids, deliveries, args = sel.refArgs()
		text = render("lock.sql", shape{ByRef: true, Scope: sel.Tenant != nil})
	}
	rows, _ := tx.Query(ctx, text, args)
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (locked, error) {
		var l locked
		return l, r.Scan(&l.ID, &l.DeliveryID, &l.EventType, &l.ReplayedAt, &l.EndpointID, &l.supersededBy,
			&l.Tenant, &l.endpointRemoved, &l.endpointOtherTenant, &l.endpointTenant, &l.urlTooLong)
	})
	if err != nil {
		return Outcome{}, fmt.Errorf("reading dead letters: %w", err)
	}
	out := Outcome{DryRun: opts.DryRun}
	if opts.ToEndpoint != "" {
		if out.Target, err = lockTarget(ctx, tx, opts.ToEndpoint, sel.Tenant); err != nil {
			return Outcome{}, err
		}
	}
	if !candidates {
		if err := missing(ids, deliveries, found); err != nil {
			return Outcome{}, fmt.Errorf("%w; nothing replayed", err)
		}
	}
	target := out.Target
	toTarget := map[string]bool{} // delivery ids replayed so far (to the target, with one)
	for _, l := range found {
		skip := Skip{Row: l.Row}
		switch {
		case l.ReplayedAt != nil && !opts.Force:
			skip.Reason = SkipAlreadyReplayed
		case target == nil && l.endpointRemoved:
			skip.Reason = SkipEndpointRemoved
		case target == nil && l.endpointOtherTenant && sel.Tenant != nil:
			skip.Reason = SkipEndpointRemoved
		case target == nil && l.endpointOtherTenant:
			skip.Reason, skip.EndpointTenant = SkipEndpointOtherTenant, l.endpointTenant
		case target == nil && l.urlTooLong:
			skip.Reason = SkipURLTooLong
		case target != nil && !sameTenant(l.Tenant, target.Tenant):
			skip.Reason = SkipOtherTenant
		case target != nil && toTarget[l.DeliveryID]:
			// An event fanned out to several endpoints has a dead letter for each: to one
			// target it goes once.
			skip.Reason = SkipSameEvent
		case l.supersededBy != nil && (candidates || !slices.Contains(ids, l.ID)):
			// Selected through its delivery id or a filter, not by name: the newer dead
			// letter stands for this delivery to this endpoint, and replaying both would
			// send the event there twice in one go.
			skip.Reason, skip.SupersededBy = SkipSuperseded, l.supersededBy
		default:
			out.Replayed = append(out.Replayed, l.Row)
			toTarget[l.DeliveryID] = true
			continue
		}
		out.Skipped = append(out.Skipped, skip)
	}
	if opts.DryRun || len(out.Replayed) == 0 {
		return out, nil
	}
	replayIDs := make([]int64, len(out.Replayed))
	for i, r := range out.Replayed {
		replayIDs[i] = r.ID
	}
	var targetID any
	ordered := false
	if target != nil {
		targetID, ordered = target.ID, target.Ordered
	}
	var n int64
	var keyless []int64
	if err := tx.QueryRow(ctx, waitStreamsSQL, replayIDs, targetID).Scan(&n); err != nil {
		return Outcome{}, fmt.Errorf("replaying: waiting for the claims of the streams the events rejoin: %w", err)
	}
	if err := tx.QueryRow(ctx, replaySQL, replayIDs, targetID, ordered).Scan(&n, &keyless); err != nil {
		return Outcome{}, fmt.Errorf("replaying: %w", err)
	}
	if n != int64(len(out.Replayed)) {
		return Outcome{}, fmt.Errorf("replaying: wrote %d outbox rows for %d dead letters; rolled back", n, len(out.Replayed))
	}
	if len(keyless) > 0 {
		if _, err := tx.Exec(ctx, keyJoinedSQL, keyless); err != nil {
			return Outcome{}, fmt.Errorf("replaying: keying the events that join an ordered stream: %w", err)
		}
	}
	return out, nil
}

// missing returns a NotFoundError naming the row ids not found and the delivery ids without a
// dead letter, or nil when every reference found something.
func missing(ids []int64, deliveries []string, found []locked) error {
	var e NotFoundError
	for _, id := range ids {
		if !slices.ContainsFunc(found, func(l locked) bool { return l.ID == id }) {
			e.IDs = append(e.IDs, id)
		}
	}
	for _, d := range deliveries {
		if !slices.ContainsFunc(found, func(l locked) bool { return l.DeliveryID == d }) {
			e.DeliveryIDs = append(e.DeliveryIDs, d)
		}
	}
	if len(e.IDs) == 0 && len(e.DeliveryIDs) == 0 {
		return nil
	}
	return &e
}

// lockTarget reads and locks (against removal, disabling or a tenant change until the replay
// commits) the endpoint ToEndpoint names, refusing one that does not exist in scope or is
// disabled: a replay to it would only be dead-lettered again.
func lockTarget(ctx context.Context, tx pgx.Tx, id string, scope *string) (*Target, error) {
	canonical, ok := CanonicalUUID(id)
	if !ok {
		return nil, invalid("to_endpoint", "%q is not a UUID", id)
	}
	t := &Target{ID: canonical}
	var enabled bool
	err := tx.QueryRow(ctx, targetSQL, canonical, scope).Scan(&t.Tenant, &enabled, &t.Ordered)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrEndpointNotFound, canonical)
	}
	if err != nil {
		return nil, fmt.Errorf("reading endpoint %s: %w", canonical, err)
	}
	if !enabled {
		return nil, fmt.Errorf("%w: %s", ErrEndpointDisabled, canonical)
	}
	return t, nil
}

// sameTenant says whether an event of tenant a may go to an endpoint of tenant b: both
// without one, or the same one. Never across tenants, replays included.
func sameTenant(a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// AuditReplays is the audit trail's record of o: one entry per dead letter replayed, by actor,
// naming the event and where it went (its own endpoint, or ToEndpoint). A dry run changes
// nothing and records nothing.
func AuditReplays(o Outcome, actor string, opts Options) []audit.Change {
	if o.DryRun {
		return nil
	}
	out := make([]audit.Change, 0, len(o.Replayed))
	for _, r := range o.Replayed {
		after := map[string]any{"delivery_id": r.DeliveryID, "event_type": r.EventType, "force": opts.Force}
		if opts.ToEndpoint != "" {
			after["to_endpoint"] = opts.ToEndpoint
		}
		out = append(out, audit.Change{Actor: actor, Tenant: r.Tenant, Action: "dead_letter.replay",
			ObjectType: "dead_letter", ObjectID: strconv.FormatInt(r.ID, 10), After: after})
	}
	return out
}
