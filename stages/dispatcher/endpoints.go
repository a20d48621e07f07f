package dispatcher

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/send"
	"github.com/fluxora/fluxhook/stages/settle"
	"github.com/fluxora/fluxhook/stages/sign"
)

var (
	//go:embed endpoint_outcomes.sql
	endpointOutcomesSQL string
	//go:embed endpoint_disable.sql
	endpointDisableSQL string
)

// managed is one endpoint of webhook_endpoints as the dispatcher uses it: validated once per
// load, its signer keyed once, so that no delivery pays for either.
type managed struct {
	ep     endpoints.Endpoint
	target *delivery.Endpoint
	signer *sign.Signer
	header http.Header
	// invalid, when set, is why the endpoint cannot be delivered to (a URL that no longer
	// validates, a secret that does not open): its deliveries are dead-lettered with it.
	invalid string
	// signerUntil is when the previous secret stops signing: the cache is reloaded then.
	signerUntil time.Time
	// previousRefused, when set, is why the previous secret (in its grace) does not sign
	// beside the current one, which still does.
	previousRefused string
}

// endpointCache holds the managed endpoints, loaded at the version of webhook_endpoints the
// latest claim reported and reloaded when it moves (every change to the table, by SQL or the
// CLI, bumps it) or when a previous secret's grace ends.
type endpointCache struct {
	// version is the endpoints' version the claiming loop saw last; loaded the one the
	// cache holds. xmin is the last claim's snapshot's xmin (claim.Snapshot.Xmin).
	version    atomic.Int64
	xmin       atomic.Uint64
	refreshing sync.Mutex  // held through a refresh (refreshEndpoints)
	forceCheck atomic.Bool // read the endpoints again at the next refresh, version or not
	mu         sync.Mutex
	loaded     int64
	// confirmed says the cache holds every change up to the version loaded, so that events
	// may be routed by it (routeInMemory). The version is a sequence, bumped by the changing
	// transaction before it commits: a load may see the new version and the old rows, and
	// would keep them until the next change. So after a load for a new version the cache is
	// loaded once more, confirming it, as soon as a claim's snapshot shows that every
	// transaction that could have bumped the version has ended (its xmin has reached
	// confirmAfter, a transaction id assigned after the version was read).
	confirmed    bool
	confirmAfter uint64
	reload       time.Time // when a grace ends; zero: none pending
	// checked is when the endpoints were last read (see Config.EndpointRecheck).
	checked time.Time
	// stored counts the loads stored (see freshen).
	stored uint64
	byID   map[string]*managed
	// ordered: some enabled endpoint orders its streams.
	ordered bool
	// enabled are the enabled endpoints by id, in route.sql's order of an event's deliveries
	// (routeInMemory's list, built once per load).
	enabled []*managed
	// enabledAt remembers which endpoints were enabled at the previous load, to dead-letter
	// the pending deliveries of one that has just been disabled.
	enabledAt map[string]bool
}

// newManaged validates ep, as loaded with loadErr, and keys its signer.
func newManaged(ep endpoints.Endpoint, loadErr error, now time.Time) *managed {
	m := &managed{ep: ep, header: ep.Header()}
	if loadErr != nil {
		m.invalid = misconfigured(ep.ID, loadErr)
		return m
	}
	if err := endpoints.Sendable(&m.ep); err != nil {
		m.invalid = misconfigured(ep.ID, err)
		return m
	}
	var err error
	if m.target, err = send.ManagedEndpoint(m.ep.URL, "ep:"+m.ep.ID, m.ep.MaxConcurrency); err != nil {
		m.invalid = misconfigured(ep.ID, err)
		return m
	}
	m.target.RetryRPS, m.target.PermanentStatuses = m.ep.RetryRPS, m.ep.PermanentStatuses
	m.target.Managed, m.target.Tenant, m.target.EmptyTenant = true, m.ep.Tenant, m.ep.EmptyTenant
	// A tenant wrote this URL (the management API): it is dialled under the row-URL policy,
	// as a producer's endpoint_url is, not the operator's, so that a tenant's endpoint
	// cannot reach this host's or the private network's services.
	m.target.RowURL = m.ep.Restricted
	cfg := sign.Config{Secret: m.ep.Secret, Scheme: sign.Scheme(m.ep.Scheme), Names: [2]string{"secret", "previous_secret"}}
	if m.ep.PreviousSecret != "" && now.Before(m.ep.PreviousUntil) {
		cfg.PreviousSecret = m.ep.PreviousSecret
		m.signerUntil = m.ep.PreviousUntil
	}
	m.signer, err = sign.New(cfg)
	if prev := (*sign.PreviousError)(nil); errors.As(err, &prev) {
		// The previous secret only adds a signature for consumers not yet moved to the
		// current one: the current one still signs, and the previous one's fault is logged.
		m.previousRefused = strings.TrimPrefix(err.Error(), "sign: ")
		cfg.PreviousSecret = ""
		m.signer, err = sign.New(cfg)
	}
	if err != nil {
		m.invalid = misconfigured(ep.ID, errors.New(strings.TrimPrefix(err.Error(), "sign: ")))
	}
	return m
}

// misconfiguredText marks the dead-letter reason of a delivery whose managed endpoint cannot
// be delivered to as it is stored (deadLetterClass counts it as endpoint_invalid).
const misconfiguredText = " is misconfigured: "

// misconfiguredReason reports whether reason is misconfigured's: "endpoint <uuid>" and the
// marker, where the id is, so that no text an operator wrote (a disable reason) reads as one.
func misconfiguredReason(reason string) bool {
	const idLen = 36
	rest, ok := strings.CutPrefix(reason, "endpoint ")
	return ok && len(rest) > idLen && strings.HasPrefix(rest[idLen:], misconfiguredText)
}

// misconfigured is the reason for an endpoint that cannot be delivered to: its id and why,
// without the "endpoint <id>: " that the load's errors start with.
func misconfigured(id string, err error) string {
	return "endpoint " + id + misconfiguredText + strings.TrimPrefix(err.Error(), "endpoint "+id+": ")
}

