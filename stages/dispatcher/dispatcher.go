package dispatcher

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/pipeline"
	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/memstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/send"
	"github.com/fluxora/fluxhook/stages/settle"
	"github.com/fluxora/fluxhook/stages/sign"
	"github.com/fluxora/fluxhook/stages/wake"
)

// Dispatcher is one running fluxhook instance. Start it once; Stop it once.
type Dispatcher struct {
	cfg     Config
	log     *zap.Logger
	signer  *sign.Signer
	sender  *send.Sender
	slots   *pipeline.Slots
	pool    *pgxpool.Pool
	claimer *claim.Claimer
	settler *settle.Settler
	waker   *wake.Waker

	claimed  chan []*delivery.Delivery
	toSend   chan *delivery.Delivery
	toSettle chan *delivery.Delivery
	// stages owns the goroutines of the listener, claiming, housekeeping, prepare, send and
	// settle, and drains them on Stop.
	stages pipeline.Group
	// cutShort is what Stop returns when the drain was cut short, set by stages.OnCutShort
	// on Stop's goroutine.
	cutShort error

	stats   Stats
	metrics *metrics
	// outcomes records endpoint outcomes off the settle goroutine (see outcomeRecorder);
	// outcomesCancel ends a record still waiting when Stop's drain ends.
	outcomes       *outcomeRecorder
	outcomesCancel context.CancelFunc
	// release closes what New opened, once: by Stop, or by a Stop without a (successful) Start.
	release sync.Once
	// redis is the gate's Redis store when REDIS_URL is set, closed by Stop.
	redis *redisstore.Store
	// lastLoop is when the claiming loop last went round (Unix nanoseconds), for /livez.
	lastLoop atomic.Int64
	// now is the clock /livez compares lastLoop with: time.Now, but a test's own so that it
	// can reach the liveness limit without waiting for it.
	now func() time.Time
	// draining is set as soon as Stop begins, for /readyz.
	draining atomic.Bool
	// gated are the endpoints the gate is holding back, which claims skip (see gatedEndpoints).
	gated gatedEndpoints
	// streamIndex is set once the index ordered delivery needs is known to exist; wantIndex
	// asks indexer to build it (see ensureStreamIndex).
	streamIndex atomic.Bool
	wantIndex   chan struct{}
	// streamMoved is set when this instance settled the head of an ordered stream, whose next
	// row the next claim must look for from the head of the due index (see streamMoved).
	streamMoved atomic.Bool
	// orderedWaiting: the last claim saw ordered rows waiting behind their heads, or could not
	// tell (claim.Result.OrderedWaiting).
	orderedWaiting atomic.Bool
	// endpoints are the managed endpoints (webhook_endpoints), cipher opens their secrets.
	endpoints endpointCache
	cipher    *endpoints.Cipher
	// inMemory says events may be routed in memory (see routeInMemory): the dispatcher's
	// role may take ids from the queue's sequence for the deliveries it logs.
	inMemory atomic.Bool
	// riding is a settle waiting to share the next claim's round trip, and claiming is set
	// while the claiming loop runs and can take it (see settleRiding).
	riding   atomic.Pointer[ride]
	claiming atomic.Bool
	// waitsForSettle is set while the claiming loop waits for freed capacity (waitForSettles).
	waitsForSettle atomic.Bool

	mu       sync.Mutex
	started  bool
	stopping bool
	closed   bool // Stop ran before a successful Start
	stopped  chan struct{}
}

// Stats are running totals, for tests, `status` and metrics.
type Stats struct {
	Claimed, Delivered, Retried, DeadLettered, Deferred, Released atomic.Int64
	Claims, Settles, SettleErrors, ClaimErrors                    atomic.Int64
	// SharedSettles counts the settles that shared a claim's round trip (see settleRiding).
	SharedSettles atomic.Int64
	// AlreadyDelivered counts the Delivered outcomes that were a consumer's 409 Conflict to a
	// delivery id it already had (Outcome.AlreadyDelivered); they are in Delivered too.
	AlreadyDelivered atomic.Int64
	// Stale counts outcomes settle refused: the lease had run out and another claim held
	// the row.
	Stale atomic.Int64
	// RoutedInMemory counts the events routed from the endpoint cache (routeInMemory).
	RoutedInMemory atomic.Int64
}

// New validates cfg and builds the stages. Nothing touches the database until Start.
func New(cfg Config) (*Dispatcher, error) {
	cfg = cfg.WithDefaults()
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	// Without WEBHOOK_URL and WEBHOOK_SECRET, managed endpoints (each with its own secret) are
	// the only consumers; rows naming an endpoint_url cannot be signed and are dead-lettered.
	var signer *sign.Signer
	if cfg.Secret != "" || cfg.DefaultURL != "" {
		var err error
		if signer, err = sign.New(sign.Config{Secret: cfg.Secret, PreviousSecret: cfg.PreviousSecret, Scheme: cfg.Scheme}); err != nil {
			errs = append(errs, err)
		}
	}
	sender, err := send.New(send.Config{
		DefaultURL:          cfg.DefaultURL,
		Timeout:             cfg.Timeout,
		EndpointConcurrency: cfg.EndpointConcurrency,
		AllowedNetworks:     cfg.AllowedNetworks,
		RowURLNetworks:      cfg.RowURLNetworks,
		// 409 as "already delivered": nil lets each request's scheme decide (see send.ConflictDelivered).
		Conflict409Delivered: cfg.Conflict409Delivered,
		PermanentStatuses:    cfg.PermanentStatuses,
		ResponseExcerptBytes: cfg.ResponseExcerptBytes,
	})
	if err != nil {
		errs = append(errs, err)
	}
	cipher, err := endpoints.NewCipher(cfg.EncryptionKey, cfg.EncryptionKeyPrevious)
	if err != nil {
		errs = append(errs, err)
	}
	var store *redisstore.Store
	if cfg.Gate == nil && cfg.RedisURL != "" {
		if store, err = redisstore.Open(cfg.RedisURL, redisstore.Options{}); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		if sender != nil {
			sender.Close()
		}
		if store != nil {
			_ = store.Close()
		}
		return nil, err
	}
	d := &Dispatcher{
		cfg:       cfg,
		log:       cfg.Logger,
		signer:    signer,
		sender:    sender,
		slots:     pipeline.NewSlots(cfg.MaxInFlight),
		wantIndex: make(chan struct{}, 1),
		cipher:    cipher,
		stopped:   make(chan struct{}),
		now:       time.Now,
	}
	d.metrics = newMetrics(d)
	if d.cfg.Gate == nil {
		var gs gate.Store = memstore.New(memstore.Options{})
		if store != nil {
			gs = store
			d.redis = store
			d.metrics.countRoundTrips(store)
		}
		g, err := gate.NewBreakerGate(gs, gate.Params{
			Threshold:  cfg.BreakerThreshold,
			Reset:      cfg.BreakerReset,
			RetryRPS:   cfg.RetryRPS,
			RetryShare: cfg.RetryShare,
			// The probe is held from the gate check through settle: the request timeout
			// plus room to settle, so it cannot expire while its request is still running.
			ProbeTimeout: cfg.Timeout + 5*time.Second,
		}, gate.Hooks{
			OnTransition: func(from, to string) { d.metrics.transitions.WithLabelValues(from, to).Inc() },
			OnFailOpen:   d.metrics.failOpen.Inc,
			Logger:       cfg.Logger,
		})
		if err != nil {
			sender.Close()
			if store != nil {
				_ = store.Close()
			}
			return nil, err
		}
		d.cfg.Gate = g
	}
	return d, nil
}

// Config returns the effective configuration (defaults applied).
func (d *Dispatcher) Config() Config { return d.cfg }

// Stats returns the running totals.
func (d *Dispatcher) Stats() *Stats { return &d.stats }

// ListenerConnected reports whether the NOTIFY listener is currently listening.
func (d *Dispatcher) ListenerConnected() bool {
	_, w := d.handles()
	return w != nil && w.Connected()
}

