package dispatcher

import (
	"context"
	_ "embed"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/send"
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
}

// endpointCache holds the managed endpoints, loaded at the version of webhook_endpoints the
// latest claim reported and reloaded when it moves (every change to the table, by SQL or the
// CLI, bumps it) or when a previous secret's grace ends.
type endpointCache struct {
	// version is the endpoints' version the claiming loop saw last; loaded the one the
	// cache holds.
	version atomic.Int64
	mu      sync.Mutex
	loaded  int64
	reload  time.Time // when a grace ends; zero: none pending
	byID    map[string]*managed
	// ordered: some enabled endpoint orders its streams.
	ordered bool
	// enabledAt remembers which endpoints were enabled at the previous load, to dead-letter
	// the pending deliveries of one that has just been disabled.
	enabledAt map[string]bool
}

// refreshEndpoints reloads the endpoints when the claim saw another version or a grace ended,
// and dead-letters the pending deliveries of those disabled since the previous load (by the
// CLI or SQL; the dispatcher's own disabling does it at once).
func (d *Dispatcher) refreshEndpoints(ctx context.Context) {
	c := &d.endpoints
	want := c.version.Load()
	c.mu.Lock()
	stale := want != c.loaded || !c.reload.IsZero() && time.Now().After(c.reload)
	c.mu.Unlock()
	if !stale {
		return
	}
	list, errs, err := endpoints.LoadAll(ctx, d.pool, d.cipher)
	if err != nil {
		d.log.Warn("loading endpoints failed; deliveries to them wait", zap.Error(err))
		return
	}
	byID := make(map[string]*managed, len(list))
	var reload time.Time
	var disabled, enabled []*managed
	now := time.Now()
	for i := range list {
		m := &managed{ep: list[i], header: list[i].Header()}
		byID[m.ep.ID] = m
		if errs[i] != nil {
			m.invalid = errs[i].Error()
			continue
		}
		m.target, err = send.ManagedEndpoint(m.ep.URL, "ep:"+m.ep.ID, m.ep.MaxConcurrency)
		if err != nil {
			m.invalid = fmt.Sprintf("endpoint %s: %v", m.ep.ID, err)
			continue
		}
		m.target.RetryRPS = m.ep.RetryRPS
		cfg := sign.Config{Secret: m.ep.Secret, Scheme: sign.Scheme(m.ep.Scheme)}
		if m.ep.PreviousSecret != "" && now.Before(m.ep.PreviousUntil) {
			cfg.PreviousSecret = m.ep.PreviousSecret
			m.signerUntil = m.ep.PreviousUntil
			if reload.IsZero() || m.signerUntil.Before(reload) {
				reload = m.signerUntil
			}
		}
		if m.signer, err = sign.New(cfg); err != nil {
			m.invalid = fmt.Sprintf("endpoint %s: %v", m.ep.ID, err)
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
	if ordered {
		d.ensureStreamIndex()
	}
	c.mu.Lock()
	c.byID, c.loaded, c.reload, c.ordered = byID, want, reload, ordered
	c.enabledAt = make(map[string]bool, len(byID))
	for id, m := range byID {
		c.enabledAt[id] = m.ep.Enabled
	}
	c.mu.Unlock()
	// Changes of state this instance observed, whoever made them (the CLI, SQL, a 410 seen by
	// any instance): each logged and counted once per instance that sees it.
	for _, m := range disabled {
		d.metrics.endpointChanges.WithLabelValues("disabled").Inc()
		d.log.Info("endpoint disabled", zap.String("endpoint_id", m.ep.ID), zap.String("reason", m.ep.DisabledReason))
		d.deadLetterPending(ctx, m.ep.ID, "endpoint disabled: "+m.ep.DisabledReason)
	}
	for _, m := range enabled {
		d.metrics.endpointChanges.WithLabelValues("enabled").Inc()
		d.log.Info("endpoint enabled", zap.String("endpoint_id", m.ep.ID))
	}
}

// lookup returns the endpoint with id, nil when there is none.
func (c *endpointCache) lookup(id string) *managed {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byID[id]
}

// any reports whether some endpoint exists, enabled or not: only then are events routed.
// Without one, events go to WEBHOOK_URL as they always did, at no routing cost.
func (c *endpointCache) any() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID) > 0
}