// warnMisconfigured logs, once per instance and reason, each endpoint of byID that cannot be
// delivered to (or whose previous secret cannot sign) while it could, or for another reason,
// in previous: written by SQL, such an endpoint would otherwise show itself only in its dead
// letters. The reason names no value and, for a URL, at most its host.
func (d *Dispatcher) warnMisconfigured(previous, byID map[string]*managed) {
	for id, m := range byID {
		was := previous[id]
		if m.invalid != "" && (was == nil || was.invalid != m.invalid) {
			d.log.Warn("endpoint cannot be delivered to",
				zap.String("endpoint_id", id), zap.Bool("enabled", m.ep.Enabled), zap.String("reason", m.invalid))
		}
		if m.previousRefused != "" && (was == nil || was.previousRefused != m.previousRefused) {
			d.log.Warn("endpoint signs with its current secret only",
				zap.String("endpoint_id", id), zap.String("reason", m.previousRefused))
		}
	}
}

// freshen reads again, by id, the endpoints of batch's managed deliveries when the cache is
// not confirmed at the version the claim saw, and puts what it reads in the cache. An
// unconfirmed cache may hold rows older than a change committed before these rows were
// claimed (its load ran while the change was open): routing already goes by the statement
// then, and the request must too, so that no delivery is signed with a rotated-out secret or
// sent to a replaced URL. One primary-key read per batch, only while a long transaction
// elsewhere on the server holds the confirmation back.
//
// A load the claiming loop stores while this one reads was read after the batch's claim (that
// loop refreshes only after handing the batch on): it serves the batch, and this older read
// must not replace it, least of all in a cache that load confirmed.
func (d *Dispatcher) freshen(ctx context.Context, batch []*delivery.Delivery) {
	c := &d.endpoints
	c.mu.Lock()
	confirmed, stored := c.confirmed && c.loaded == c.version.Load(), c.stored
	c.mu.Unlock()
	if confirmed {
		return
	}
	ids := make([]string, 0, 4)
	for _, del := range batch {
		if del.EndpointID != "" && !slices.Contains(ids, del.EndpointID) {
			ids = append(ids, del.EndpointID)
		}
	}
	if len(ids) == 0 {
		return
	}
	list, errs, err := endpoints.LoadIDs(ctx, d.pool, d.cipher, ids)
	if err != nil {
		// Released and claimed again rather than sent by a cache that may be stale.
		if ctx.Err() == nil {
			d.log.Warn("reading endpoints failed; their deliveries are claimed again", zap.Error(err))
		}
		for _, del := range batch {
			if del.EndpointID != "" {
				del.Invalid = endpointsUnread
			}
		}
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stored != stored {
		return
	}
	byID := maps.Clone(c.byID)
	for _, id := range ids {
		delete(byID, id) // removed since the load, unless read below
	}
	for i := range list {
		m := newManaged(list[i], errs[i], now)
		byID[m.ep.ID] = m
		if !m.signerUntil.IsZero() && (c.reload.IsZero() || m.signerUntil.Before(c.reload)) {
			c.reload = m.signerUntil
		}
	}
	d.warnMisconfigured(c.byID, byID)
	c.byID = byID
}

// refreshEndpoints reloads the endpoints when the claim saw another version or a grace ended,
// and dead-letters the pending deliveries of those disabled since the previous load (by the
// CLI or SQL; the dispatcher's own disabling does it at once).
func (d *Dispatcher) refreshEndpoints(ctx context.Context) {
	c := &d.endpoints
	// The claiming loop and the preparing stage both refresh: one at a time, so that a change
	// of state (an endpoint disabled) is acted on once, and the second finds the cache fresh.
	// What a load found to act on (dead-lettering, checking the ids) runs after the lock is
	// let go: those statements may wait on rows or locks, and the other refresher (a claim, or a batch being prepared)
	// must not wait behind them.
	c.refreshing.Lock()
	confirmNow, then := d.refreshOnce(ctx)
	if confirmNow {
		_, more := d.refreshOnce(ctx)
		then = append(then, more...)
	}
	c.refreshing.Unlock()
	for _, act := range then {
		act()
	}
}

// refreshOnce is one step of refreshEndpoints; it reports whether the cache, just loaded for a
// new version, can be confirmed at once by another load, and returns what the load found to
// act on, for the caller to run outside the refresh lock.
func (d *Dispatcher) refreshOnce(ctx context.Context) (confirmNow bool, then []func()) {
	c := &d.endpoints
	want := c.version.Load()
	c.mu.Lock()
	moved := want != c.loaded
	confirming := !moved && !c.confirmed && c.confirmAfter != 0 && c.xmin.Load() >= c.confirmAfter
	// Never read (version 0, as after a restore with triggers disabled, which bumps nothing):
	// read now, or endpoints that no version announces would never be loaded.
	recheck := c.forceCheck.Swap(false) || c.checked.IsZero() || time.Since(c.checked) >= d.cfg.EndpointRecheck
	stale := moved || confirming || recheck || !c.reload.IsZero() && time.Now().After(c.reload)
	previous := c.byID
	c.mu.Unlock()
	if !stale {
		return false, nil
	}
	var after uint64
	if moved || recheck {
		// A transaction id assigned after the claim read want: every transaction that bumped
		// the version up to want had its id by then, below this one. Not a snapshot's xmax,
		// which is one past the latest transaction to have ended: a bumping transaction
		// still open with the newest id is at or above it, and a snapshot's xmin would
		// reach it with the change still uncommitted.
		if err := d.pool.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&after); err != nil {
			d.log.Warn("loading endpoints failed; deliveries to them wait", zap.Error(err))
			return false, nil
		}
	}
	list, errs, err := endpoints.LoadAll(ctx, d.pool, d.cipher)
	if err != nil {
		d.log.Warn("loading endpoints failed; deliveries to them wait", zap.Error(err))
		return false, nil
	}
	if recheck && !moved {
		c.mu.Lock()
		c.checked = time.Now()
		c.mu.Unlock()
		if sameEndpoints(previous, list) {
			if !confirming && (c.reload.IsZero() || time.Now().Before(c.reload)) {
				return false, nil
			}
		} else {
			// Changed without moving the version: as unsure as a load for a new version.
			d.log.Warn("endpoints changed without a version bump (triggers disabled?); reloaded")
			moved = true
		}
	}
	byID := make(map[string]*managed, len(list))
	var reload time.Time
	var disabled, enabled []*managed
	now := time.Now()
	for i := range list {
		m := newManaged(list[i], errs[i], now)
		byID[m.ep.ID] = m
		if !m.signerUntil.IsZero() && (reload.IsZero() || m.signerUntil.Before(reload)) {
			reload = m.signerUntil
		}
		c.mu.Lock()
		wasEnabled, known := c.enabledAt[m.ep.ID]
		c.mu.Unlock()
		switch {
		case known && wasEnabled && !m.ep.Enabled:
			disabled = append(disabled, m)
		case known && !wasEnabled && m.ep.Enabled:
			enabled = append(enabled, m)
		}
	}
	ordered := false
	for _, m := range byID {
		ordered = ordered || m.ep.Enabled && m.ep.Ordering == "stream"
	}
	c.mu.Lock()
	wasOrdered := c.ordered
	c.mu.Unlock()
	if ordered {
		d.ensureStreamIndex()
		if !wasOrdered && !d.cfg.Ordering {
			// An endpoint just turned ordering on: say at once whether the ids allow it.
			then = append(then, func() {
				if err := d.checkOrderingIDs(ctx); err != nil {
					d.log.Error("ordered delivery cannot hold its promise", zap.Error(err))
				}
			})
		}
	}
	routable := make([]*managed, 0, len(byID))
	for _, m := range byID {
		if m.ep.Enabled {
			routable = append(routable, m)
		}
	}
	slices.SortFunc(routable, func(a, b *managed) int { return strings.Compare(a.ep.ID, b.ep.ID) })
	d.warnMisconfigured(previous, byID)
	c.mu.Lock()
	c.byID, c.loaded, c.reload, c.ordered, c.enabled, c.checked = byID, want, reload, ordered, routable, time.Now()
	c.stored++
	switch {
	case moved:
		c.confirmed, c.confirmAfter = false, after
	case confirming:
		c.confirmed = true
	}
	c.enabledAt = make(map[string]bool, len(byID))
	for id, m := range byID {
		c.enabledAt[id] = m.ep.Enabled
	}
	c.mu.Unlock()
	if moved {
		// Usually every transaction that could have bumped the version has ended by now:
		// confirm at once rather than route the next batches by statement.
		var xmin uint64
		if err := d.pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&xmin); err == nil && xmin >= after {
			storeMax(&c.xmin, xmin)
			confirmNow = true
		}
	}
	// Changes of state this instance observed, whoever made them (the CLI, SQL, a 410 seen by
	// any instance): each logged and counted once per instance that sees it.
	for _, m := range disabled {
		d.metrics.endpointChanges.WithLabelValues("disabled").Inc()
		d.log.Info("endpoint disabled", zap.String("endpoint_id", m.ep.ID), zap.String("reason", m.ep.DisabledReason))
		then = append(then, func() { d.deadLetterPending(ctx, m.ep.ID, "endpoint disabled: "+m.ep.DisabledReason) })
	}
	for _, m := range enabled {
		d.metrics.endpointChanges.WithLabelValues("enabled").Inc()
		d.log.Info("endpoint enabled", zap.String("endpoint_id", m.ep.ID))
	}
	return confirmNow, then
}