// Start connects, checks the schema, registers this instance and starts every stage. It
// returns an error, having claimed nothing, when the database is unreachable or the schema is
// not current.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started {
		return errors.New("dispatcher: already started")
	}
	if d.closed {
		// Stop closed the HTTP transport and the Redis client: started now, the gate would
		// fail open on every row and the breaker and rate limit would be silently off.
		return errors.New("dispatcher: Start after Stop; create a new Dispatcher with New")
	}

	poolCfg, err := pgxpool.ParseConfig(d.cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	SessionParams(poolCfg.ConnConfig.RuntimeParams, d.cfg.DurableCommit)
	if err := poolSize(poolCfg, d.cfg.DatabaseURL); err != nil {
		return err
	}
	listenCfg := poolCfg.ConnConfig.Copy()
	listenCfg.RuntimeParams["application_name"] = "fluxhook-listener"
	if d.cfg.ListenURL != "" {
		if listenCfg, err = pgx.ParseConfig(d.cfg.ListenURL); err != nil {
			return fmt.Errorf("DATABASE_LISTEN_URL: %w", err)
		}
		if listenCfg.RuntimeParams["application_name"] == "" {
			listenCfg.RuntimeParams["application_name"] = "fluxhook-listener"
		}
	}

	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("connecting to the database: %w", err)
	}
	if err := checkSession(ctx, pool); err != nil {
		pool.Close()
		return err
	}
	if err := fluxsql.CheckCurrent(ctx, pool); err != nil {
		pool.Close()
		return err
	}
	d.pool = pool
	d.claimer = claim.New(pool, d.cfg.InstanceID, d.cfg.Lease)
	// Rows over the limit come back marked (Oversize), without their body when far over it.
	d.claimer.LimitPayload(d.cfg.MaxPayloadBytes)
	d.settler = settle.New(pool, settle.Config{Schedule: d.cfg.RetrySchedule, Jitter: d.cfg.RetryJitter, InstanceID: d.cfg.InstanceID})
	if err := d.claimer.CheckAnnounce(ctx); err != nil {
		pool.Close()
		return err
	}
	if err := d.claimer.CheckLogGrants(ctx); err != nil {
		pool.Close()
		return err
	}
	if err := d.claimer.Register(ctx); err != nil {
		pool.Close()
		return err
	}
	if d.cfg.Ordering {
		// Built before the first claim when there is none. One that exists in an older form
		// serves the head check while the indexer replaces it, so that a dispatcher of a new
		// release does not wait for a build to start delivering.
		usable, err := fluxsql.StreamIndexUsable(ctx, pool)
		if err != nil {
			pool.Close()
			return fmt.Errorf("WEBHOOK_ORDERING=stream: %w", err)
		}
		if !usable {
			if built, err := fluxsql.EnsureStreamIndex(ctx, pool); err != nil {
				pool.Close()
				return fmt.Errorf("WEBHOOK_ORDERING=stream: %w", err)
			} else if built {
				d.log.Info("created the stream index ordered delivery needs", zap.String("index", "webhook_outbox_stream_idx"))
			}
			d.streamIndex.Store(true)
		} else {
			d.ensureStreamIndex()
		}
		if err := d.checkOrderingIDs(ctx); err != nil {
			pool.Close()
			return fmt.Errorf("WEBHOOK_ORDERING=stream: %w", err)
		}
	}
	// The endpoints are loaded before the first claim, which must already know whether any
	// of them orders its streams and whether events are routed: a claim that did not would
	// take an ordered row without its head check (schema 6).
	var version int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(pg_catalog.pg_sequence_last_value('webhook_endpoints_version'::pg_catalog.regclass), 0)`).Scan(&version); err != nil {
		pool.Close()
		return fmt.Errorf("reading the endpoints' version: %w", err)
	}
	d.endpoints.version.Store(version)
	// Version 0: no endpoint was ever written, and any change would move it first. The empty
	// cache is confirmed at it (claims that order nothing need no head check for keyed rows).
	d.endpoints.confirmed = version == 0
	var canLog bool
	// Routing in memory logs each delivery under an id of the queue's sequence, which needs
	// USAGE on it; a role without it routes every delivery through a row, as before.
	if err := pool.QueryRow(ctx, `SELECT coalesce(has_sequence_privilege(pg_get_serial_sequence('webhook_outbox', 'id'), 'USAGE'), false)`).Scan(&canLog); err != nil {
		pool.Close()
		return fmt.Errorf("checking the grant on webhook_outbox's id sequence: %w", err)
	}
	d.inMemory.Store(canLog)
	if !canLog {
		d.log.Info("fan-out makes a queue row for every delivery: grant USAGE on webhook_outbox's id sequence to route in memory, at half the database's work per delivery",
			zap.String("grant", "GRANT USAGE ON SEQUENCE webhook_outbox_id_seq TO <the dispatcher's role>"))
	}
	d.refreshEndpoints(ctx)
	// The log's partitions for the next minutes exist before the first settle, so that it
	// does not land in the default partition.
	d.maintainLog(ctx)
	// After the partitions: creating one invalidates what the warm-up leaves.
	d.warmSettle(ctx)
	var connects atomic.Int64
	d.waker = wake.New(wake.Config{
		Connect: func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, listenCfg) },
		// The listener's liveness check: a NOTIFY sent over the pool must come back on the
		// listening connection, or that connection is replaced (a silently dead one would
		// keep /readyz green while only the poll delivered).
		Ping: func(ctx context.Context, channel, payload string) error {
			_, err := pool.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload)
			return err
		},
		PollInterval: d.cfg.PollInterval,
		OnWake:       func(s wake.Source) { d.metrics.wakeups.WithLabelValues(string(s)).Inc() },
		OnError: func(err error) {
			d.log.Warn("listener error", zap.Error(err))
		},
		OnConnect: func() {
			if connects.Add(1) > 1 {
				d.metrics.reconnects.Inc()
				d.log.Info("listener reconnected")
			}
		},
	})

	n := d.cfg.MaxInFlight
	d.claimed = make(chan []*delivery.Delivery, 2)
	d.toSend = make(chan *delivery.Delivery, n)
	d.toSettle = make(chan *delivery.Delivery, n)

	// Sources stop first (claiming, the listener, housekeeping); closing claimed then drains
	// prepare, whose end closes toSend and drains send, whose end closes toSettle (prepare
	// writes to it too, but always before it closes toSend), and settle finishes last.
	d.stages.Source(func(ctx context.Context) {
		d.waker.Start(ctx)
		<-ctx.Done()
		d.waker.Stop()
	}, nil)
	d.stages.Source(d.claimLoop, func() { close(d.claimed) })
	d.stages.Source(d.maintain, nil)
	d.stages.Source(d.indexer, nil)
	d.stages.Stage(1, func(ctx context.Context) {
		for batch := range d.claimed {
			d.prepare(ctx, batch)
		}
	}, func() { close(d.toSend) })
	d.stages.Stage(n, func(ctx context.Context) {
		for del := range d.toSend {
			d.sender.Send(ctx, del)
			if del.Outcome.Error == send.LeaseSpent {
				// Logged here, not with the outcome: when another instance holds the row by
				// now, settle refuses the release and reports it as stale instead.
				d.log.Warn("delivery released unsent: this instance was held up past the row's lease",
					append(d.deliveryFields(del), zap.Int64("late_ms", time.Since(del.SendBy).Milliseconds()))...)
			}
			d.toSettle <- del
		}
	}, func() { close(d.toSettle) })
	// Settle is abandoned only when the drain was cut short and it is stuck for
	// pipeline.DefaultSinkBound more (database gone): the leases bring its rows back.
	// A settle takes up to the pipeline's capacity (at most 1,000 rows), not a claim's batch
	// size: a claimed batch of events fans out to up to MaxInFlight deliveries, and settling
	// them 100 at a time took 7.5 statements per batch in the fan-out bench (3.5 with this
	// bound; 6% less PostgreSQL CPU per delivery, `bench --workload fanout --fanout-events
	// 8000`). The 1,000 bounds one statement's transaction, and the row-by-row fallback
	// after a refused batch, however large WEBHOOK_MAX_IN_FLIGHT is.
	d.stages.Sink(func(ctx context.Context) {
		complete := func(n int) bool { return d.slots.InUse() <= n } // every claimed row is back
		rideTimer := time.NewTimer(time.Hour)
		rideTimer.Stop()
		pipeline.BatchUntil(d.toSettle, max(min(d.cfg.MaxInFlight, 1000), d.cfg.BatchSize, 64), settleLinger, complete, func(batch []*delivery.Delivery) {
			d.settleRiding(ctx, batch, rideTimer)
		})
	})
	d.stages.OnCutShort = func(cause error) {
		inFlight := d.slots.InUse()
		d.cutShort = fmt.Errorf("drain cut short (%w): %d rows in flight were cancelled and will be delivered again", cause, inFlight)
		d.log.Warn("drain cut short: cancelling in-flight requests", zap.Int("in_flight", inFlight),
			zap.String("cause", cause.Error()))
	}
	// Before the stages: the settle stage hands it outcomes from its first batch.
	d.outcomes = newOutcomeRecorder()
	var outcomesCtx context.Context
	outcomesCtx, d.outcomesCancel = context.WithCancel(context.WithoutCancel(ctx))
	go d.recordOutcomes(outcomesCtx)
	if err := d.stages.Start(ctx); err != nil {
		d.outcomesCancel()
		close(d.outcomes.done)
		<-d.outcomes.ended
		pool.Close()
		return err
	}
	// Only now: Stop after a failed Start has nothing to shut down.
	d.started = true
	d.log.Info("dispatcher started",
		zap.String("instance_id", d.cfg.InstanceID),
		zap.Int("max_in_flight", n),
		zap.Int("batch_size", d.cfg.BatchSize))
	return nil
}

