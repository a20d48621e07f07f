// Package claim leases due outbox rows for this dispatcher.
//
// One statement per batch leases the rows, commits, and returns them: a lease instead of a
// transaction held across HTTP (the original held row locks across up to ten sequential 30 s
// calls). A crashed dispatcher's rows become claimable again when their lease expires, which
// is what makes delivery at-least-once. The same statement maintains this dispatcher's
// "armed" flag (what fluxhook status shows); Announce sets the switch the insert trigger reads
// to decide whether to NOTIFY at all.
package claim

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/stages/delivery"
)

var (
	//go:embed claim.sql
	claimSQL string
	//go:embed heartbeat.sql
	heartbeatSQL string
	//go:embed janitor.sql
	janitorSQL string
	//go:embed park.sql
	parkSQL string
	//go:embed unpark.sql
	unparkSQL string
	//go:embed route.sql
	routeSQL string
)

// Claimer leases rows for one dispatcher instance.
type Claimer struct {
	pool     *pgxpool.Pool
	instance string
	lease    time.Duration
	tokens   atomic.Int64 // the last lease token handed out (see nextToken)
	order    atomic.Pointer[Ordering]
	// maxPayload is WEBHOOK_MAX_PAYLOAD_BYTES (LimitPayload); 0: no limit.
	maxPayload int
}

// Ordering is what the claim needs to know about ordered delivery (schema 6). The zero value
// orders nothing, and then a claim evaluates none of the ordering conditions.
type Ordering struct {
	// Active: some consumer orders its streams (an endpoint with ordering 'stream', or
	// Default).
	Active bool
	// Horizon is the hold-back horizon (Horizon.Safe): ordered rows with a larger key wait.
	Horizon int64
	// Default: WEBHOOK_ORDERING=stream, rows without a managed endpoint are ordered by id.
	Default bool
	// Routed: events are routed to endpoints (some endpoint exists).
	Routed bool
	// Confirmed is the version of webhook_endpoints at which the dispatcher's endpoint cache
	// is confirmed (it holds every change up to it), -1 when it is not: a claim that orders
	// nothing takes rows with an order key only while it is the current version. Unused by a
	// claim that orders (Active).
	Confirmed int64
}

// SetOrdering sets what the following claims use for ordered delivery. The claiming loop
// calls it before each claim, since the horizon moves with every claim.
func (c *Claimer) SetOrdering(o Ordering) { c.order.Store(&o) }

// New returns a Claimer that leases rows for lease on behalf of instance.
func New(pool *pgxpool.Pool, instance string, lease time.Duration) *Claimer {
	c := &Claimer{pool: pool, instance: instance, lease: lease}
	c.tokens.Store(rand.Int64N(math.MaxInt64 / 2))
	return c
}

// LimitPayload sets the largest payload, in bytes as sent (the stored jsonb compacted), that
// the following claims and routes hand over: a row with a larger one comes back with Oversize
// set to a reason naming its size, the limit and WEBHOOK_MAX_PAYLOAD_BYTES, and is
// dead-lettered without an attempt; an event is routed first, and its deliveries carry the
// reason. Call it before the first claim; 0 (the default) sets no limit.
//
// A row whose payload is far over the limit never has its body read: the claim measures the
// payload's text form (what PostgreSQL sends, jsonb's output with a space after every ':'
// and ',') and returns the body only when that is at most limit + limit/2 bytes (the route
// statement likewise). Compacting removes only those spaces, at most half the compacted size
// (each follows a ':' or ',' that follows a byte of a key or value), so a payload over that
// bound is over the limit once compacted too: the bound loses no row that fits. One between
// the limit and the bound is read, compacted and measured exactly: the dispatcher holds at most
// 1.5 times the limit of any row, however large the row (a batch of 30 MB rows read whole
// took it from 45 MB to 608 MB of memory, and a larger batch would have killed it before
// any row was dead-lettered, claimed again after the lease: a crash loop).
func (c *Claimer) LimitPayload(limit int) { c.maxPayload = max(limit, 0) }

// readBound is the claim's $15: the text size above which no body is returned, or nil.
func (c *Claimer) readBound() any {
	if c.maxPayload == 0 {
		return nil
	}
	return int64(c.maxPayload) + int64(c.maxPayload)/2
}

// PayloadTooLarge is the dead-letter reason of a row whose payload, compacted as it would be
// sent, is size bytes, over limit: it names the setting that decides, so that an operator can
// tell a producer's mistake from a limit to raise.
func PayloadTooLarge(size, limit int) string {
	return fmt.Sprintf("invalid row: payload is %d bytes, over the limit of %d (WEBHOOK_MAX_PAYLOAD_BYTES)", size, limit)
}

// payloadUnread is the dead-letter reason of a row whose body the claim did not return: its
// size as text (textSize) is all that is known, and the compacted size is at least two thirds
// of it (see LimitPayload).
func payloadUnread(textSize int64, limit int) string {
	return fmt.Sprintf("invalid row: payload is %d bytes as JSON text (at least %d compacted), over the limit of %d (WEBHOOK_MAX_PAYLOAD_BYTES); its body was not read",
		textSize, (2*textSize+2)/3, limit)
}