// sameEndpoints reports whether list holds what the cache was loaded with, but for the
// lifecycle columns the dispatchers write themselves on every outcome (which bump no version
// on purpose, and change nothing the dispatcher routes or sends by).
func sameEndpoints(cached map[string]*managed, list []endpoints.Endpoint) bool {
	if len(cached) != len(list) {
		return false
	}
	routable := func(e endpoints.Endpoint) endpoints.Endpoint {
		e.LastSuccessAt, e.FailingSince, e.UpdatedAt = time.Time{}, time.Time{}, time.Time{}
		e.Description, e.DisabledAt = "", time.Time{} // nor these, which move no version either
		return e
	}
	for i := range list {
		m, ok := cached[list[i].ID]
		if !ok || !reflect.DeepEqual(routable(m.ep), routable(list[i])) {
			return false
		}
	}
	return true
}

// lookup returns the endpoint with id, nil when there is none.
func (c *endpointCache) lookup(id string) *managed {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byID[id]
}

// any reports whether some endpoint exists, enabled or not, as far as the cache knows: only
// then are events routed (see routes). Without one, events go to WEBHOOK_URL as they always
// did, at no routing cost.
func (c *endpointCache) any() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID) > 0
}

// routes reports whether a batch's events must be routed: the cache holds an endpoint, or,
// empty, it cannot be sure the table is (its load for the current version failed, or is not
// confirmed yet) and the table has a row. An empty cache taken for "no endpoints" while the
// table had some sent a tenant's events to WEBHOOK_URL; an empty table routes nothing, as
// ever, whatever the cache's state (route.sql would record a tenant's event as matching no
// endpoint instead of sending it to WEBHOOK_URL).
func (d *Dispatcher) routes(ctx context.Context) bool {
	if holds := d.endpoints.any(); holds || d.endpoints.confirmedFor(nil) {
		return holds
	}
	var exists bool
	if err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM webhook_endpoints)`).Scan(&exists); err != nil {
		return true // route.sql decides, or fails and the events come back after their lease
	}
	return exists
}

// confirmedAt is the version the cache is confirmed at (it holds every change up to it), -1
// when it is not confirmed: a claim that orders nothing takes rows with an order key only
// while this is the endpoints' current version (claim.Ordering.Confirmed).
func (c *endpointCache) confirmedAt() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.confirmed {
		return -1
	}
	return c.loaded
}

// anyOrdered reports whether some endpoint orders its streams.
func (c *endpointCache) anyOrdered() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ordered
}

// route fans out the events of batch to their endpoints and returns the rows to deliver: the
// batch's other rows, the events kept for WEBHOOK_URL and the new deliveries. Events that
// can be are routed in memory (routeInMemory), the others by one statement. Slots follow
// the deliveries: taken for the new ones, given back for the events that leave the pipeline.
func (d *Dispatcher) route(ctx context.Context, batch []*delivery.Delivery) []*delivery.Delivery {
	var events []*delivery.Delivery
	out := make([]*delivery.Delivery, 0, len(batch))
	for _, del := range batch {
		if claim.NeedsRouting(del) {
			events = append(events, del)
		} else {
			out = append(out, del)
		}
	}
	if len(events) == 0 {
		return batch
	}
	virtual, events, routed := d.routeInMemory(events)
	if len(virtual) > 0 {
		// Taken before the events' slots are given back: the claiming loop, woken by freed
		// slots, must not see more room than there is.
		out = append(out, virtual...)
		d.slots.Take(len(virtual))
		d.slots.Release(routed)
		d.stats.Claimed.Add(int64(len(virtual)))
		d.stats.RoutedInMemory.Add(int64(routed))
		d.metrics.routed.WithLabelValues("memory").Add(float64(routed))
	}
	if len(events) == 0 {
		return out
	}
	start := time.Now()
	res, err := d.claimer.Route(ctx, events, d.cfg.DefaultURL != "")
	if err != nil {
		// The events stay leased and unrouted: they come back after their lease.
		d.log.Warn("routing failed; the events are routed again after their lease", zap.Error(err), zap.Int("events", len(events)))
		d.slots.Release(len(events))
		return out
	}
	kept := make(map[int64]bool, len(res.Kept))
	for _, id := range res.Kept {
		kept[id] = true
	}
	for _, del := range events {
		if kept[del.ID] {
			del.Routed = true
			out = append(out, del)
		}
	}
	if len(res.Locked) > 0 {
		// In no list of res: their slots are given back below, and they come back after
		// their lease.
		d.log.Warn("routing left events to their lease: another session holds their rows locked",
			zap.Int("events", len(res.Locked)), zap.Int64s("row_ids", res.Locked))
	}
	d.metrics.routed.WithLabelValues("statement").Add(float64(len(events) - len(res.Locked) - res.Unrouted))
	d.stampSendBy(res.Deliveries, start) // the routing statement leased the new rows
	out = append(out, res.Deliveries...)
	d.slots.Take(len(res.Deliveries))
	d.slots.Release(len(events) - len(res.Kept))
	d.stats.Claimed.Add(int64(len(res.Deliveries)))
	if res.Queued > 0 {
		d.waker.DueIn(0) // ordered deliveries wait for a claim: make it now
	}
	if res.Unrouted > 0 {
		d.metrics.unrouted.Add(float64(res.Unrouted))
		d.log.Info("events matched no endpoint", zap.Int("events", res.Unrouted))
	}
	return out
}

// routeInMemory routes the events it can by the endpoint cache, by route.sql's rule, and
// returns their deliveries, the events left for the statement and how many it routed. A delivery routed in
// memory has no row: its event's row, still leased, holds it until the first of the event's
// deliveries is settled (delivery.Anchor, settleAnchored). That saves the delivery row's
// insert and delete, half the database's work per delivery (BenchmarkRouteSettle in
// stages/claim against the anchored settle: 20 → 10 µs of PostgreSQL CPU per delivery).
//
// Left to the statement, whose rules cover them: every event when the cache is not at the
// version the claim saw, or not yet confirmed at it (see endpointCache.confirmed); an event WEBHOOK_URL keeps; one that matches no endpoint (it is
// recorded as such); every event while an enabled endpoint (or WEBHOOK_ORDERING) orders
// streams; and a tenant or
// endpoint tenant stored as the empty string rather than NULL.
func (d *Dispatcher) routeInMemory(events []*delivery.Delivery) (virtual, rest []*delivery.Delivery, routed int) {
	if !d.inMemory.Load() {
		return nil, events, 0
	}
	c := &d.endpoints
	c.mu.Lock()
	// With an ordering endpoint (or WEBHOOK_ORDERING=stream), every event goes by statement:
	// an event routed in memory keeps its row until its first settle, and the claim's head
	// check takes such a row for an event not yet routed, which would hold its stream's
	// ordered deliveries back meanwhile.
	fresh := c.confirmed && !c.ordered && !d.cfg.Ordering && c.loaded == c.version.Load() && (c.reload.IsZero() || time.Now().Before(c.reload))
	eps := c.enabled // replaced, never modified, by a load
	c.mu.Unlock()
	if !fresh {
		return nil, events, 0
	}
	keepDefault := d.cfg.DefaultURL != ""
	rest = events[:0:0]
	var matched []*managed
	for _, ev := range events {
		if ev.EmptyTenant || keepDefault && ev.Tenant == "" {
			rest = append(rest, ev)
			continue
		}
		matched = matched[:0]
		for _, m := range eps {
			if m.ep.EmptyTenant || m.ep.Tenant != ev.Tenant || m.ep.CreatedAt.After(ev.EnqueuedAt) ||
				!endpoints.Matches(m.ep.EventTypes, ev.EventType) {
				continue
			}
			matched = append(matched, m)
		}
		if len(matched) == 0 {
			rest = append(rest, ev)
			continue
		}
		a := &delivery.Anchor{EventID: ev.ID, LeaseToken: ev.LeaseToken, Endpoints: make([]string, len(matched))}
		for i, m := range matched {
			a.Endpoints[i] = m.ep.ID
			virtual = append(virtual, &delivery.Delivery{
				DeliveryID: ev.DeliveryID, StreamID: ev.StreamID, EventType: ev.EventType, Payload: ev.Payload, Oversize: ev.Oversize,
				Attempt: 1, EnqueuedAt: ev.EnqueuedAt, DueAt: ev.DueAt, EndpointID: m.ep.ID, Tenant: ev.Tenant,
				Routed: true, LeaseToken: ev.LeaseToken, SendBy: ev.SendBy, Anchor: a,
			})
		}
		routed++
	}
	return virtual, rest, routed
}

// settleAnchored writes the deliveries of batch routed in memory whose event row is still to
// be replaced (settle.SettleAnchored, one statement for the batch), and returns the rows for
// settle.sql: the batch's rows, and the deliveries routed in memory that now have rows of
// their own (an outcome other than delivered, or an event whose earlier delivery replaced
// its row). done are the deliveries written here (delivered) or refused (stale, their event's
// lease lost), reported with the settled rows; deliveries whose event could not be written
// for a database error are in neither and come back, with their event, after its lease.
func (d *Dispatcher) settleAnchored(ctx context.Context, batch []*delivery.Delivery) (rows, done []*delivery.Delivery) {
	var fresh []*delivery.Anchor
	var group map[*delivery.Anchor][]*delivery.Delivery
	for _, del := range batch {
		a := del.Anchor
		switch {
		case a == nil:
			rows = append(rows, del)
		case a.Lost:
			if a.Stale {
				del.Outcome.Stale = true
				done = append(done, del)
			}
		case a.Settled:
			del.ID, del.LeaseToken, del.Anchor = a.Rows[del.EndpointID], a.Token, nil
			rows = append(rows, del)
		default:
			if group == nil {
				group = map[*delivery.Anchor][]*delivery.Delivery{}
			}
			if _, ok := group[a]; !ok {
				fresh = append(fresh, a)
			}
			group[a] = append(group[a], del)
		}
	}
	if len(fresh) == 0 {
		return rows, done
	}
	in := make([]settle.Anchored, len(fresh))
	for i, a := range fresh {
		in[i] = settle.Anchored{EventID: a.EventID, LeaseToken: a.LeaseToken, NewToken: d.claimer.NextToken(), Endpoints: len(a.Endpoints)}
		back := make(map[string]bool, len(group[a]))
		for _, del := range group[a] {
			if del.Outcome.Kind == delivery.Delivered {
				in[i].Delivered = append(in[i].Delivered, del)
				back[del.EndpointID] = true
			}
		}
		for _, ep := range a.Endpoints {
			if !back[ep] {
				in[i].Rows = append(in[i].Rows, ep)
			}
		}
	}
	res, err := d.settler.SettleAnchored(ctx, in, d.cfg.Lease)
	if err != nil {
		d.stats.SettleErrors.Add(1)
		d.metrics.settleErrors.Inc()
		n := 0
		for _, a := range fresh {
			a.Lost = true
			n += len(group[a])
		}
		d.log.Error("settle failed; rows will be delivered again after their lease", zap.Error(err),
			zap.Int("rows", n), zap.Int("events", len(fresh)))
		return rows, done
	}
	if res.Refused != nil {
		d.log.Warn("settle batch rejected; settled events one by one", zap.Error(res.Refused), zap.Int("events", len(fresh)))
		if isInsufficientPrivilege(res.Refused) && d.inMemory.CompareAndSwap(true, false) {
			d.log.Warn("the grant on webhook_outbox's id sequence was revoked: routing by a row per delivery from now on",
				zap.String("grant", "GRANT USAGE ON SEQUENCE webhook_outbox_id_seq TO <the dispatcher's role>"))
		}
	}
	for i, a := range fresh {
		nt := in[i].NewToken
		if err, failed := res.Failed[nt]; failed {
			d.stats.SettleErrors.Add(1)
			d.metrics.settleErrors.Inc()
			a.Lost = true
			d.log.Error("settle failed; rows will be delivered again after their lease", zap.Error(err),
				zap.Int("rows", len(group[a])), zap.Int("events", 1))
			continue
		}
		if !res.Written[nt] {
			a.Lost, a.Stale = true, true
			for _, del := range group[a] {
				del.Outcome.Stale = true
				done = append(done, del)
			}
			continue
		}
		asRows := res.AsRows[nt]
		made := in[i].Rows
		if asRows {
			made = a.Endpoints
		}
		a.Settled, a.Token = true, nt
		a.Rows = make(map[string]int64, len(made))
		for _, ep := range made {
			a.Rows[ep] = res.Rows[settle.AnchoredRow{Token: nt, Endpoint: ep}]
		}
		for _, del := range group[a] {
			if del.Outcome.Kind == delivery.Delivered && !asRows {
				done = append(done, del)
				continue
			}
			del.ID, del.LeaseToken, del.Anchor = a.Rows[del.EndpointID], a.Token, nil
			rows = append(rows, del)
		}
	}
	return rows, done
}

// resolveManaged sets del.Endpoint for a managed endpoint's delivery, or returns why it cannot
// be delivered.
//
// The row is checked against the endpoint as route.sql matches them, where the request is
// built: the event's tenant must be the endpoint's, and, unless the row is a replay, its type
// must pass the endpoint's filter and it must have been enqueued after the endpoint was
// created. Routing already made sure of it, and producers cannot address an endpoint (schema
// 11 refuses their endpoint_id); this is the defence behind both, so that no row written by
// other means (a role that may update the outbox, a restore, a filter narrowed since the row
// was routed) carries an event to a consumer, signed with its secret and its headers, that
// did not ask for it.
func (d *Dispatcher) resolveManaged(del *delivery.Delivery) string {
	m := d.endpoints.lookup(del.EndpointID)
	switch {
	case m == nil:
		return "endpoint " + del.EndpointID + " was removed"
	case m.invalid != "":
		return m.invalid
	case !m.ep.Enabled:
		return "endpoint disabled: " + m.ep.DisabledReason
	}
	admits, reason := m.target.Admits(del), routeRefusal(m, del)
	if !admits || reason != "" {
		if !d.endpoints.confirmedFor(del) {
			if tenant, route := d.admitsNow(del); !admits && tenant || admits && route {
				// The cache is behind the committed endpoint: read it again before the
				// row's next claim (confirmation may wait for a long transaction elsewhere).
				d.endpoints.forceCheck.Store(true)
				return unconfirmedEndpoint
			}
		}
		if !admits {
			return send.TenantMismatch(del, m.target)
		}
		switch replay, err := d.replayed(del); {
		case err != nil:
			return replayUnchecked
		case !replay:
			return reason
		}
	}
	del.Endpoint = m.target
	return ""
}

// routeRefusal returns why routing would not have sent del's event to m (its filter, or its
// creation after the event was enqueued), as route.sql and routeInMemory decide it, or "".
func routeRefusal(m *managed, del *delivery.Delivery) string {
	// A test event (the management API's "send a test event") is addressed to its endpoint
	// whatever its filter: only roles that may write routing columns can address a row.
	if !endpoints.Matches(m.ep.EventTypes, del.EventType) && del.EventType != endpoints.TestEventType {
		return fmt.Sprintf("event type %q does not match the filter of endpoint %s (%s): an endpoint receives only the event types its filter names; `fluxhook dlq replay` sends it anyway",
			del.EventType, m.ep.ID, strings.Join(m.ep.EventTypes, ","))
	}
	if m.ep.CreatedAt.After(del.EnqueuedAt) {
		return fmt.Sprintf("the event was enqueued at %s, before endpoint %s was created (%s): an endpoint receives only the events enqueued after it was created; `fluxhook dlq replay` sends it anyway",
			del.EnqueuedAt.UTC().Format(time.RFC3339Nano), m.ep.ID, m.ep.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	return ""
}

// unconfirmedEndpoint is resolveManaged's answer for a delivery its endpoint does not take in
// a cache that may not hold the latest change yet (a change of tenant, filter or creation time
// whose commit the cache's load did not see, while the routing statement did): the row is not
// sent, and comes back once the cache is confirmed, rather than dead-lettered by stale data.
const unconfirmedEndpoint = "the endpoint does not take the event (its tenant, filter or creation time) in this instance's endpoint cache, not yet confirmed at the endpoints' current version: claimed again once it is"

// admitsNowSQL reports whether an endpoint, as committed now, has an event's tenant, and
// whether route.sql's other rules (the filter, the creation time) send the event to it.
//
//	$1 the endpoint's id, $2 the event's tenant, $3 its type, $4 its enqueue time.
const admitsNowSQL = `SELECT e.tenant IS NOT DISTINCT FROM $2::text,
	e.created_at <= $4::timestamptz
	AND (cardinality(e.event_types) = 0 OR $3::text = ANY (e.event_types)
	     OR EXISTS (SELECT 1 FROM unnest(e.event_types) f WHERE f LIKE '%.*' AND starts_with($3::text, left(f, -1))))
	FROM webhook_endpoints e WHERE e.id = $1::uuid`

// admitsNow reports whether del's endpoint, as committed now, has del's tenant, and whether
// its filter and creation time let del's event through (a failed read counts as yes to both:
// the row is released, not dead-lettered, and checked again).
func (d *Dispatcher) admitsNow(del *delivery.Delivery) (tenant, route bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := d.pool.QueryRow(ctx, admitsNowSQL, del.EndpointID, tenantParam(del), del.EventType, del.EnqueuedAt).Scan(&tenant, &route)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, false
	case err != nil:
		return true, true
	}
	return tenant, route
}

// replayedSQL finds the dead letter a replay was made of: `fluxhook dlq replay` marks the dead
// letters it re-enqueues (replayed_at), and the replayed row carries the event unchanged.
//
//	$1 the delivery id, $2 the tenant, $3 the event type, $4 the payload.
const replayedSQL = `SELECT EXISTS (SELECT 1 FROM webhook_dead_letter
	WHERE delivery_id = $1::uuid AND replayed_at IS NOT NULL AND tenant IS NOT DISTINCT FROM $2::text
	  AND event_type = $3::text AND payload = $4::jsonb)`

// replayed reports whether del is a replay of a dead letter of the same event: an operator's
// replay goes to an endpoint whatever its filter and creation time (its own endpoint, whose
// filter may have changed since, or --to-endpoint's, possibly created after the event), so
// routing's own rules are waived for it, never the tenant's.
func (d *Dispatcher) replayed(del *delivery.Delivery) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var ok bool
	if err := d.pool.QueryRow(ctx, replayedSQL, del.DeliveryID, tenantParam(del), del.EventType, string(del.Payload)).Scan(&ok); err != nil {
		d.log.Warn("checking whether a delivery is a replay failed; it is claimed again",
			append(d.deliveryFields(del), zap.Error(err))...)
		return false, err
	}
	return ok, nil
}

// endpointsUnread is freshen's answer for a batch whose endpoints it could not read: the rows
// are released and claimed again, as with unconfirmedEndpoint.
const endpointsUnread = "could not read the endpoint as committed (the database did not answer) while this instance's endpoint cache is not yet confirmed: claimed again"

// replayUnchecked is resolveManaged's answer when it could not read whether a delivery its
// endpoint's filter or creation time refuses is a replay: the row is released and checked
// again, rather than dead-lettered for a failed read.
const replayUnchecked = "could not check whether the delivery is a replay (the database did not answer): claimed again"

// tenantParam is del's tenant as SQL has it: NULL for none.
func tenantParam(del *delivery.Delivery) any {
	if del.Tenant == "" && !del.EmptyTenant {
		return nil
	}
	return del.Tenant
}

// unconfirmedDelay is how soon a row refused by an unconfirmed cache is claimed again.
const unconfirmedDelay = 250 * time.Millisecond

// refusal is the outcome of a row the dispatcher will not send for reason: dead-lettered, or,
// refused by an endpoint cache not yet confirmed or for a replay check the database did not
// answer, released to be claimed again.
func refusal(reason string) delivery.Outcome {
	if reason == unconfirmedEndpoint || reason == replayUnchecked || reason == endpointsUnread {
		return delivery.Outcome{Kind: delivery.Release, Delay: unconfirmedDelay, Error: reason}
	}
	return delivery.Outcome{Kind: delivery.Permanent, Reason: reason}
}

// confirmedFor reports whether the cache holds every change to the endpoints up to the version
// the last claim read, which was read after del's row was visible to that claim: whatever
// routed the row under a changed endpoint had that change committed, and so does the cache.
func (c *endpointCache) confirmedFor(*delivery.Delivery) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.confirmed && c.loaded == c.version.Load()
}

// signManaged signs del with its endpoint's own secret and adds its custom headers, or returns
// why it cannot. The cache may have been reloaded since resolveManaged: the endpoint is then
// resolved again, so that the URL, the tenant and the secret all come from one version of it.
func (d *Dispatcher) signManaged(del *delivery.Delivery, now time.Time) string {
	m := d.endpoints.lookup(del.EndpointID)
	if m == nil || m.target != del.Endpoint {
		if reason := d.resolveManaged(del); reason != "" {
			return reason
		}
		if m = d.endpoints.lookup(del.EndpointID); m == nil || m.target != del.Endpoint {
			return "endpoint " + del.EndpointID + " changed while its delivery was being prepared"
		}
	}
	if m.signer == nil {
		return "endpoint " + del.EndpointID + " was removed"
	}
	m.signer.Sign(del, now)
	for k, v := range m.header {
		del.Header[k] = v
	}
	return ""
}

// noteEndpointOutcomes records, in one statement per settled batch that holds managed
// endpoints' deliveries, the lifecycle facts: the last success, since when an endpoint has been
// failing, and a 410 Gone, which disables it (as the Standard Webhooks specification asks),
// its pending deliveries then dead-lettered with the reason.
func (d *Dispatcher) noteEndpointOutcomes(ctx context.Context, settled []*delivery.Delivery) {
	var outs []endpointOutcome
	seen := map[string]int{}
	for _, del := range settled {
		o := del.Outcome
		if del.EndpointID == "" || o.Stale || o.Unsettled {
			continue
		}
		var r int16
		switch {
		case o.Kind == delivery.Delivered:
			r = 1
		case o.Status == http.StatusGone:
			r = 3
		case o.Kind == delivery.Retry || o.Kind == delivery.Permanent && (o.Status >= 500 || o.Status == 0 && o.Error != ""):
			r = 2
		default:
			continue
		}
		if i, ok := seen[del.EndpointID]; ok {
			outs[i].result = max(outs[i].result, r) // gone beats failure beats success within a batch
			continue
		}
		seen[del.EndpointID] = len(outs)
		out := endpointOutcome{id: del.EndpointID, result: r}
		if ep := del.Endpoint; ep != nil {
			out.url, out.tenant = ep.URL, &ep.Tenant
			if ep.Tenant == "" && !ep.EmptyTenant {
				out.tenant = nil
			}
		}
		outs = append(outs, out)
	}
	d.outcomes.add(outs)
}

// endpointOutcome is what one batch says about one managed endpoint, and where it was said:
// the URL and tenant the endpoint had when the request was made. It is recorded only while the
// endpoint still has both: a 410 from a URL since replaced, or from before a move to another
// tenant, says nothing about the endpoint as it is now.
type endpointOutcome struct {
	id     string
	result int16 // 1 success, 2 failure, 3 gone
	url    string
	tenant *string // nil: none
}

// outcomeRecorder records endpoint outcomes (endpoint_outcomes.sql) on a goroutine of its own,
// in the order the batches settled, merged while it waits. Recorded on the settle goroutine,
// an update waiting for a row lock another session held on one endpoint (an operator's open
// transaction, an API change, a recovery batch) held up every settle of every endpoint for as
// long as that transaction lived, and the leases of rows already delivered ran out: they were
// sent again. Here only the record waits; it is written as it would have been, once the lock
// is released.
type outcomeRecorder struct {
	mu      sync.Mutex
	pending map[string]endpointOutcome // by endpoint id
	wake    chan struct{}              // 1-buffered: pending has something
	done    chan struct{}              // closed by Stop: record what is left and end
	ended   chan struct{}              // closed when the loop has ended
}

func newOutcomeRecorder() *outcomeRecorder {
	return &outcomeRecorder{pending: map[string]endpointOutcome{}, wake: make(chan struct{}, 1), done: make(chan struct{}), ended: make(chan struct{})}
}

// add merges one batch's outcomes into those waiting: a newer batch's outcome replaces an
// older one (an endpoint that failed and then succeeded is healthy), except a 410, which stays.
func (r *outcomeRecorder) add(outs []endpointOutcome) {
	if len(outs) == 0 {
		return
	}
	r.mu.Lock()
	for _, o := range outs {
		if prev, ok := r.pending[o.id]; !ok || prev.result != 3 {
			r.pending[o.id] = o
		}
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// take empties what waits, in the order of the endpoint ids (endpoint_outcomes.sql locks the
// rows in it: two instances recording the same endpoints never wait for each other in a cycle).
func (r *outcomeRecorder) take() []endpointOutcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	outs := make([]endpointOutcome, 0, len(r.pending))
	for _, o := range r.pending {
		outs = append(outs, o)
	}
	slices.SortFunc(outs, func(a, b endpointOutcome) int { return strings.Compare(a.id, b.id) })
	r.pending = map[string]endpointOutcome{}
	return outs
}

// putBack returns to what waits the outcomes a failed record took: older than any that came
// meanwhile, which replace them, except a 410, which stays.
func (r *outcomeRecorder) putBack(outs []endpointOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range outs {
		if newer, ok := r.pending[o.id]; !ok || o.result == 3 && newer.result != 3 {
			r.pending[o.id] = o
		}
	}
}

// recordOutcomes runs until Stop closes done, then records what is left (bounded by ctx and by
// finalOutcomeTries). A record the database refused for a passing reason (a deadlock, a lock or
// statement timeout, a lost connection) is put back and tried again, merged with what came
// meanwhile: dropped, a 410 lost there never disabled its endpoint, and a lost success left a
// recovered endpoint failing, to be disabled later.
func (d *Dispatcher) recordOutcomes(ctx context.Context) {
	r := d.outcomes
	defer close(r.ended)
	for {
		stop := false
		select {
		case <-r.wake:
		case <-r.done:
			stop = true
		}
		for wait, tries := 100*time.Millisecond, 1; ; wait, tries = min(2*wait, 10*time.Second), tries+1 {
			outs := r.take()
			if len(outs) == 0 || d.writeOutcomes(ctx, outs) {
				break
			}
			if stop && tries >= finalOutcomeTries {
				// Stopping, and the database still refuses: Stop must not wait on it for ever
				// (a caller's context may have no deadline).
				d.log.Warn("endpoint outcomes not recorded at shutdown", zap.Int("endpoints", len(outs)))
				return
			}
			r.putBack(outs)
			var stopping <-chan struct{} // Stop, while waiting to try again
			if !stop {
				stopping = r.done
			}
			select {
			case <-time.After(wait):
			case <-stopping:
				stop = true
			case <-ctx.Done():
				return
			}
		}
		if stop {
			return
		}
	}
}

// finalOutcomeTries is how many times the outcomes left at Stop are tried (0.7 s of waits).
const finalOutcomeTries = 3

// writeOutcomes runs endpoint_outcomes.sql and disables the endpoints that answered 410. It
// reports false when the record should be tried again: the database refused it for a passing
// reason. Refused for any other (a trigger or constraint an operator put on the endpoints),
// each endpoint is recorded alone, so that one that cannot be does not hold back the others.
func (d *Dispatcher) writeOutcomes(ctx context.Context, outs []endpointOutcome) bool {
	gone, err := d.recordEndpointOutcomes(ctx, outs)
	switch {
	case err == nil:
	case passing(err):
		if ctx.Err() == nil {
			d.log.Warn("recording endpoint outcomes failed; trying again", zap.Error(err), zap.Int("endpoints", len(outs)))
		}
		return false
	case len(outs) == 1:
		d.log.Warn("recording endpoint outcomes failed", zap.Error(err), zap.String("endpoint_id", outs[0].id))
		return true
	default:
		for i := range outs {
			if !d.writeOutcomes(ctx, outs[i:i+1]) {
				return false // what is left goes back with it, including those recorded (harmless)
			}
		}
		return true
	}
	for _, id := range gone {
		d.disabledEndpoint(ctx, id, goneReason)
	}
	return true
}

// recordEndpointOutcomes runs endpoint_outcomes.sql and returns the endpoints it disabled.
func (d *Dispatcher) recordEndpointOutcomes(ctx context.Context, outs []endpointOutcome) ([]string, error) {
	ids, results, urls, tenants := make([]string, len(outs)), make([]int16, len(outs)), make([]string, len(outs)), make([]*string, len(outs))
	for i, o := range outs {
		ids[i], results[i], urls[i], tenants[i] = o.id, o.result, o.url, o.tenant
	}
	rows, err := d.pool.Query(ctx, endpointOutcomesSQL, ids, results, urls, tenants)
	if err != nil {
		return nil, err
	}
	// The statement's errors (a refused disable among them) surface while reading its rows.
	var gone []string
	for rows.Next() {
		var id string
		var disabled bool
		if err := rows.Scan(&id, &disabled); err != nil {
			rows.Close()
			return nil, err
		}
		if disabled {
			gone = append(gone, id)
		}
	}
	return gone, rows.Err()
}

// passing reports whether err is the database refusing a statement for a reason that passes:
// a deadlock or serialization failure (class 40), a lock or statement timeout, a lost
// connection or a server going down, or no error from the server at all (the network).
func passing(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || fluxsql.IsLockTimeout(err) {
		return true
	}
	switch c := pgErr.Code; {
	case strings.HasPrefix(c, "40"), strings.HasPrefix(c, "08"), strings.HasPrefix(c, "57"), strings.HasPrefix(c, "53"):
		return true
	}
	return false
}

// goneReason is the disabled_reason of an endpoint that answered 410.
const goneReason = "the endpoint answered 410 Gone"

// disableStale disables the endpoints without a success for DisableAfter while failing, once
// per housekeeping round.
func (d *Dispatcher) disableStale(ctx context.Context) {
	reason := fmt.Sprintf("no successful delivery for %s", d.cfg.EndpointDisableAfter)
	rows, err := d.pool.Query(ctx, endpointDisableSQL, d.cfg.EndpointDisableAfter.Milliseconds(), reason)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("disabling failing endpoints failed", zap.Error(err))
		}
		return
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("disabling failing endpoints failed", zap.Error(err))
		}
		return
	}
	for _, id := range ids {
		d.disabledEndpoint(ctx, id, reason)
	}
}

// disabledEndpoint logs an endpoint this instance disabled, and dead-letters its pending
// deliveries at once. The change is counted when the endpoint cache next reloads (see
// refreshEndpoints), as every change of state is, whoever made it.
func (d *Dispatcher) disabledEndpoint(ctx context.Context, id, reason string) {
	d.log.Warn("disabling endpoint", zap.String("endpoint_id", id), zap.String("reason", reason))
	d.deadLetterPending(ctx, id, "endpoint disabled: "+reason)
}

// deadLetterPending moves the deliveries of endpoint id that nobody holds to the dead-letter
// table with reason; they can be replayed after the endpoint is enabled again. Rows in flight
// are dead-lettered when they are next claimed.
func (d *Dispatcher) deadLetterPending(ctx context.Context, id, reason string) {
	n, err := d.settler.DeadLetterEndpoint(ctx, id, reason)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("dead-lettering a disabled endpoint's deliveries failed; they are dead-lettered when claimed",
				zap.String("endpoint_id", id), zap.Error(err))
		}
		return
	}
	if n > 0 {
		d.stats.DeadLettered.Add(n)
		d.metrics.deadLetters.WithLabelValues("endpoint_disabled").Add(float64(n))
		d.log.Warn("dead-lettered a disabled endpoint's pending deliveries", zap.String("endpoint_id", id), zap.Int64("rows", n))
	}
}

// isInsufficientPrivilege reports whether err is PostgreSQL's refusal for a missing grant.
func isInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// storeMax sets a to v unless it already holds more.
func storeMax(a *atomic.Uint64, v uint64) {
	for old := a.Load(); old < v; old = a.Load() {
		if a.CompareAndSwap(old, v) {
			return
		}
	}
}