// DefaultPoolConns is the dispatcher's pool size when DATABASE_URL does not set
// pool_max_conns: claiming, settling, housekeeping and the NOTIFY switch's renewal each hold a
// connection at most briefly and at most one at a time (the listener has its own), and the
// endpoint outcomes' record one, which may wait for a row another session holds locked.
const DefaultPoolConns = 5

// poolSize applies DefaultPoolConns unless the operator set pool_max_conns in DATABASE_URL,
// which is then honoured, or refused when it leaves claiming and settling without a connection
// each.
func poolSize(cfg *pgxpool.Config, databaseURL string) error {
	if !strings.Contains(databaseURL, "pool_max_conns") {
		cfg.MaxConns = DefaultPoolConns
		return nil
	}
	if cfg.MaxConns < 2 {
		return fmt.Errorf("DATABASE_URL: pool_max_conns=%d is too few: the dispatcher claims and settles at the same time and needs at least 2 connections (default %d when unset)", cfg.MaxConns, DefaultPoolConns)
	}
	return nil
}

// SessionParams sets, in params, the session settings the dispatcher's pool connections run
// with, leaving any the operator set in DATABASE_URL. The claim and settle statements are
// written for them (and measured with them, in stages/claim's benchmark).
func SessionParams(params map[string]string, durableCommit bool) {
	if params["application_name"] == "" {
		params["application_name"] = "fluxhook"
	}
	// Marks our sessions for the insert trigger: retry and deferral rows we insert need no
	// NOTIFY (they are not due yet, and settle sets our own timer for them).
	params["fluxhook.dispatcher"] = "on"
	if !durableCommit {
		params["synchronous_commit"] = "off"
	}
	// Every statement the dispatcher runs is prepared once per connection and written so that
	// one plan suits every argument (ids through the primary key, limits inside ARRAY(...)).
	// PostgreSQL's default would re-plan the claim and settle CTEs on every call, because
	// their estimated generic cost exceeds the custom one: ~150 µs of planning per statement,
	// more than executing a one-row claim (BenchmarkClaimSettle in stages/claim, batch of 1:
	// 308 → 176 µs per claim).
	if params["plan_cache_mode"] == "" {
		params["plan_cache_mode"] = "force_generic_plan"
	}
	// A generic plan is made once per connection, from the statistics of that moment, and
	// kept until the table is analyzed again. Made while webhook_outbox is empty or small (a
	// new install, the start of every bench workload) it finds its rows with sequential
	// scans, and keeps doing so as the table grows: the bench's steady workload spent 880 µs
	// of PostgreSQL CPU per event, mostly scanning the table for the one row each claim and
	// settle touched. Every dispatcher statement is written to reach its rows through an
	// index (the primary key, the due index, the processed_at index), so sequential scans
	// are switched off for the dispatcher's sessions: the plan is then the index plan
	// whatever the statistics said when it was made. Bitmap scans too: they read every
	// matching index entry before sorting, and made on a small table they were the plan for
	// the claim's "next due" look-up, which must stop after the first 1,000 due rows of the
	// index however long the backlog grows.
	if params["enable_seqscan"] == "" {
		params["enable_seqscan"] = "off"
	}
	if params["enable_bitmapscan"] == "" {
		params["enable_bitmapscan"] = "off"
	}
	// With sequential scans off, a statement that must still scan a small table (loading
	// webhook_endpoints: there is no index to read all of it by) is costed above 10^10, far
	// past jit_above_cost, and PostgreSQL compiled it with LLVM on every new plan: loading 10
	// endpoints took 155 ms of execution and 56 ms of planning instead of 3 ms, at every start
	// and endpoint change (most of the time from "starting fluxhook" to "dispatcher started").
	// None of the dispatcher's statements runs long enough for JIT to pay for itself.
	if params["jit"] == "" {
		params["jit"] = "off"
	}
}

// Stop shuts down in two phases: it stops claiming and waits until every claimed row has been
// sent and settled; if ctx ends first (drain timeout, second signal) it cancels the requests
// still in flight, whose rows are released for redelivery, and finishes settling. Safe to call
// more than once and before Start.
func (d *Dispatcher) Stop(ctx context.Context) error {
	d.mu.Lock()
	if !d.started {
		// Never started (or Start failed): only what New opened is left to close, and a
		// later Start is refused (it would run on closed clients).
		d.closed = true
		d.mu.Unlock()
		d.release.Do(d.closeClients)
		return nil
	}
	if d.stopping {
		d.mu.Unlock()
		<-d.stopped
		return nil
	}
	d.stopping = true
	d.draining.Store(true)
	d.mu.Unlock()
	defer close(d.stopped)

	var drainErr error
	if d.stages.Stop(ctx) != nil {
		drainErr = d.cutShort
	}
	// The settles are done: the outcomes they left are recorded, for as long as the drain
	// allows (a row another session holds locked may keep them waiting), then given up.
	close(d.outcomes.done)
	select {
	case <-d.outcomes.ended:
	case <-ctx.Done():
		d.outcomesCancel()
		<-d.outcomes.ended
	}
	d.outcomesCancel()

	unregCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if err := d.claimer.Unregister(unregCtx); err != nil {
		d.log.Warn("unregister failed", zap.Error(err))
	}
	cancel()
	d.pool.Close()
	d.release.Do(d.closeClients)
	d.log.Info("dispatcher stopped", zap.String("instance_id", d.cfg.InstanceID))
	return drainErr
}

// closeClients closes the HTTP transport and the Redis client that New opened.
func (d *Dispatcher) closeClients() {
	d.sender.Close()
	if d.redis != nil {
		_ = d.redis.Close()
	}
}

// settleLinger is how long settling waits for more outcomes once it has one, unless every
// claimed row is already back. Responses to one claimed batch return over a few milliseconds;
// without it a drain settled each claimed batch in about three statements. The wait costs an
// idle dispatcher nothing (its lone row is complete at once) and only holds capacity, not
// deliveries, under load.
const settleLinger = 10 * time.Millisecond

// idleFollowUp is how long after arming the claiming loop looks once more (see claimLoop).
const idleFollowUp = 100 * time.Millisecond