// oversize is the Oversize of a row under the limit maxPayload (0: none), given its compacted
// payload, or, when unread (the statement withheld the body), its size as text.
func oversize(compacted []byte, unread bool, textSize int64, maxPayload int) string {
	switch {
	case maxPayload <= 0:
		return ""
	case unread:
		return payloadUnread(textSize, maxPayload)
	case len(compacted) > maxPayload:
		return PayloadTooLarge(len(compacted), maxPayload)
	}
	return ""
}

// Register records this dispatcher (not armed) so that the claim statement can arm it.
func (c *Claimer) Register(ctx context.Context) error {
	_, err := c.pool.Exec(ctx, `INSERT INTO webhook_dispatcher (instance_id) VALUES ($1)
		ON CONFLICT (instance_id) DO UPDATE SET armed = false, seen_at = now()`, c.instance)
	if err != nil {
		return fmt.Errorf("registering dispatcher: %w", err)
	}
	return nil
}

// Unregister removes this dispatcher's row so producers stop notifying on its behalf.
func (c *Claimer) Unregister(ctx context.Context) error {
	_, err := c.pool.Exec(ctx, `DELETE FROM webhook_dispatcher WHERE instance_id = $1`, c.instance)
	if err != nil {
		return fmt.Errorf("unregistering dispatcher: %w", err)
	}
	return nil
}

// Heartbeat keeps this dispatcher's row alive and removes peers unseen for longer than stale.
func (c *Claimer) Heartbeat(ctx context.Context, stale time.Duration) error {
	if _, err := c.pool.Exec(ctx, heartbeatSQL, c.instance, stale.Milliseconds()); err != nil {
		return fmt.Errorf("dispatcher heartbeat: %w", err)
	}
	return nil
}

// Result is what one claim returns.
type Result struct {
	// Rows are the leased rows, oldest first.
	Rows []*delivery.Delivery
	// Next is how long until the next row not taken (and not skipped) becomes claimable, by
	// the database's clock, seen from the claim's own snapshot: 0 when one is claimable
	// already (another session's claim holds it locked), else the earliest future due time
	// or lease expiry. Valid only when HasNext; only a claim that arms asks for it (see
	// Claim).
	Next    time.Duration
	HasNext bool
	// Snapshot is the snapshot the claim saw the table in.
	Snapshot Snapshot
	// EndpointsVersion is webhook_endpoints_version as the claim read it: it moves with every
	// change to webhook_endpoints, so a dispatcher whose cache was loaded at another version
	// reloads it before routing or sending these rows. 0: no endpoint was ever written.
	EndpointsVersion int64
	// Horizon is the hold-back reading ('<last id>:<holders>', see Horizon.Observe), taken
	// after this claim's snapshot; empty when the claim ordered nothing.
	Horizon string
	// OrderedWaiting: ordered rows may wait behind their streams' heads (or the horizon), so
	// that settling a head calls for another claim. False only when this claim looked (it
	// armed, ordering on) and found none among the due rows it did not take (fewer than
	// 1,000 of them).
	OrderedWaiting bool
	// HorizonNow is the horizon the reading just before the claim gave it (horizonNowSQL): 0
	// when there was none, or when it found sessions holding the outbox's lock.
	HorizonNow int64
	// Last is the position of the last row claimed (the zero Cursor when none was): where
	// the next claim may start while a backlog is being drained.
	Last Cursor
}

// Cursor is a position in claim order, (created_at, id) of a row. The zero Cursor is the head:
// a claim from it considers every due row.
//
// A claim from the head walks, every time, the due index's entries of the rows settled since
// the table was last vacuumed: a settled row leaves its entry behind, marked dead by the first
// scan that passes it but removed only by VACUUM, which autovacuum runs at most once a
// minute. Draining a backlog, each claim of 100 rows walked that whole prefix: 1.4 ms of its
// 2.8 ms after 100,000 rows settled, claim time per event 13.7 µs over a 20,000-row drain
// against 28.3 µs over 200,000 (BenchmarkClaimSettle, batch 100). A claim from the previous
// full batch's last row starts past it. Rows behind that position (a peer's lease that
// expired, a producer's row whose transaction began before the last claim and committed after
// it) are found by the next claim from the head, which the dispatcher makes whenever a claim
// comes back short and at least every CursorMaxAge.
type Cursor struct {
	DueAt time.Time
	ID    int64
}

// IsHead reports whether c is the head (the zero Cursor).
func (c Cursor) IsHead() bool { return c.ID == 0 && c.DueAt.IsZero() }

// CursorMaxAge bounds how long claims may start from a cursor before one looks from the head
// again: the most a row behind the cursor waits while a backlog drains.
const CursorMaxAge = time.Second