// anyOrdered reports whether some endpoint orders its streams.
func (c *endpointCache) anyOrdered() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ordered
}

// route fans out the events of batch to their endpoints and returns the rows to deliver: the
// batch's other rows, the events kept for WEBHOOK_URL and the new delivery rows. Slots follow
// the rows: taken for the new ones, given back for the events that leave the pipeline.
func (d *Dispatcher) route(ctx context.Context, batch []*delivery.Delivery) []*delivery.Delivery {
	var events []*delivery.Delivery
	for _, del := range batch {
		if claim.NeedsRouting(del) {
			events = append(events, del)
		}
	}
	if len(events) == 0 {
		return batch
	}
	start := time.Now()
	res, err := d.claimer.Route(ctx, events, d.cfg.DefaultURL != "")
	if err != nil {
		// The events stay leased and unrouted: they come back after their lease.
		d.log.Warn("routing failed; the events are routed again after their lease", zap.Error(err), zap.Int("events", len(events)))
		out := batch[:0]
		for _, del := range batch {
			if !claim.NeedsRouting(del) {
				out = append(out, del)
			}
		}
		d.slots.Release(len(events))
		return out
	}
	kept := make(map[int64]bool, len(res.Kept))
	for _, id := range res.Kept {
		kept[id] = true
	}
	out := make([]*delivery.Delivery, 0, len(batch)-len(events)+len(res.Kept)+len(res.Deliveries))
	for _, del := range batch {
		switch {
		case !claim.NeedsRouting(del):
			out = append(out, del)
		case kept[del.ID]:
			del.Routed = true
			out = append(out, del)
		}
	}
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

// resolveManaged sets del.Endpoint for a managed endpoint's delivery, or returns why it cannot
// be delivered.
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
	del.Endpoint = m.target
	return ""
}

// signManaged signs del with its endpoint's own secret and adds its custom headers.
func (d *Dispatcher) signManaged(del *delivery.Delivery, now time.Time) bool {
	m := d.endpoints.lookup(del.EndpointID)
	if m == nil || m.signer == nil {
		return false
	}
	m.signer.Sign(del, now)
	for k, v := range m.header {
		del.Header[k] = v
	}
	return true
}

// noteEndpointOutcomes records, in one statement per settled batch that holds managed
// endpoints' deliveries, the lifecycle facts: the last success, since when an endpoint has been
// failing, and a 410 Gone, which disables it (as the Standard Webhooks specification asks),
// its pending deliveries then dead-lettered with the reason.
func (d *Dispatcher) noteEndpointOutcomes(ctx context.Context, settled []*delivery.Delivery) {
	var ids []string
	var results []int16 // 1 success, 2 failure, 3 gone
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
			results[i] = max(results[i], r) // gone beats failure beats success within a batch
			continue
		}
		seen[del.EndpointID] = len(ids)
		ids = append(ids, del.EndpointID)
		results = append(results, r)
	}
	if len(ids) == 0 {
		return
	}
	rows, err := d.pool.Query(ctx, endpointOutcomesSQL, ids, results)
	if err != nil {
		d.log.Warn("recording endpoint outcomes failed", zap.Error(err))
		return
	}
	// The statement's errors (a refused disable among them) surface while reading its rows.
	gone, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var id string
		var disabled bool
		if err := r.Scan(&id, &disabled); err != nil || !disabled {
			return "", err
		}
		return id, nil
	})
	if err != nil {
		d.log.Warn("recording endpoint outcomes failed", zap.Error(err))
		return
	}
	for _, id := range gone {
		if id == "" {
			continue
		}
		d.disabledEndpoint(ctx, id, goneReason)
	}
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