// claimLoop owns claiming. While claims come back full it claims again at once without
// arming (busy: producers need not NOTIFY). When a busy spell ends it waits armHoldoff, then
// claims in arming mode: a claim that takes less than a full batch leaves it armed, and it
// sleeps until a wake-up (NOTIFY, due timer, poll) or freed capacity. Under light traffic it
// stays armed, so each event costs one claim and arrives on its NOTIFY.
func (d *Dispatcher) claimLoop(ctx context.Context) {
	armed := false          // the database's flag for us, as our last claim left it
	var announced time.Time // when we last set the producers' NOTIFY switch
	arming := true          // the next claim may arm us (at start we may be idle already)
	followUp := false
	// Producers that may commit without a NOTIFY: those in progress at the claim that
	// confirmed arming (they may have read the switch before it was set), while later claims
	// still see them in progress; and how long until the next look for them.
	var watch []uint64
	watchDelay := idleFollowUp
	var watchUntil time.Time
	var saturatedSince time.Time // when claims started coming back short for saturation alone
	var saturated []string
	var skip claim.Skip
	var probes []string // the breakers whose probes hold endpoints (recheckProbes)
	// Where a busy claim may start (see claim.Cursor): after the last row of the previous
	// full batch, while the last claim from the head is recent and no endpoint that was
	// skipped as saturated has room again (its rows may lie behind the cursor).
	var cursor claim.Cursor
	var headAt time.Time
	var skipped []string // the previous claim's skip lists, together
	var skipping []string
	var hold skipHoldback
	backoff := time.Duration(0)
	var lockedWait time.Duration // see minDueWait
	var ordering orderingState
	trickle := newTrickleRate(d.cfg.PacingRate)
	claimCtx, cancelClaims := withGrace(ctx, claimGrace) // see claimGrace
	defer cancelClaims()
	d.claiming.Store(true)
	defer d.claiming.Store(false) // a settle waiting to ride goes on its own (settleRiding)
	for ctx.Err() == nil {
		d.lastLoop.Store(time.Now().UnixNano())
		free := d.slots.Free()
		if free <= 0 { // below 0 while routed events' deliveries fill more than a batch's slots
			hold.unseen()              // saturations that begin while we wait are not watched
			done := d.waitForSettles() // a settle would wait for a claim that waits for its slots
			select {
			case <-d.slots.Freed():
			case <-ctx.Done():
			}
			done()
			continue
		}
		limit := min(free, d.cfg.BatchSize)
		saturated = d.sender.Saturated(saturated[:0])
		now := time.Now()
		if until, held := hold.hold(now, saturated); held {
			d.holdBack(ctx, until)
			continue
		}
		d.waker.Clear() // this claim answers every wake-up received so far
		probes = d.recheckProbes(ctx, now, probes)
		var gatedUntil time.Time
		skip, gatedUntil = d.gated.skip(now, saturated, skip)
		if !gatedUntil.IsZero() {
			d.waker.DueIn(gatedUntil.Sub(now)) // the skipped rows are due: claim when the gate opens
		}
		skipping = append(append(skipping[:0], skip.Endpoints...), skip.Retries...)
		after := cursor
		if now.Sub(headAt) >= claim.CursorMaxAge || !subset(skipped, skipping) || d.streamMoved.Swap(false) {
			// (An ordered stream that moved on has its next row behind the cursor too.)
			// Rows of an endpoint skipped before and not now may lie behind the cursor.
			after = claim.Cursor{}
		}
		if after.IsHead() {
			headAt = now
		}
		// The endpoints as the last claim saw them, before this claim is told what is ordered:
		// an idle instance, whose claims bring no rows to prepare, learns a change here too.
		d.refreshEndpoints(ctx)
		d.beforeClaim(&ordering)
		res, err := d.claim(claimCtx, limit, skip, arming, after)
		rows := res.Rows
		if err == nil {
			skipped = append(skipped[:0], skipping...)
			end := time.Now()
			hold.observe(end, saturated, len(rows), end.Sub(now))
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.stats.ClaimErrors.Add(1)
			d.metrics.claimErrors.Inc()
			armed, arming = false, false // unknown after a failure: re-arm from scratch
			cursor = claim.Cursor{}
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			d.log.Warn("claim failed", zap.Error(err), zap.Int64("retry_in_ms", backoff.Milliseconds()))
			d.sleep(ctx, backoff)
			continue
		}
		backoff = 0
		d.stats.Claims.Add(1)
		d.endpoints.version.Store(res.EndpointsVersion)
		d.endpoints.xmin.Store(res.Snapshot.Xmin())
		d.afterClaim(&ordering, res)
		d.metrics.claimRows.Observe(float64(len(rows)))
		full := len(rows) == limit
		cursor = claim.Cursor{}
		if full {
			cursor = res.Last // more rows probably follow it: start there next time
		}
		// Armed for producers means both: our flag is set and the NOTIFY switch we announced
		// has not lapsed (it may have while we were at capacity or busy sending).
		believedArmed := armed // before this claim, whether or not the switch had lapsed
		wasArmed := armed && time.Since(announced) < notifyTTL-notifyMargin
		armed = arming && !full
		if len(watch) > 0 { // empty through every busy spell: no method value per claim there
			watch = slices.DeleteFunc(watch, res.Snapshot.Sees) // those this claim saw commit are done
		}
		if len(rows) > 0 {
			d.stampSendBy(rows, now)
			d.slots.Take(len(rows))
			d.stats.Claimed.Add(int64(len(rows)))
			d.claimed <- rows
		}
		if full {
			// Busy: more rows are probably waiting. Claim again without arming; the switch
			// lapses by itself and producers stop notifying.
			arming, saturatedSince = false, time.Time{}
			trickle.reset()
			continue
		}
		// NOTIFYs that arrived during this claim from transactions it could already see
		// brought nothing new: it took every row it could (it was short). A short claim from
		// a cursor did not look behind it; it never arms (a cursor follows a full claim,
		// which clears arming), so the claim after it, from the head, comes after at most
		// armHoldoff.
		d.waker.DropSeen(res.Snapshot.Sees)
		// Counted before the saturated path, whose claims are traffic too: a saturation
		// while pacing must not read as the traffic stopping.
		paced := trickle.observe(now, len(rows), d.cfg.BatchSize)
		if len(saturated) > 0 && !wasArmed {
			// Short only because saturated endpoints were skipped: busy, not idle. Arming now
			// would make producers NOTIFY through every busy spell. Claim again when a request
			// finishes; arm only if the saturation outlasts armAfterSaturated (an endpoint
			// that hangs), so that new rows for other endpoints still wake us.
			if saturatedSince.IsZero() {
				saturatedSince = time.Now()
			}
			if wait := armAfterSaturated - time.Since(saturatedSince); wait > 0 {
				armed, arming = false, false
				d.waitFreed(ctx, wait)
				continue
			}
		} else {
			saturatedSince = time.Time{}
		}
		if paced {
			// Events come at the pacing rate: claim every trickleEvery, unarmed, so that
			// producers stop notifying (see trickleRate). The
			// looks after arming are moot: every paced claim sees what they would.
			armed, arming, followUp = false, false, false
			d.pace(ctx, now.Add(trickleEvery))
			d.metrics.paced.Inc()
			continue
		}
		if !arming {
			// A busy spell just ended. Give producers armHoldoff to show up before arming,
			// so that under steady traffic they are not made to NOTIFY on every commit; a
			// wake-up ends the wait early.
			d.holdoff(ctx)
			arming = true
			continue
		}
		if !wasArmed {
			// This claim armed us: tell producers to NOTIFY, then claim once more: an insert
			// that committed after this claim's snapshot but read the switch before we set
			// it sent no NOTIFY.
			var lapsed bool
			if announced, lapsed = d.announce(ctx); announced.IsZero() {
				armed = false
				d.sleep(ctx, 100*time.Millisecond)
			} else if lapsed && believedArmed {
				// Armed, but our renewal came too late (a loaded machine): the switch had
				// run out. The claim just made and the one that follows confirm it.
				d.metrics.wakeups.WithLabelValues("lapse").Inc()
			}
			followUp = true
			continue
		}
		// Armed before and after this claim: every due row it could take is taken, and new
		// ones will NOTIFY us. Rows that come due later (a producer's delayed event, a lease
		// expiring after a failed settle or a crashed peer) send no NOTIFY when they do: set
		// the timer for the earliest, which the claim reported.
		if res.HasNext {
			// A row that is claimable yet was not claimed (Next 0) is locked by another
			// session (an operator's transaction, a peer's claim in progress): look again
			// after minDueWait, doubling while it stays locked, up to maxLockedWait, instead
			// of re-claiming every minDueWait for as long as the lock is held.
			wait := res.Next
			if wait <= 0 {
				lockedWait = min(max(2*lockedWait, minDueWait), maxLockedWait)
				wait = lockedWait
			} else {
				lockedWait = 0
				wait = max(wait, minDueWait)
			}
			d.waker.DueIn(wait)
		}
		if followUp {
			// The confirming claim cannot see a producer transaction that read the switch
			// before we set it and commits only after that claim's snapshot (its insert sent
			// no NOTIFY). Such a producer already had a transaction id (it had inserted) and
			// had not committed: it is in this claim's snapshot as in progress. Look again
			// shortly, and then at doubling intervals (at most maxWatchDelay) for as long as
			// a transaction in progress then is still in progress: a producer slowed down
			// for seconds is caught within a second of its commit instead of at the backstop
			// poll. Snapshots list every database's transactions: an unrelated long one
			// costs a claim per maxWatchDelay, for at most maxWatch, after which the
			// backstop poll is left to cover it.
			//
			// Not covered: a producer that got its transaction id after the announcing
			// transaction got its own and read the switch in the microseconds before
			// setval wrote it, when no later transaction has finished by this claim: its id
			// is then at or above the snapshot's xmax, not in its list. Such a producer is
			// caught only if it commits within the first look, else by the poll.
			followUp = false
			watch = append(watch[:0], res.Snapshot.InProgress()...)
			watchDelay, watchUntil = idleFollowUp, time.Now().Add(maxWatch)
			d.waker.WatchIn(watchDelay)
		} else if len(watch) > 0 && time.Now().Before(watchUntil) {
			watchDelay = min(2*watchDelay, maxWatchDelay)
			d.waker.WatchIn(watchDelay)
		}
		if !d.waitArmed(ctx, &announced, len(saturated) > 0) {
			armed = false // the switch could not be kept up: re-arm with a confirming claim
		}
	}
}