// Skip names the endpoints (by delivery.Endpoint.Key) whose rows a claim leaves alone: those
// the dispatcher knows cannot take a row now. Leaving them in the table, unleased, costs
// nothing; claiming them only to put them back cost a claim and a settle per row, every time
// (measured against an endpoint that hangs: hundreds of such cycles a second).
type Skip struct {
	// Endpoints: every row (saturated endpoints, open circuits, a probe in flight).
	Endpoints []string
	// Retries: only retries (attempt > 1); first attempts are never held back by the retry
	// rate limit, so they are still claimed.
	Retries []string
}

// Empty reports whether s skips nothing.
func (s Skip) Empty() bool { return len(s.Endpoints) == 0 && len(s.Retries) == 0 }

// claimUnorderedSQL is claim.sql without its head check (the lines between the ordering
// markers), for the claims made while nothing is ordered. It leaves rows with an order key
// alone unless the dispatcher's endpoints are confirmed at the current version: an instance
// whose cache had not yet seen an endpoint turn ordering on sent that endpoint's ordered rows
// without the head check, out of order (two instances, one stale by 180 ms: 1, 3, 2). The check is skipped by its first
// condition then, but its presence alone cost the plan dearly: a claim of 100 rows over a
// 1,000,000-row backlog with three instances took 6–8 s instead of 80 ms (EXPLAIN ANALYZE,
// the time spent in the update's primary-key scan). $11, used only there, keeps its type
// through a condition the planner folds away.
var claimUnorderedSQL = func() string {
	begin := strings.Index(claimSQL, "-- ordering:begin")
	end := strings.Index(claimSQL, "-- ordering:end")
	if begin < 0 || end < begin {
		panic("fluxhook: claim.sql lost its ordering markers")
	}
	return claimSQL[:begin] + `AND ($14::boolean IS NULL OR true)
          -- Rows with an order key only while the dispatcher's endpoints are confirmed at the current
          -- version ($11, see Ordering.Confirmed): then no endpoint orders, and they are leftovers of
          -- one that did. Otherwise an endpoint may have turned ordering on since the cache's load.
          AND (order_key IS NULL OR $11::bigint = (SELECT coalesce(pg_catalog.pg_sequence_last_value('webhook_endpoints_version'::pg_catalog.regclass), 0)))
` + claimSQL[end+len("-- ordering:end"):]
}()

// statement is the claim statement for the ordering the claim was told about.
func (c *Claimer) statement() string {
	if c.ordered() {
		return claimSQL
	}
	return claimUnorderedSQL
}

// Claim leases up to limit due rows not skipped by skip. With arm set and fewer than limit
// rows found it arms this dispatcher: from then on producers' inserts NOTIFY it. Any other
// claim (a full batch, or arm unset) disarms it. A claim that arms also reports when the next
// row comes due (Result.Next), in the same statement, so that the dispatcher can sleep until
// then without asking again.
//
// Rows are considered from after (the head for the zero Cursor) in claim order. Each row comes
// back with the claim's lease token (delivery.Delivery.LeaseToken), which settle presents.
func (c *Claimer) Claim(ctx context.Context, limit int, skip Skip, arm bool, after Cursor) (Result, error) {
	token := c.nextToken()
	pre := c.ordered() && arm
	if !pre {
		rows, err := c.pool.Query(ctx, c.statement(), c.args(limit, skip, arm, after, token, false)...)
		if err != nil {
			return Result{}, fmt.Errorf("claim: %w", err)
		}
		return read(rows, token, c.maxPayload)
	}
	b := &pgx.Batch{}
	var res Result
	var readingErr, readErr error
	var horizonNow int64
	b.Queue(horizonNowSQL).QueryRow(func(row pgx.Row) error {
		readingErr = row.Scan(&horizonNow)
		return readingErr
	})
	b.Queue(c.statement(), c.args(limit, skip, arm, after, token, true)...).Query(func(rows pgx.Rows) error {
		res, readErr = read(rows, token, c.maxPayload)
		return readErr
	})
	if err := c.pool.SendBatch(ctx, b).Close(); err != nil {
		if readErr != nil {
			return Result{}, readErr
		}
		if readingErr != nil {
			return Result{}, fmt.Errorf("claim: reading the hold-back horizon: %w", readingErr)
		}
		return Result{}, fmt.Errorf("claim: %w", err)
	}
	res.HorizonNow = horizonNow
	return res, nil
}