// claimGrace is how long a claim statement already sent may run on once Stop begins. It is
// not cancelled at once because its UPDATE commits on the server whether or not the client
// still reads the answer: a claim cancelled in flight leaves its rows leased to an instance
// that is gone, undelivered until the lease ends (2×timeout + 30 s by default; CI saw it).
// Rows a finished claim returns are handed on and drained like any other. The bound only
// matters when the database does not answer at all.
const claimGrace = 5 * time.Second

// withGrace returns a context that ends grace after ctx does (or when the returned cancel is
// called), for statements that must not be cut off the moment a stop begins.
func withGrace(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return c, func() { stop(); cancel() }
}

// maxWatchDelay bounds the interval of the looks for producers that may commit without a
// NOTIFY after the dispatcher armed, and maxWatch how long after arming they go on (see
// claimLoop).
const (
	maxWatchDelay = time.Second
	maxWatch      = time.Minute
)

// notifyTTL is how far ahead an idle dispatcher sets the producers' NOTIFY switch; it renews
// it every notifyTTL/2 while it waits. After it turns busy producers keep notifying for at
// most this long. notifyMargin is the part of it the dispatcher does not rely on (its clock
// and the database's, a renewal delayed by a loaded machine).
const (
	notifyTTL    = 3 * time.Second
	notifyMargin = time.Second
)

// minDueWait is the shortest due timer the claiming loop sets from a claim's Next, and
// maxLockedWait the longest while a due row stays locked by another session (see there).
const (
	minDueWait    = 20 * time.Millisecond
	maxLockedWait = time.Second
)

// armAfterSaturated is how long claims may come back short only because every endpoint with
// due rows is saturated before the dispatcher arms anyway (see claimLoop). Such claims start
// only once the endpoints have been saturated for skipAfter, so an idle dispatcher behind an
// endpoint that hangs arms about skipAfter + armAfterSaturated after the hang began.
const armAfterSaturated = 50 * time.Millisecond

// skipAfter is how long an endpoint must stay saturated before claims skip it. A fast
// consumer that stalls for a moment (a pause of its own, the machine busy) reads as
// saturated for a few milliseconds; a claim that skips it then finds nothing while one
// endpoint's backlog drains (measured: 10–13 empty claims per 20,000-event drain, 1.05–1.06
// claim statements per claimed batch) and holds back after it. Until the saturation has
// lasted skipAfter, the claiming loop waits instead (until then, or until a request finishes):
// new rows for the saturated endpoint would only queue for it, and rows for other endpoints
// wait at most skipAfter once per saturation spell. An endpoint that hangs stays saturated
// and is skipped from then on; each endpoint's spell is timed on its own.
const skipAfter = 25 * time.Millisecond

// fruitlessHoldback and maxHoldback bound what claims that skip saturated endpoints cost. The
// skip is a filter, not an index condition: a claim that finds nothing outside the skipped
// endpoints has read every due row, which while one endpoint's backlog of a million rows
// drains takes a quarter of a second (74 ms at 300,000 rows). After such a claim, the next
// that would skip waits fruitlessHoldback times as long as it took (at most maxHoldback), so
// that these scans use at most a tenth of the time; a claim that skips nothing (the endpoint
// has room again) is not held back. Rows for other endpoints that arrive meanwhile wait that
// long at most.
const (
	fruitlessHoldback = 10
	maxHoldback       = 2 * time.Second
)

// skipHoldback is when claims that skip saturated endpoints are held back. A claim that
// skipped a set of endpoints and found nothing showed that every due row belonged to them; a
// claim skipping those endpoints again (and maybe more) would read the whole backlog to find
// only rows that arrived since. It is held back for fruitlessHoldback times as long as the
// fruitless claim took (at most maxHoldback), unless one of those endpoints has room again
// (claims in order then take its rows and the others') or a claim that skipped finds rows.
// Before that, claims skip an endpoint only once it has stayed saturated for skipAfter.
// Claims that skip nothing are never held back.
type skipHoldback struct {
	until   time.Time
	skipped []string             // what the fruitless claim skipped
	since   map[string]time.Time // when each endpoint saturated now was first seen so
}

// hold notes when each endpoint in saturated was first seen saturated and reports whether a
// claim skipping them must wait, and until when: while any has been saturated for less than
// skipAfter, or after a claim that skipped and found nothing (see observe) while everything
// it skipped is still saturated. Called before every claim.
func (h *skipHoldback) hold(now time.Time, saturated []string) (until time.Time, held bool) {
	for key := range h.since {
		if !slices.Contains(saturated, key) {
			delete(h.since, key) // its saturation ended: a new one is waited out afresh
		}
	}
	for _, key := range saturated {
		from, ok := h.since[key]
		if !ok {
			if h.since == nil {
				h.since = make(map[string]time.Time)
			}
			from = now
			h.since[key] = now
		}
		if at := from.Add(skipAfter); now.Before(at) && (!held || at.Before(until)) {
			until, held = at, true
		}
	}
	if held {
		return until, true
	}
	if len(saturated) > 0 && now.Before(h.until) && subset(h.skipped, saturated) {
		return h.until, true
	}
	return time.Time{}, false
}

// unseen forgets every saturation: the claiming loop stopped looking (no free capacity), so
// it cannot tell whether one it saw before is the same spell.
func (h *skipHoldback) unseen() { clear(h.since) }

// subset reports whether every key in a is also in b: whether every endpoint skipped then is
// still skipped now (skip lists hold the few saturated endpoints, so a scan is cheap).
func subset(a, b []string) bool {
	return !slices.ContainsFunc(a, func(k string) bool { return !slices.Contains(b, k) })
}

// observe records a claim that ended at now after took, skipping skip and finding rows rows.
func (h *skipHoldback) observe(now time.Time, skip []string, rows int, took time.Duration) {
	switch {
	case len(skip) == 0:
		// Says nothing about rows outside saturated endpoints.
	case rows > 0:
		h.until = time.Time{}
	default:
		h.until = now.Add(min(fruitlessHoldback*took, maxHoldback))
		h.skipped = append(h.skipped[:0], skip...)
	}
}

// holdBack waits until until, or until a request finishes (the endpoints skipped may have
// room again); wake-ups stay pending for the claim that follows.
func (d *Dispatcher) holdBack(ctx context.Context, until time.Time) {
	defer d.waitForSettles()()
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	select {
	case <-t.C:
	case <-d.slots.Freed():
	case <-ctx.Done():
	}
}

// waitFreed waits up to wait for a request to finish (freed capacity) or a wake-up.
func (d *Dispatcher) waitFreed(ctx context.Context, wait time.Duration) {
	defer d.waitForSettles()()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-d.slots.Freed():
	case <-d.waker.C():
	case <-ctx.Done():
	}
}

// announce sets the producers' NOTIFY switch and returns when it was sent (zero on failure),
// and whether the switch had lapsed before (see claim.Claimer.Announce).
func (d *Dispatcher) announce(ctx context.Context) (time.Time, bool) {
	at := time.Now()
	lapsed, err := d.claimer.Announce(ctx, notifyTTL)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("announce failed", zap.Error(err))
		}
		return time.Time{}, false
	}
	return at, lapsed
}

// waitArmed sleeps until a wake-up (NOTIFY, due timer, poll) or, when an endpoint was skipped
// as saturated, freed capacity; meanwhile it renews the NOTIFY switch. It reports false if a
// renewal failed.
func (d *Dispatcher) waitArmed(ctx context.Context, announced *time.Time, skipped bool) bool {
	if skipped {
		defer d.waitForSettles()() // freed capacity may end the wait: a settle frees it
	}
	renew := time.NewTimer(time.Until(announced.Add(notifyTTL / 2)))
	defer renew.Stop()
	for {
		select {
		case <-renew.C:
			var lapsed bool
			if *announced, lapsed = d.announce(ctx); announced.IsZero() {
				return false
			}
			if lapsed {
				// The renewal came after the switch ran out (the machine or the database
				// stalled): producers that committed meanwhile sent no NOTIFY. Claim now to
				// find their rows instead of leaving them to the backstop poll.
				d.metrics.wakeups.WithLabelValues("lapse").Inc()
				return true
			}
			renew.Reset(notifyTTL / 2)
		case <-d.waker.C():
			return true
		case <-d.slots.Freed():
			// Capacity or a saturated endpoint freed up: rows skipped earlier may be
			// claimable. Nothing skipped: keep waiting for a real wake-up.
			if skipped {
				return true
			}
		case <-ctx.Done():
			return true
		}
	}
}

// armHoldoff is how long the claiming loop waits, after a claim that found work was followed
// by an empty one, before arming. Producers then NOTIFY only once the dispatcher has been
// quiet this long: with steady traffic it keeps claiming instead, and NOTIFY's commit-time
// lock stays off the producers. Rows inserted meanwhile wait at most this long.
const armHoldoff = time.Millisecond

// pace waits until the next paced claim is due. NOTIFYs do not end the wait: while pacing
// they are only those producers send until the switch lapses, and the paced claim finds their
// rows. Any other wake-up does: an ordered stream that moved (its next row may go now, and a
// hot stream would otherwise lose up to trickleEvery per event), a row coming due, the poll.
func (d *Dispatcher) pace(ctx context.Context, at time.Time) {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return
		case <-d.waker.C():
			if !d.waker.NotifiesOnly() {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

func (d *Dispatcher) holdoff(ctx context.Context) {
	t := time.NewTimer(armHoldoff)
	defer t.Stop()
	select {
	case <-t.C:
	case <-d.waker.C():
	case <-ctx.Done():
	}
}

func (d *Dispatcher) sleep(ctx context.Context, wait time.Duration) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-d.waker.C():
	case <-ctx.Done():
	}
}

// maintain keeps this instance registered, clears crashed peers' rows, and runs the janitor:
// the delivery log's partitions (old ones dropped, the next ones created) and the rows settled
// in place before schema 7, deleted in small batches.
func (d *Dispatcher) maintain(ctx context.Context) {
	interval := min(d.cfg.PollInterval, 30*time.Second)
	stale := max(5*time.Minute, 5*interval)
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastPrune time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := d.claimer.Heartbeat(ctx, stale); err != nil && ctx.Err() == nil {
				d.log.Warn("heartbeat failed", zap.Error(err))
			}
			d.disableStale(ctx)
			if d.orders() {
				d.park(ctx)
			}
			if time.Since(lastPrune) >= time.Minute {
				lastPrune = time.Now()
				d.maintainLog(ctx)
				if d.orders() {
					if err := d.checkOrderingIDs(ctx); err != nil && ctx.Err() == nil {
						d.log.Error("ordered delivery cannot hold its promise", zap.Error(err))
					}
				}
				n, err := d.claimer.Prune(ctx, d.cfg.Retention, 1000)
				if err != nil && ctx.Err() == nil {
					d.log.Warn("janitor failed", zap.Error(err))
				} else if n > 0 {
					d.log.Info("janitor deleted rows settled before schema 7", zap.Int64("rows", n))
				}
			}
		}
	}
}

// parkLimit is how many rows one park pass looks at, of the oldest due and of the soonest
// future ones, each maintenance tick.
const parkLimit = 10000

// park takes the ordered rows that wait, due, behind a head that is not (see
// claim.Claimer.Park) out of the claims' way, and releases those a race left parked behind a
// head that is gone. A failure costs only the claims' time, and the next tick tries again.
func (d *Dispatcher) park(ctx context.Context) {
	parked, released, err := d.claimer.Park(ctx, d.cfg.Ordering, parkLimit)
	switch {
	case err != nil && ctx.Err() == nil:
		d.log.Warn("parking ordered rows behind their stream's head failed", zap.Error(err))
	case parked > 0 || released > 0:
		d.log.Debug("parked ordered rows behind their stream's head", zap.Int64("rows", parked), zap.Int64("released", released))
	}
	if released > 0 {
		d.waker.Wake(wake.Timer)
	}
}

// warmSettle runs the statements of the first settle, with nothing to settle, before the
// first claim (see settle.Settler.Warm). Cold, on a machine busy with the first batch's
// requests, the first settle of the fan-out bench took 111-142 ms, every slot of the pipeline
// waiting for it; warmed, 16-90 ms, for 13-19 ms more before the first claim (`fluxhook bench
// --workload fanout`, timed in the process, two and three runs). End to end, over the first
// 2,000 deliveries (`--fanout-events 200`, six runs each, interleaved), the difference was
// within that machine's noise. A failure changes nothing but that, and is logged: the
// settles report their own errors.
func (d *Dispatcher) warmSettle(ctx context.Context) {
	start := time.Now()
	routes := d.endpoints.any()
	anchored := routes && d.inMemory.Load()
	err := d.settler.Warm(ctx, anchored)
	if routes {
		rows, qErr := d.pool.Query(ctx, endpointOutcomesSQL, []string{}, []int16{}, []string{}, []*string{})
		if qErr == nil {
			rows.Close()
			qErr = rows.Err()
		}
		err = errors.Join(err, qErr)
	}
	if err != nil {
		d.log.Warn("warming up the settle statements failed", zap.Error(err))
		return
	}
	d.log.Debug("settle statements warmed up", zap.Bool("anchored", anchored), zap.Bool("endpoint_outcomes", routes),
		zap.Int64("duration_ms", time.Since(start).Milliseconds()))
}

// maintainLog runs the delivery log's partition maintenance and logs what it did. A failure
// loses nothing (settles land in the default partition, which the next run empties into the
// partitions it creates) and is retried on the janitor's next run. A partition that could not
// be created for another reason than a busy lock ("creation of ... failed: ...") is a warning:
// it fails again on every run until someone removes its cause.
func (d *Dispatcher) maintainLog(ctx context.Context) {
	done, err := d.claimer.MaintainLog(ctx, d.cfg.Retention)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("delivery log maintenance failed", zap.Error(err))
		}
		return
	}
	for _, line := range done {
		if strings.Contains(line, " failed: ") {
			d.log.Warn("delivery log partition", zap.String("change", line))
			continue
		}
		d.log.Info("delivery log partition", zap.String("change", line))
	}
}

// prepare validates, gates and signs one claimed batch. Rows that are decided here (invalid,
// held back by the gate) go straight to settle without an HTTP request.
func (d *Dispatcher) prepare(ctx context.Context, batch []*delivery.Delivery) {
	d.refreshEndpoints(ctx)
	if d.routes(ctx) {
		batch = d.route(ctx, batch)
	}
	// Even with no endpoint in the cache: one loaded while the first was being created is
	// empty, and a row addressed to that endpoint must not be dead-lettered as removed.
	d.freshen(ctx, batch)
	check := batch[:0:0]
	for _, del := range batch {
		d.markOrdered(del)
		if reason, detail := d.validate(del); reason != "" {
			del.Outcome = refusal(reason)
			del.Outcome.Detail = detail
			d.toSettle <- del
			continue
		}
		check = append(check, del)
	}
	if len(check) == 0 {
		return
	}
	d.cfg.Gate.Check(ctx, check)
	now := time.Now()
	for _, del := range check {
		if del.Outcome.Kind != delivery.Undecided {
			d.toSettle <- del
			continue
		}
		if del.EndpointID == "" {
			if d.signer == nil {
				del.Outcome = delivery.Outcome{Kind: delivery.Permanent, Reason: "invalid row: an endpoint_url row is signed with WEBHOOK_SECRET, which is not set"}
				d.toSettle <- del
				continue
			}
			d.signer.Sign(del, now)
		} else if reason := d.signManaged(del, now); reason != "" {
			// Changed between validation and signing: never send it unsigned, nor by another
			// version of the endpoint than the one it was checked against.
			del.Outcome = refusal(reason)
			d.toSettle <- del
			continue
		}
		d.toSend <- del
	}
}

// MaxEventTypeBytes is the longest event_type fluxhook sends. The event type travels in a
// request header (x-fluxora-event), and consumers' servers commonly refuse long header lines;
// the longest names in use are a few dozen bytes.
const MaxEventTypeBytes = 256