// horizonNowSQL is the hold-back reading a claim that orders takes just before its statement,
// in the same round trip and implicit transaction. When it finds no other session holding
// webhook_outbox's RowExclusiveLock, every id up to the sequence's last value belongs to a
// transaction that has ended, and the claim, whose snapshot is taken after this statement
// ends, sees every one that committed: the claim may send ordered rows up to that value
// (fluxhook.horizon_now, local to the transaction). Without it, an event alone waited for a
// second claim: the first claim's own reading, taken after its snapshot, serves only the
// next (bench --workload ordered, idle: 2.02 claims per event, now 1.02). Only a claim that
// arms takes it, the one that follows a wake-up: a busy dispatcher's claims follow each other
// closely, each with the reading of the one before, and taking it there too raised the
// ordered drain's statements per event from 0.021 to 0.035 with no throughput to show for it.
//
// The argument needs READ COMMITTED: under REPEATABLE READ the claim would reuse a snapshot
// taken before this reading, and the reading is then not used (it sets 0). Any session
// holding the lock at that moment (a producer, older or newer, or a claim, settle or janitor
// statement of any instance) makes it 0 too, and the event waits for the claim after, as
// before. It returns what it set, for Result.HorizonNow.
const horizonNowSQL = `SELECT set_config('fluxhook.horizon_now',
	CASE WHEN split_part(r, ':', 2) = '' AND current_setting('transaction_isolation') = 'read committed'
	     THEN split_part(r, ':', 1) ELSE '0' END, true)::bigint
FROM webhook_outbox_horizon() r`

// ordered reports whether the next claim orders (the statement with the head check).
func (c *Claimer) ordered() bool {
	p := c.order.Load()
	return p != nil && p.Active
}

// Queue adds the claim Claim would run to b, so that it can share a round trip with other
// statements (BenchmarkSettleThenClaim measures what that saves); *res holds its result once
// the batch has run. Statements of one pgx.Batch run in one implicit transaction: a failure of
// any of them undoes them all.
func (c *Claimer) Queue(b *pgx.Batch, limit int, skip Skip, arm bool, after Cursor, res *Result) {
	token := c.nextToken()
	pre := c.ordered() && arm
	var horizonNow int64
	if pre {
		b.Queue(horizonNowSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&horizonNow) })
	}
	b.Queue(c.statement(), c.args(limit, skip, arm, after, token, pre)...).Query(func(rows pgx.Rows) (err error) {
		*res, err = read(rows, token, c.maxPayload)
		res.HorizonNow = horizonNow
		return err
	})
}

// Statement returns the statement Claim would run for a claim that Shares (arm as given), its
// arguments, and the function that reads its rows, for a caller that sends it in a pipeline of
// its own (see the dispatcher's rides). Like Claim, it takes a new lease token.
func (c *Claimer) Statement(limit int, skip Skip, arm bool, after Cursor) (string, []any, func(pgx.Rows) (Result, error)) {
	token := c.nextToken()
	return c.statement(), c.args(limit, skip, arm, after, token, false), func(rows pgx.Rows) (Result, error) {
		return read(rows, token, c.maxPayload)
	}
}

// Shares reports whether the claim for arm is the one statement Statement returns. Not the claim
// that orders and arms: it takes its hold-back reading (horizonNowSQL) first, in the same
// transaction.
func (c *Claimer) Shares(arm bool) bool { return !(c.ordered() && arm) }

// nextToken returns a lease token no earlier claim of this Claimer used. Tokens only need to
// differ between claims of one instance (settle matches leased_by too); the counter starts at
// a random value so that an instance restarted under the same INSTANCE_ID does not reuse the
// tokens of its previous life, whose rows may still be leased.
func (c *Claimer) nextToken() int64 { return c.tokens.Add(1) }

// NextToken returns a lease token no claim of this Claimer used or will use, for rows the
// dispatcher leases itself (the delivery rows of an event routed in memory).
func (c *Claimer) NextToken() int64 { return c.nextToken() }