// validate returns why a row can never be delivered, or "". Such a row is dead-lettered before
// any request and never reaches the gate: it says nothing about its endpoint, so it must not
// count against the endpoint's breaker or rate (five rows with a newline in event_type used
// to open the breaker of a healthy endpoint). detail is what only the log gets (see
// delivery.Outcome.Detail).
func (d *Dispatcher) validate(del *delivery.Delivery) (reason, detail string) {
	if del.Invalid != "" {
		return del.Invalid, ""
	}
	if strings.TrimSpace(del.EventType) == "" {
		return "invalid row: event_type is empty or only whitespace", ""
	}
	if len(del.EventType) > MaxEventTypeBytes {
		return fmt.Sprintf("invalid row: event_type is %d bytes, over the limit of %d", len(del.EventType), MaxEventTypeBytes), ""
	}
	if i := invalidHeaderByte(del.EventType); i >= 0 {
		return fmt.Sprintf("invalid row: event_type has a control character (byte 0x%02x at offset %d), which an HTTP header cannot carry", del.EventType[i], i), ""
	}
	// The claim and routing measured the payload (claim.Claimer.LimitPayload), without
	// reading a body far over the limit; the length check keeps the rule for any other way a
	// payload comes in.
	if del.Oversize != "" {
		return del.Oversize, ""
	}
	if len(del.Payload) > d.cfg.MaxPayloadBytes {
		return claim.PayloadTooLarge(len(del.Payload), d.cfg.MaxPayloadBytes), ""
	}
	if del.EndpointID != "" {
		return d.resolveManaged(del), ""
	}
	ep, err := d.sender.Endpoint(del.EndpointURL)
	if err != nil {
		if public, whole, ok := send.PublicRefusal(err); ok {
			return "invalid endpoint_url: " + public, whole
		}
		return "invalid endpoint_url: " + err.Error(), ""
	}
	del.Endpoint = ep
	return "", ""
}

// invalidHeaderByte returns the offset of the first byte an HTTP header value may not hold
// (a control character other than tab: RFC 9110's field-value, the rule net/http enforces
// before sending), or -1.
func invalidHeaderByte(v string) int {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return i
		}
	}
	return -1
}

// settled reports one settled batch: rows are what the settle statement wrote (res, err),
// done what settleAnchored already settled; it tells the gate, logs, and frees the batch's
// slots.
func (d *Dispatcher) settled(ctx context.Context, batch, rows, done []*delivery.Delivery, res settle.Result, err error) {
	d.stats.Settles.Add(1)
	if err != nil {
		d.stats.SettleErrors.Add(1)
		d.metrics.settleErrors.Inc()
		d.log.Error("settle failed; rows will be delivered again after their lease", zap.Error(err),
			zap.Int("rows", len(rows)-res.Fallback))
	}
	if res.Fallback > 0 {
		d.log.Warn("settle batch rejected; settled rows one by one", zap.Int("rows", res.Fallback))
	}
	// What was settled, all of the rows or (after an error in the one-by-one fallback) their
	// first res.Fallback, is reported, with the deliveries settleAnchored wrote or found
	// stale; the rest is left to its lease.
	if err != nil {
		rows = rows[:min(res.Fallback, len(rows))]
	}
	settled := rows
	if len(done) > 0 {
		settled = append(done, rows...)
	}
	// Rows this instance re-enqueued or released come due again after their delay; set the
	// due timer now instead of waiting for the next empty claim or the poll to notice them.
	var soonest time.Duration = -1
	for _, del := range settled {
		if del.Outcome.Unsettled || del.Outcome.Stale {
			continue // not re-enqueued: its lease brings it back, or its holder settles it
		}
		switch del.Outcome.Kind {
		case delivery.Retry, delivery.Defer, delivery.Release:
			if soonest < 0 || del.Outcome.Delay < soonest {
				soonest = del.Outcome.Delay
			}
		}
	}
	if streamMoved(settled) {
		// The next event of an ordered stream may go now, if the last claim saw one waiting
		// (afterClaim: a claim that ran meanwhile sees streamMoved instead).
		d.streamMoved.Store(true)
		if d.orderedWaiting.Load() {
			soonest = 0
		}
	}
	if res.Unparked > 0 {
		// A row parked behind a head this batch let go is due now; a claim that saw no
		// ordered row waiting (parked rows are not due) would not look for it.
		d.streamMoved.Store(true)
		soonest = 0
	}
	if soonest >= 0 {
		d.waker.DueIn(soonest)
	}
	now := time.Now()
	for _, del := range settled {
		if del.Outcome.Stale {
			d.stale(del)
		}
	}
	d.gated.note(now, settled)
	if len(settled) > 0 {
		d.cfg.Gate.Record(ctx, settled)
		d.resumeAfterProbe(ctx, settled)
		d.noteEndpointOutcomes(ctx, settled)
		d.metrics.settleRows.Observe(float64(len(settled)))
		for _, del := range settled {
			d.metrics.observe(del, now)
			d.logOutcome(del)
		}
	}
	d.slots.Release(len(batch))
}

// recheckProbes reads, before a claim, the breakers behind whose half-open probes the claims
// hold endpoints, when the gate can be read (gate.Inspector), and lifts or re-times the holds
// of those whose probe ended (gatedEndpoints.learn); it returns hashes for reuse. The probe may
// be another instance's, whose end this one is not told of: without the read, the claims
// skipped an endpoint whose circuit had closed elsewhere until the probe's expiry (the
// request timeout and 5 s, 35 s by default), or the reset (RecheckIn) when shorter, 5 minutes
// by default. With it, the first claim after the circuit closes takes the endpoint's rows.
//
// It costs one store round trip per claim, and only while an endpoint is held behind a probe
// (a probe lasts the request timeout at most); none per event, none otherwise: 74 µs a read
// on loopback Redis (BenchmarkInspect, two cores shared with other work). Redis pub/sub (the closing instance
// publishes, every other subscribes) would cost nothing per claim, but needs a subscriber
// connection with its own lifecycle and reconnects on every instance, and loses what is
// published while a subscription is down, so that a read like this one, or the probe's expiry,
// would still be needed behind it. A read that fails keeps the holds (they end at the probe's
// expiry, or the reset, as before): the gate fails open meanwhile, and the store is not asked
// again before its StoreRetry.
func (d *Dispatcher) recheckProbes(ctx context.Context, now time.Time, hashes []string) []string {
	ins, ok := d.cfg.Gate.(gate.Inspector)
	if !ok {
		return hashes
	}
	hashes, seq := d.gated.behindProbe(now, hashes)
	if len(hashes) == 0 {
		return hashes
	}
	snaps, err := ins.Inspect(ctx, hashes)
	if err != nil {
		// The store cannot say (it is down, or the gate fails open): the holds end, and the
		// gate decides on the rows. Failing open, it sends them; else it defers them behind
		// the probe again. Kept, they would wait out the probe's expiry while the gate lets
		// everything else through.
		snaps = make([]gate.Snapshot, len(hashes))
		for i, h := range hashes {
			snaps[i] = gate.Snapshot{Hash: h, State: gate.Closed, At: now}
		}
	}
	d.gated.learn(time.Now(), seq, snaps)
	return hashes
}

// breakerDeferrals are the deferral reasons that a successful probe makes obsolete.
var breakerDeferrals = []string{gate.DeferOpen.String(), gate.DeferProbe.String()}

// probeDeferrals are the rows a probe that ended without closing the circuit leaves waiting
// for its expiry.
var probeDeferrals = []string{gate.DeferProbe.String()}

// resumeAfterProbe tells the claims and the deferred rows how each half-open probe in settled
// (a row holding a GateToken) ended, for every key that shares the probe's breaker
// (breakerKeys). A success closed the circuit: the rows deferred to the reset time or to the
// probe's expiry come due now, and the claims take the endpoint again. A probe that ended
// otherwise (the gate's Record set ProbeEnded: a failure re-opened the circuit for a reset, a
// permanent answer or a release gave the probe back) leaves the rows behind it waiting for its
// expiry: the claims take the endpoint again when the next probe may go, and the soonest of
// those rows comes due then to probe, one row per probe however many wait (they follow when a
// probe closes the circuit). Any instance's deferred rows move, since they are rows in the
// table.
func (d *Dispatcher) resumeAfterProbe(ctx context.Context, settled []*delivery.Delivery) {
	now := time.Now()
	for _, del := range settled {
		o := del.Outcome
		if del.GateToken == "" || del.Endpoint == nil {
			continue
		}
		keys := d.breakerKeys(del.Endpoint)
		r := settle.Resumption{Keys: keys}
		switch {
		case o.Kind == delivery.Delivered && !o.Stale && !o.Unsettled:
			d.gated.forget(keys)
			r.Reasons = breakerDeferrals
		case del.ProbeEnded:
			d.gated.retime(now, now.Add(del.NextProbe), keys)
			r.Reasons, r.In, r.Limit = probeDeferrals, del.NextProbe, 1
			if r.In > 0 {
				r.Reason = gate.DeferOpen.String()
			}
		default:
			continue
		}
		n, err := d.settler.Resume(ctx, r)
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("resuming rows deferred behind the breaker failed; they come due at their deferral time",
					append(d.endpointFields(del), zap.Error(err))...)
			}
			continue
		}
		switch {
		case r.Limit == 0 && n > 0:
			d.log.Info("probe succeeded: resumed rows deferred behind the breaker",
				append(d.endpointFields(del), zap.Int64("rows", n))...)
			d.waker.Wake(wake.Timer)
		case r.Limit > 0:
			d.log.Debug("probe ended without closing the circuit: the endpoint is claimed again when the next probe may go",
				append(d.endpointFields(del), zap.Int64("next_probe_ms", r.In.Milliseconds()), zap.Int64("rows", n))...)
			if n > 0 {
				d.waker.DueIn(r.In)
			}
		}
	}
}

// breakerKeys returns the claim keys of every row that shares ep's breaker, for the claims
// and the deferred rows to learn a probe's end together: the breaker is named by the URL's
// hash (a managed endpoint's by its own key), the claims by delivery.Endpoint.Key, so rows
// without an endpoint_url (key "") and rows naming the configured WEBHOOK_URL (key: that
// URL) share a breaker under two keys. Every instance configured alike finds the same keys,
// whichever deferred the rows.
func (d *Dispatcher) breakerKeys(ep *delivery.Endpoint) []string {
	if d.cfg.DefaultURL == "" || ep.Key != "" && ep.Key != d.cfg.DefaultURL {
		return []string{ep.Key}
	}
	return []string{"", d.cfg.DefaultURL}
}

// stale reports an outcome settle refused because the row's lease was no longer this
// attempt's (see settle.sql's fence), and turns it into "not attempted" for what follows: the
// current holder's outcome is the one written, so this one must not move the breaker or the
// delivery counters as if it had been. A probe this attempt held is still given back.
func (d *Dispatcher) stale(del *delivery.Delivery) {
	d.stats.Stale.Add(1)
	d.metrics.staleSettles.Inc()
	d.log.Warn("stale settle refused: the lease ran out and another claim holds the row",
		append(d.deliveryFields(del), zap.String("outcome", del.Outcome.Kind.String()), zap.Int64("row_id", del.ID))...)
	del.Outcome = delivery.Outcome{Kind: delivery.Release, Stale: true}
}

// deliveryFields are the fields every line about one delivery carries, for log shipping: the
// consumer by its URL's origin (scheme, host and port: never the path, query or credentials,
// where tokens live), a managed endpoint also by its id, which is what an operator types into
// fluxhook endpoints. The URL's hash (the breaker's key in Redis) is a key for a machine, not a
// name for a person: it is added only at debug, for matching a line to a Redis key.
func (d *Dispatcher) deliveryFields(del *delivery.Delivery) []zap.Field {
	o := del.Outcome
	f := []zap.Field{
		zap.String("delivery_id", del.DeliveryID),
		zap.String("event_type", del.EventType),
		zap.Int("attempt", del.Attempt),
		zap.Int("status", o.Status),
		zap.Int64("duration_ms", o.Duration.Milliseconds()),
	}
	return append(f, d.endpointFields(del)...)
}

// endpointFields name the consumer of del (see deliveryFields): endpoint_id for a managed
// endpoint, origin whenever the URL has one, endpoint_hash at debug.
func (d *Dispatcher) endpointFields(del *delivery.Delivery) []zap.Field {
	hash, origin := "", ""
	switch {
	case del.Endpoint != nil:
		hash, origin = del.Endpoint.Hash, del.Endpoint.Origin()
	case del.EndpointURL != "":
		// A row dead-lettered for its endpoint_url before it had an endpoint: never named
		// by the URL, which may carry a token.
		sum := sha256.Sum256([]byte(del.EndpointURL))
		hash, origin = hex.EncodeToString(sum[:]), delivery.URLOrigin(del.EndpointURL)
	}
	var f []zap.Field
	if del.EndpointID != "" {
		f = append(f, zap.String("endpoint_id", del.EndpointID))
	}
	if origin != "" { // none before an endpoint was resolved, or for a URL without a host
		f = append(f, zap.String("origin", origin))
	}
	if hash != "" && d.log.Core().Enabled(zap.DebugLevel) {
		f = append(f, zap.String("endpoint_hash", hash))
	}
	return f
}

func (d *Dispatcher) logOutcome(del *delivery.Delivery) {
	o := del.Outcome
	fields := func() []zap.Field { return d.deliveryFields(del) }
	if o.Stale {
		return // reported by stale
	}
	if o.Unsettled {
		// Settle could neither settle nor dead-letter the row (see settle.Result.Unsettled):
		// it will be sent again after its lease, until the database accepts an update of it.
		d.stats.SettleErrors.Add(1)
		d.metrics.settleErrors.Inc()
		d.log.Error("delivery could not be settled; it will be delivered again after its lease",
			append(fields(), zap.Int64("row_id", del.ID), zap.String("outcome", o.Kind.String()), zap.String("reason", o.Reason))...)
		return
	}
	switch o.Kind {
	case delivery.Delivered:
		d.stats.Delivered.Add(1)
		if o.AlreadyDelivered {
			// At info, unlike a 2xx: a consumer that answers 409 for something else (see
			// WEBHOOK_409_DELIVERED) would otherwise have its events settled delivered
			// without a trace at the default level.
			d.stats.AlreadyDelivered.Add(1)
			d.log.Info("delivered: the consumer already had it (409)", append(fields(), zap.Bool("already_delivered", true))...)
			break
		}
		if ce := d.log.Check(zap.DebugLevel, "delivered"); ce != nil {
			ce.Write(fields()...)
		}
	case delivery.Retry:
		d.stats.Retried.Add(1)
		d.log.Warn("delivery attempt failed", withDetail(append(fields(), zap.String("error", o.Error),
			zap.Int64("retry_in_ms", o.Delay.Milliseconds())), o)...)
	case delivery.Permanent:
		d.stats.DeadLettered.Add(1)
		f := append(fields(), zap.String("reason", o.Reason))
		if o.Error != "" { // none for a row refused before any attempt (the reason says why)
			f = append(f, zap.String("error", o.Error))
		}
		d.log.Error("delivery dead-lettered", withDetail(f, o)...)
	case delivery.Defer:
		d.stats.Deferred.Add(1)
		if ce := d.log.Check(zap.DebugLevel, "delivery deferred"); ce != nil {
			ce.Write(append(fields(), zap.String("reason", o.Reason), zap.Int64("retry_in_ms", o.Delay.Milliseconds()))...)
		}
	case delivery.Release:
		d.stats.Released.Add(1)
	}
}

// withDetail adds o's Detail, what only the log says (see delivery.Outcome.Detail), to f.
func withDetail(f []zap.Field, o delivery.Outcome) []zap.Field {
	if o.Detail != "" {
		f = append(f, zap.String("detail", o.Detail))
	}
	return f
}

// sendByMargin is how long before its lease ends a row is no longer sent.
const sendByMargin = 500 * time.Millisecond

// sendBy is delivery.Delivery.SendBy for rows leased by a statement that started at start:
// the lease's end, less sendByMargin. Past it another instance may hold the row, so sending
// it would be a duplicate by design. It is not the lease's end less the request timeout:
// with the shortest lease serve accepts (timeout + 2 s), a backlog behind a slow gate store
// would then arrive late row after row, and releasing each one at once would deliver
// nothing; a row that starts in time but whose request outlives the lease is what the
// settle fence is for. The wall clock (Round(0) drops the monotonic reading), since the
// monotonic clock stands still while a virtual machine is suspended and the lease does not.
func (d *Dispatcher) sendBy(start time.Time) time.Time {
	return start.Add(d.cfg.Lease - sendByMargin).Round(0)
}

// stampSendBy sets the send-by time of rows leased by a statement that started at start (a
// claim, or the routing statement for the deliveries it inserted leased).
func (d *Dispatcher) stampSendBy(rows []*delivery.Delivery, start time.Time) {
	sendBy := d.sendBy(start)
	for _, del := range rows {
		del.SendBy = sendBy
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