// args are the claim statement's parameters; pre says whether a horizonNowSQL reading precedes
// it in its transaction ($14: only then does the statement consult the setting, which a role's
// or database's own setting of the same name could otherwise feed).
func (c *Claimer) args(limit int, skip Skip, arm bool, after Cursor, token int64, pre bool) []any {
	all, retries := skip.Endpoints, skip.Retries
	if all == nil {
		all = []string{}
	}
	if retries == nil {
		retries = []string{}
	}
	from := pgtype.Timestamptz{Time: after.DueAt, Valid: true}
	if after.IsHead() {
		from = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	var o Ordering
	if p := c.order.Load(); p != nil {
		o = *p
	}
	// $11 is the horizon for the statement that orders, the confirmed version for the one that
	// does not (claimUnorderedSQL): each uses only its own.
	eleven := o.Horizon
	if !o.Active {
		eleven = o.Confirmed
	}
	return []any{limit, c.lease.Milliseconds(), all, c.instance, arm, from, after.ID, token, retries,
		o.Active, eleven, o.Default, o.Routed, pre, c.readBound()}
}

// read decodes the claim statement's rows, closing them; a payload over maxPayload bytes
// (0: no limit) marks its row Oversize (see LimitPayload).
func read(rows pgx.Rows, token int64, maxPayload int) (Result, error) {
	defer rows.Close()
	var res Result
	var payload []byte
	var textSize int64
	var next *time.Duration
	var snapshot, endpointURL, horizon, tenant *string
	var version *int64
	var held *bool
	for rows.Next() {
		d := &delivery.Delivery{}
		if err := rows.Scan(&d.ID, &d.DeliveryID, &d.StreamID, &d.EventType, &payload, &textSize,
			&d.Attempt, &d.EnqueuedAt, &d.DueAt, &endpointURL, &d.EndpointID, &tenant, &d.Routed,
			&d.OrderKey, &d.DeferredBy, &next, &snapshot, &version, &horizon, &held); err != nil {
			return Result{}, fmt.Errorf("claim: scanning row: %w", err)
		}
		if snapshot != nil {
			// The statement's own row: next and snapshot, no delivery. Told apart by its
			// snapshot, never NULL there and always NULL on a claimed row: an id cannot
			// tell them apart, since a producer may insert any id, 0 included.
			if next != nil {
				res.Next, res.HasNext = max(*next, 0), true
			}
			if version != nil {
				res.EndpointsVersion = *version
			}
			if horizon != nil {
				res.Horizon = *horizon
			}
			res.OrderedWaiting = held == nil || *held
			if snapshot != nil {
				var err error
				if res.Snapshot, err = ParseSnapshot(*snapshot); err != nil {
					return Result{}, fmt.Errorf("claim: %w", err)
				}
			}
			continue
		}
		if payload != nil {
			d.Payload = compact(payload)
		}
		d.LeaseToken = token
		if tenant != nil {
			d.Tenant, d.EmptyTenant = *tenant, *tenant == ""
		}
		if endpointURL != nil {
			d.EndpointURL = *endpointURL
			if strings.TrimSpace(d.EndpointURL) == "" {
				// NULL means the configured WEBHOOK_URL; an empty string is a producer's
				// mistake, not a request for the default, and is dead-lettered as such.
				d.Invalid = "invalid row: endpoint_url is an empty string; write NULL for the configured WEBHOOK_URL, or a URL"
			}
		}
		d.Oversize = oversize(d.Payload, payload == nil, textSize, maxPayload)
		res.Rows = append(res.Rows, d)
	}
	if err := rows.Err(); err != nil {
		return Result{}, fmt.Errorf("claim: %w", err)
	}
	// The statement returns rows in the order the update met them; deliver oldest first.
	slices.SortFunc(res.Rows, func(a, b *delivery.Delivery) int {
		if c := a.DueAt.Compare(b.DueAt); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	if n := len(res.Rows); n > 0 {
		res.Last = Cursor{DueAt: res.Rows[n-1].DueAt, ID: res.Rows[n-1].ID}
	}
	return res, nil
}

// Routed is what Route did with a batch of events.
type Routed struct {
	// Deliveries are the new rows, one per (event, matching endpoint), leased to this
	// dispatcher with a token of their own: they go to the pipeline as claimed rows.
	Deliveries []*delivery.Delivery
	// Kept are the ids of the event rows that stay pending as the configured WEBHOOK_URL's
	// delivery (events without a tenant, when the default consumer is configured).
	Kept []int64
	// Settled are the ids of event rows the statement settled (fanned out, or matched
	// nothing and had no default consumer); Unrouted counts those that matched nothing.
	Settled  []int64
	Unrouted int
	// Queued counts the ordered deliveries (and ordered events kept for WEBHOOK_URL) left
	// unleased for a claim, which takes each when it is its stream's head.
	Queued int
	// Locked are the ids of events left to their lease, unrouted, because a session outside
	// fluxhook held their rows locked (route.sql waited its lock_timeout): they come back
	// once their lease ends, and claims pass over them while the lock lasts.
	Locked []int64
}

// NeedsRouting reports whether d is an event not yet fanned out to the endpoints: a first
// attempt with neither a managed endpoint nor an endpoint_url of its own.
func NeedsRouting(d *delivery.Delivery) bool {
	return d.EndpointID == "" && d.EndpointURL == "" && !d.Routed && d.Attempt == 1 && d.Invalid == ""
}

// Route fans the claimed events out to the endpoints they match, in one statement (see
// route.sql); keepDefault says the configured WEBHOOK_URL takes events without a tenant. An
// event whose lease this claim no longer holds is left alone and appears in no list of the
// result: its current holder routes it.
func (c *Claimer) Route(ctx context.Context, events []*delivery.Delivery, keepDefault bool) (Routed, error) {
	out, err := c.route(ctx, events, keepDefault)
	if err == nil || !fluxsql.IsLockTimeout(err) {
		return out, err
	}
	// A session outside fluxhook holds an event's row: the events locked now are left to
	// their lease, the others routed, instead of all of them waiting for a lease.
	ids := make([]int64, len(events))
	for i, d := range events {
		ids[i] = d.ID
	}
	locked, lerr := fluxsql.LockedOutboxRows(ctx, c.pool, ids)
	if lerr != nil || len(locked) == 0 {
		return Routed{}, err
	}
	rest := make([]*delivery.Delivery, 0, len(events)-len(locked))
	var lockedIDs []int64
	for _, d := range events {
		if locked[d.ID] {
			lockedIDs = append(lockedIDs, d.ID)
		} else {
			rest = append(rest, d)
		}
	}
	if len(rest) > 0 {
		if out, err = c.route(ctx, rest, keepDefault); err != nil {
			return Routed{}, err
		}
	}
	out.Locked = lockedIDs
	return out, nil
}

// route runs route.sql for events (see Route).
func (c *Claimer) route(ctx context.Context, events []*delivery.Delivery, keepDefault bool) (Routed, error) {
	ids := make([]int64, len(events))
	tokens := make([]int64, len(events))
	oversized := []int64{}
	reasons := map[string]string{} // an oversize event's reason, by delivery id, for its deliveries
	for i, d := range events {
		ids[i], tokens[i] = d.ID, d.LeaseToken
		if d.Oversize != "" {
			oversized = append(oversized, d.ID)
			reasons[d.DeliveryID] = d.Oversize
		}
	}
	token := c.nextToken()
	var o Ordering
	if p := c.order.Load(); p != nil {
		o = *p
	}
	rows, err := c.pool.Query(ctx, routeSQL, ids, tokens, c.instance, keepDefault, token, c.lease.Milliseconds(), o.Default,
		oversized, c.readBound())
	if err != nil {
		return Routed{}, fmt.Errorf("routing events to endpoints: %w", err)
	}
	defer rows.Close()
	var out Routed
	var kind string
	var payload []byte
	var size *int64
	var tenant *string
	var keep bool
	var n int64
	// The payload comes once per event, and the event's deliveries share it, compacted once,
	// which nothing modifies (10 endpoints compacted the same bytes 10 times, 3% of the
	// dispatcher's CPU in the fanout bench).
	payloads := make(map[string][]byte, len(events))
	for rows.Next() {
		d := &delivery.Delivery{LeaseToken: token, Routed: true}
		payload, tenant = nil, nil
		if err := rows.Scan(&kind, &d.ID, &d.DeliveryID, &d.StreamID, &d.EventType, &payload, &size, &d.Attempt,
			&d.EnqueuedAt, &d.DueAt, &d.EndpointID, &tenant, &keep, &n); err != nil {
			return Routed{}, fmt.Errorf("routing events to endpoints: scanning: %w", err)
		}
		if tenant != nil { // NULL and '' are different tenants, as in routing
			d.Tenant, d.EmptyTenant = *tenant, *tenant == ""
		}
		if kind != "d" && payload != nil {
			payloads[d.DeliveryID] = compact(payload)
		}
		switch {
		case kind == "d":
			if size != nil { // its delivery id is shared by several events: its own
				if payload != nil {
					d.Payload = compact(payload)
				}
				d.Oversize = oversize(d.Payload, payload == nil, *size, c.maxPayload)
			}
			out.Deliveries = append(out.Deliveries, d)
		case kind == "q":
			out.Queued++
		case kind == "r":
			out.Queued++
			out.Settled = append(out.Settled, d.ID) // leaves the pipeline like a settled event
		case keep:
			out.Kept = append(out.Kept, d.ID)
		default:
			out.Settled = append(out.Settled, d.ID)
			if n == 0 {
				out.Unrouted++
			}
		}
	}
	if err := rows.Err(); err != nil {
		return Routed{}, fmt.Errorf("routing events to endpoints: %w", err)
	}
	for _, d := range out.Deliveries {
		if d.Payload != nil || d.Oversize != "" {
			continue
		}
		if r, ok := reasons[d.DeliveryID]; ok { // its event's payload was not returned
			d.Oversize = r
			continue
		}
		p, ok := payloads[d.DeliveryID]
		if !ok {
			return Routed{}, fmt.Errorf("routing events to endpoints: delivery %d of event %s came without its event's payload", d.ID, d.DeliveryID)
		}
		d.Payload = p
	}
	return out, nil
}

// Snapshot is a PostgreSQL snapshot (pg_current_snapshot): which transactions' effects it
// sees. The zero Snapshot sees nothing.
type Snapshot struct {
	xmin, xmax uint64
	xip        []uint64 // in progress when it was taken, xmin <= id < xmax
}

// ParseSnapshot parses the text form of a pg_snapshot, "xmin:xmax:xip,xip,...".
func ParseSnapshot(text string) (Snapshot, error) {
	bad := func() (Snapshot, error) { return Snapshot{}, fmt.Errorf("malformed snapshot %q", text) }
	xminText, rest, ok1 := strings.Cut(text, ":")
	xmaxText, xipText, ok2 := strings.Cut(rest, ":")
	if !ok1 || !ok2 {
		return bad()
	}
	var s Snapshot
	var err error
	if s.xmin, err = strconv.ParseUint(xminText, 10, 64); err != nil {
		return bad()
	}
	if s.xmax, err = strconv.ParseUint(xmaxText, 10, 64); err != nil || s.xmax < s.xmin {
		return bad()
	}
	for xipText != "" {
		var id string
		id, xipText, _ = strings.Cut(xipText, ",")
		x, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			return bad()
		}
		s.xip = append(s.xip, x)
	}
	return s, nil
}

// Sees reports whether the snapshot sees the effects of transaction xid, assuming it
// committed: it ended before the snapshot was taken. (A transaction that rolled back sends no
// NOTIFY, the only use of this.)
func (s Snapshot) Sees(xid uint64) bool {
	if xid < s.xmin {
		return true
	}
	if xid >= s.xmax {
		return false
	}
	return !slices.Contains(s.xip, xid)
}

// Xmin returns the oldest transaction still in progress when the snapshot was taken (every
// transaction below it had ended); 0 for the zero Snapshot.
func (s Snapshot) Xmin() uint64 { return s.xmin }

// InProgress returns the transactions in progress when the snapshot was taken (do not modify
// it). After the claim that confirms the dispatcher is armed, these are the only producers
// that may have read the NOTIFY switch before it was set and may still commit without a
// NOTIFY (see the dispatcher's claim loop).
func (s Snapshot) InProgress() []uint64 { return s.xip }

// compact turns jsonb's text form ({"a": 1}) into the compact bytes the original sent
// (JSON.stringify: {"a":1}). The result is computed once per attempt from the stored value, so
// every attempt of an event carries the same bytes.
func compact(text []byte) []byte {
	var buf bytes.Buffer
	buf.Grow(len(text))
	if err := json.Compact(&buf, text); err != nil {
		// jsonb output is always valid JSON; keep the stored text rather than fail.
		return append([]byte(nil), text...)
	}
	return buf.Bytes()
}

// announceSQL pushes the producers' NOTIFY switch (schema 2) to at least ttl from now, by the
// database's clock, and reports whether it had lapsed. greatest: another instance may have
// pushed it further already.
const announceSQL = `WITH prev AS (
    SELECT coalesce(pg_catalog.pg_sequence_last_value('webhook_outbox_notify_until'::pg_catalog.regclass), 0) AS until,
           (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms)
SELECT pg_catalog.setval('webhook_outbox_notify_until'::pg_catalog.regclass, greatest(until, now_ms + $1::bigint)) > 0, until < now_ms
FROM prev`

// CheckAnnounce returns an error naming the missing grant when this dispatcher's role may not
// set the producers' NOTIFY switch. Without it every wake-up would fall back to the poll, so
// the dispatcher refuses to start instead of running slowly.
func (c *Claimer) CheckAnnounce(ctx context.Context) error {
	var ok bool
	if err := c.pool.QueryRow(ctx, `SELECT has_sequence_privilege('webhook_outbox_notify_until', 'UPDATE')`).Scan(&ok); err != nil {
		return fmt.Errorf("checking the NOTIFY switch's privileges: %w", err)
	}
	if !ok {
		return errors.New("the database role may not set the producers' NOTIFY switch: run GRANT UPDATE ON SEQUENCE webhook_outbox_notify_until TO <fluxhook's role>")
	}
	return nil
}

// CheckLogGrants returns an error naming the missing grants when this dispatcher's role may not
// write the delivery log or maintain its partitions (schema 7). Without the first no row could
// be settled; without the second the log would never be pruned and every settle would land in
// its default partition. Either is a deployment mistake to fix before claiming anything.
func (c *Claimer) CheckLogGrants(ctx context.Context) error {
	var insert, maintain bool
	if err := c.pool.QueryRow(ctx, `SELECT has_table_privilege('webhook_delivery_log', 'INSERT'),
		has_function_privilege('webhook_delivery_log_maintain(interval, interval, interval)', 'EXECUTE')
		AND has_function_privilege('webhook_delivery_log_drop_one(interval, interval)', 'EXECUTE')`).
		Scan(&insert, &maintain); err != nil {
		return fmt.Errorf("checking the delivery log's privileges: %w", err)
	}
	var missing []string
	if !insert {
		missing = append(missing, "GRANT SELECT, INSERT ON webhook_delivery_log TO <fluxhook's role>")
	}
	if !maintain {
		missing = append(missing, "GRANT EXECUTE ON FUNCTION webhook_delivery_log_maintain(interval, interval, interval), "+
			"webhook_delivery_log_drop_one(interval, interval) TO <fluxhook's role>")
	}
	if len(missing) > 0 {
		return errors.New("the database role may not write the delivery log or maintain its partitions: run " + strings.Join(missing, "; "))
	}
	return nil
}

// Announce makes producers' inserts NOTIFY for the next ttl: the dispatcher calls it when it
// starts waiting for work, and again before ttl runs out while it keeps waiting. A busy
// dispatcher stops calling it and the switch lapses by itself, as does a crashed one's.
//
// lapsed reports that the switch had run out before this call: producers that committed in
// between sent no NOTIFY, so a dispatcher that believed itself armed must claim once more to
// find their rows (a renewal that came late, the machine or the database stalled).
func (c *Claimer) Announce(ctx context.Context, ttl time.Duration) (lapsed bool, err error) {
	var set bool
	if err := c.pool.QueryRow(ctx, announceSQL, ttl.Milliseconds()).Scan(&set, &lapsed); err != nil {
		return false, fmt.Errorf("announcing to producers: %w", err)
	}
	return lapsed, nil
}

// Park moves the ordered rows that are due but wait behind a head not due for a second or
// more to their head's due time, looking at the oldest limit due rows, and first releases the
// parked rows whose head left without releasing them, looking at the soonest limit future
// rows; it returns how many rows it parked and released. orderDefault is
// WEBHOOK_ORDERING=stream. settle and route park such rows as they make them wait; this
// catches those a producer inserted meanwhile, which every claim would otherwise read, and
// look their head up, until the head is due, and those a race parked behind a head that was
// leaving.
func (c *Claimer) Park(ctx context.Context, orderDefault bool, limit int) (parked, released int64, err error) {
	tag, err := c.pool.Exec(ctx, unparkSQL, limit)
	if err != nil {
		return 0, 0, fmt.Errorf("releasing ordered rows parked behind a head that left: %w", err)
	}
	released = tag.RowsAffected()
	tag, err = c.pool.Exec(ctx, parkSQL, orderDefault, limit)
	if err != nil {
		return 0, released, fmt.Errorf("parking ordered rows behind their heads: %w", err)
	}
	return tag.RowsAffected(), released, nil
}

// Prune deletes the rows settled in place before schema 7 (processed rows left in
// webhook_outbox by the upgrade, or by an instance of an older fluxhook during a rolling
// upgrade) once they are older than retention, in batches of at most batch rows, until a
// batch comes back short or ctx ends. It returns how many rows it deleted. Once no such row is
// left, a call costs one probe of an empty partial index. The delivery log of schema 7 is
// pruned by MaintainLog. Dead letters are never touched: they stay until an operator purges them.
func (c *Claimer) Prune(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	var total int64
	for {
		tag, err := c.pool.Exec(ctx, janitorSQL, retention.Milliseconds(), batch)
		if err != nil {
			return total, fmt.Errorf("janitor: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) || ctx.Err() != nil {
			return total, nil
		}
	}
}

// logSteps are the partition widths the delivery log uses, from the finest: round figures,
// so that partition names read as times.
var logSteps = []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour}

// LogPartitionStep is the width of the delivery log's partitions for a retention: the widest
// round step of at most a quarter of it, from 1 minute to 1 day. The log then holds between
// retention and retention plus one step (a partition is dropped once its newest possible row
// is past retention), about five to eight partitions for most retentions, and the default 7
// days gives daily partitions: few enough that planning a read of the log stays cheap, small
// enough that the overshoot is a quarter of the retention at most.
func LogPartitionStep(retention time.Duration) time.Duration {
	step := logSteps[0]
	for _, s := range logSteps {
		if s <= retention/4 {
			step = s
		}
	}
	return step
}

// LogPartitionsAhead is how far ahead of now MaintainLog creates partitions: two steps and
// five minutes, so that a janitor running every minute always stays ahead of the clock and
// settles land in a partition of their own, not in the default one.
func LogPartitionsAhead(retention time.Duration) time.Duration {
	return 2*LogPartitionStep(retention) + 5*time.Minute
}

// MaintainLog drops the delivery log's partitions that are past retention, one transaction
// each (webhook_delivery_log_drop_one: the log's lock that settles queue behind is held for
// the drop alone), then creates those the next LogPartitionsAhead needs
// (webhook_delivery_log_maintain, which also moves what the default partition caught for
// them). It returns one line per partition created, dropped, postponed or that could not be
// created ("creation of ... failed: ..."; the others are still created). Several instances
// may call it at once: all but one find nothing to do. Both functions pin their own
// DateStyle, TimeZone and search_path (schema 9): the pool's session settings do not matter.
func (c *Claimer) MaintainLog(ctx context.Context, retention time.Duration) ([]string, error) {
	step := LogPartitionStep(retention)
	var done []string
	for range maxDropsPerRun {
		var line *string
		if err := c.pool.QueryRow(ctx, `SELECT webhook_delivery_log_drop_one($1::bigint * interval '1 millisecond',
			$2::bigint * interval '1 millisecond')`, retention.Milliseconds(), step.Milliseconds()).Scan(&line); err != nil {
			return done, fmt.Errorf("dropping delivery log partitions: %w", err)
		}
		if line == nil {
			break
		}
		done = append(done, *line)
		if !strings.HasPrefix(*line, "dropped ") {
			break // postponed: the next run tries again
		}
	}
	rows, err := c.pool.Query(ctx, `SELECT * FROM webhook_delivery_log_maintain($1::bigint * interval '1 millisecond',
		$2::bigint * interval '1 millisecond', $3::bigint * interval '1 millisecond')`,
		retention.Milliseconds(), step.Milliseconds(), LogPartitionsAhead(retention).Milliseconds())
	if err != nil {
		return done, fmt.Errorf("creating delivery log partitions: %w", err)
	}
	created, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return done, fmt.Errorf("creating delivery log partitions: %w", err)
	}
	return append(done, created...), nil
}

// maxDropsPerRun bounds the partitions one MaintainLog drops, so that a janitor finding a long
// history to drop (a retention just shortened) leaves the rest to its next runs.
const maxDropsPerRun = 100
