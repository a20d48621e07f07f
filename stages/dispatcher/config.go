package dispatcher

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/settle"
	"github.com/fluxora/fluxhook/stages/sign"
)

// Config is everything a Dispatcher needs. The zero value of each field means its default
// (see WithDefaults); Validate names the environment variable of a bad field, because that is
// how operators set them.
type Config struct {
	// DatabaseURL connects to the database holding webhook_outbox (DATABASE_URL).
	DatabaseURL string
	// ListenURL, when set, is the connection for the LISTEN session alone
	// (DATABASE_LISTEN_URL): LISTEN needs a session of its own for as long as the dispatcher
	// runs, which a pooler in transaction mode does not give, while the pool's statements can
	// go through one. It must reach the same database: the listener's liveness check (a NOTIFY
	// sent over the pool must arrive on it) fails otherwise.
	ListenURL string
	// DefaultURL is the consumer for rows without endpoint_url (WEBHOOK_URL).
	DefaultURL string
	// Ordering delivers the rows without a managed endpoint (WEBHOOK_URL's and endpoint_url's)
	// of each stream_id one at a time, in id order (WEBHOOK_ORDERING=stream; schema 6).
	// OrderingStop stops such a stream at a dead letter until it is replayed or purged,
	// instead of going on without it (WEBHOOK_ORDERING_FAILURE=stop).
	Ordering, OrderingStop bool
	// Secret signs requests (WEBHOOK_SECRET); PreviousSecret also signs during a rotation
	// with the Standard Webhooks scheme (WEBHOOK_SECRET_PREVIOUS).
	Secret, PreviousSecret string
	// Scheme is the signature scheme (WEBHOOK_SIGNATURE_SCHEME).
	Scheme sign.Scheme
	// PollInterval is the backstop poll (WEBHOOK_POLL_INTERVAL_MS, default 10 s).
	PollInterval time.Duration
	// BatchSize is the most rows one claim statement leases (WEBHOOK_BATCH_SIZE). The
	// original's default was 10; ours is 100, because a claim is one round trip whatever its
	// size and a batch of 10 caps a dispatcher at a few thousand events per second. Claims
	// are further limited by free capacity, so a large batch never means waiting.
	BatchSize int
	// MaxInFlight is the pipeline's capacity: rows claimed and not yet settled
	// (WEBHOOK_MAX_IN_FLIGHT, default 1,000). It is also the number of send workers. A
	// drain runs in cycles of about this many rows (claims fill it, a settle of up to 1,000
	// rows empties it), so the default is large: 1,024 drained 20,000 events at 1.87–1.93×
	// River tuned's rate against 1.57–1.74× with 256, at the same CPU per event (`fluxhook
	// bench --workload drain --baseline river`, 2 CPUs). Rows in flight hold their payloads:
	// lower it where payloads are large.
	MaxInFlight int
	// PacingRate is the rate of claimed events per second (one instance's) from which claims
	// are paced, every 2 ms, instead of following producers' NOTIFYs (see trickleRate):
	// default DefaultPacingRate; negative, never.
	PacingRate int
	// EndpointConcurrency caps concurrent requests to one endpoint
	// (WEBHOOK_ENDPOINT_CONCURRENCY, default 64), so one slow consumer cannot take every
	// worker: rows for a saturated endpoint are left in the table (claimed around) until it
	// has room.
	EndpointConcurrency int
	// Timeout bounds one HTTP attempt (WEBHOOK_TIMEOUT_MS, default 30 s).
	Timeout time.Duration
	// Lease is how long a claimed row is reserved (WEBHOOK_LEASE_MS, default 2×Timeout+30 s).
	// A crashed dispatcher's rows are delivered again after it; it must cover Timeout plus
	// LeaseAllowance (gate, slot wait, settle), or a slow attempt could be delivered twice
	// at once. Every settle is fenced by the lease either way: only its holder's outcome
	// is written.
	Lease time.Duration
	// RetrySchedule is the wait before each retry (WEBHOOK_RETRY_SCHEDULE); its length sets
	// the number of attempts. Nil means settle.DefaultSchedule.
	RetrySchedule []time.Duration
	// RetryJitter is the ± fraction applied to retry waits (0 = default 20%, <0 = none).
	RetryJitter float64
	// MaxPayloadBytes dead-letters rows whose payload is larger (WEBHOOK_MAX_PAYLOAD_BYTES,
	// default 1 MiB): consumers commonly refuse large bodies, and retrying them for two
	// days only to fail helps no one.
	MaxPayloadBytes int
	// Conflict409Delivered says whether a consumer's 409 Conflict means it already has the
	// event (WEBHOOK_409_DELIVERED): the row is then settled delivered with status 409
	// (Outcome.AlreadyDelivered) instead of dead-lettered. The original's receiver answers 409
	// to a delivery id it has already accepted, so a first attempt that timed out after the
	// consumer stored it comes back as 409 on the retry. Nil, the default, follows each
	// request's signature scheme: true for fluxora, false for standard (a managed endpoint's
	// own scheme included). Set it false for consumers that answer 409 for something else.
	Conflict409Delivered *bool
	// ResponseExcerptBytes is how much of each consumer answer is stored with its attempt in
	// the delivery log (response_excerpt) and on a dead letter (last_response_excerpt), so
	// that what the consumer said can be read back (WEBHOOK_RESPONSE_EXCERPT_BYTES). Nil means
	// send.DefaultResponseExcerptBytes (1024); 0 stores none (NULL).
	ResponseExcerptBytes *int
	// PermanentStatuses are the consumer answers dead-lettered at once besides 410 Gone
	// (WEBHOOK_PERMANENT_STATUSES); every other non-2xx answer is retried on the schedule
	// (send.Classify). Nil means send.DefaultPermanentStatuses (413); empty, none. A managed
	// endpoint with permanent_statuses of its own (schema 13) uses those instead.
	PermanentStatuses []int
	// AllowedNetworks are private networks the operator allows as endpoint destinations
	// (WEBHOOK_ALLOWED_NETWORKS); by default the send stage refuses private, link-local and
	// metadata addresses at dial time (SSRF guard).
	AllowedNetworks []netip.Prefix
	// RowURLNetworks are the networks, loopback included, a row's endpoint_url may reach
	// beyond public addresses (WEBHOOK_ROW_URL_NETWORKS; see send.Config.RowURLNetworks):
	// producers write those URLs, so the operator's own allowances do not apply to them, and
	// by default they reach public addresses only.
	RowURLNetworks []netip.Prefix
	// Retention is how long the delivery log (webhook_delivery_log) is kept before the janitor
	// drops its partitions (WEBHOOK_RETENTION, default 7 days). Dead letters are kept until
	// purged.
	Retention time.Duration
	// InstanceID names this dispatcher in leases and in webhook_dispatcher (default:
	// hostname-pid-random).
	InstanceID string
	// RedisURL holds the circuit breaker and rate limiter state shared by every instance
	// (REDIS_URL; see redisstore.NewClient for the accepted forms). Empty means in-process
	// state: the same semantics, for one instance.
	RedisURL string
	// BreakerThreshold is the number of consecutive retryable failures that opens an
	// endpoint's circuit (WEBHOOK_CIRCUIT_BREAKER_THRESHOLD); 0, the default, disables it.
	BreakerThreshold int
	// BreakerReset is how long a circuit stays open (WEBHOOK_CIRCUIT_BREAKER_RESET_MS,
	// default 5 minutes).
	BreakerReset time.Duration
	// RetryRPS is the most attempts per second per endpoint before retries are deferred
	// (WEBHOOK_RETRY_RPS, default 10). First attempts are counted but never held back.
	RetryRPS int
	// RetryShare is the share of RetryRPS kept for retries while first attempts fill the
	// window (WEBHOOK_RETRY_SHARE, default 0.5): retries make progress under sustained
	// first-attempt traffic.
	RetryShare float64
	// Gate decides which rows may be attempted now. Nil means the breaker and rate-limit gate
	// built from the fields above; tests set their own.
	Gate gate.Gate
	// MetricsEndpointLabel adds an endpoint label (the URL's SHA-256) to the deliveries
	// counter (METRICS_ENDPOINT_LABEL). Off by default: one series per endpoint can be too
	// many for Prometheus when every tenant has its own URL.
	MetricsEndpointLabel bool
	// EncryptionKey opens (and EncryptionKeyPrevious, during a key rotation, also opens) the
	// managed endpoints' secrets and header values sealed at rest (WEBHOOK_ENCRYPTION_KEY,
	// WEBHOOK_ENCRYPTION_KEY_PREVIOUS: base64 of 32 bytes). Empty: they are read in clear.
	EncryptionKey, EncryptionKeyPrevious string
	// EndpointDisableAfter disables a managed endpoint that has been failing without a
	// success for this long (WEBHOOK_ENDPOINT_DISABLE_AFTER, default 5 days, as the peers do).
	EndpointDisableAfter time.Duration
	// EndpointRecheck bounds how long a change to webhook_endpoints that bumped no version
	// (a restore with triggers disabled) stays unseen: the endpoints are read again this
	// often, and the cache replaced when they differ. Default DefaultEndpointRecheck; not an
	// environment variable (a shorter one only costs reads).
	EndpointRecheck time.Duration
	// Logger receives structured logs (nil = no logs).
	Logger *zap.Logger
	// AsyncCommit sets synchronous_commit=off on the dispatcher's own connections (default
	// on: a claim or settle lost in a database crash only causes a redelivery, and it saves
	// a WAL flush per batch). Set DurableCommit to turn it off.
	DurableCommit bool
}

// LeaseAllowance is what a lease must cover beyond the request timeout: the gate check of the
// row's batch and of up to two batches queued before it (each bounded by the gate's 500 ms
// store timeout), the wait for an endpoint slot (send.SaturatedWait), the settle linger and
// the settle statement. A lease shorter than that can run out while its holder is still
// working: another claim then takes the row and sends it a second time (the fence keeps the
// outcome right, but the consumer gets a duplicate).
const LeaseAllowance = 2 * time.Second

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.PacingRate == 0 {
		c.PacingRate = DefaultPacingRate
	}
	if c.Scheme == "" {
		c.Scheme = sign.Fluxora
	}
	if c.PollInterval == 0 {
		c.PollInterval = 10 * time.Second
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 1000
	}
	if c.EndpointConcurrency == 0 {
		c.EndpointConcurrency = 64
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	if c.Lease == 0 {
		c.Lease = 2*c.Timeout + 30*time.Second
	}
	if c.RetrySchedule == nil {
		c.RetrySchedule = settle.DefaultSchedule
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = 1 << 20
	}
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.InstanceID == "" {
		c.InstanceID = defaultInstanceID()
	}
	if c.BreakerReset == 0 {
		c.BreakerReset = 5 * time.Minute
	}
	if c.RetryRPS == 0 {
		c.RetryRPS = 10
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.EndpointDisableAfter == 0 {
		c.EndpointDisableAfter = 5 * 24 * time.Hour
	}
	if c.EndpointRecheck <= 0 {
		c.EndpointRecheck = DefaultEndpointRecheck
	}
	return c
}

// DefaultEndpointRecheck is Config.EndpointRecheck's default: every change made through SQL, the
// CLI or logical replication reaches the dispatchers at their next claim; this bounds the others.
const DefaultEndpointRecheck = 30 * time.Second

// Validate reports every invalid field, naming its environment variable and what is expected.
// The URL and secret are validated by the send and sign stages when the Dispatcher is built.
func (c Config) Validate() error {
	var errs []error
	bad := func(env, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", env, fmt.Sprintf(format, args...)))
	}
	if c.DatabaseURL == "" {
		bad("DATABASE_URL", "is required (a PostgreSQL connection URL, e.g. postgres://user@host:5432/db)")
	}
	if c.PollInterval < 10*time.Millisecond {
		bad("WEBHOOK_POLL_INTERVAL_MS", "must be at least 10 ms, got %s", c.PollInterval)
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		bad("WEBHOOK_BATCH_SIZE", "must be between 1 and 10000, got %d", c.BatchSize)
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > 100000 {
		bad("WEBHOOK_MAX_IN_FLIGHT", "must be between 1 and 100000, got %d", c.MaxInFlight)
	}
	if c.EndpointConcurrency < 1 {
		bad("WEBHOOK_ENDPOINT_CONCURRENCY", "must be at least 1, got %d", c.EndpointConcurrency)
	}
	if c.Timeout < time.Millisecond {
		bad("WEBHOOK_TIMEOUT_MS", "must be at least 1 ms, got %s", c.Timeout)
	}
	if min := c.Timeout + LeaseAllowance; c.Lease < min {
		bad("WEBHOOK_LEASE_MS", "is %s, shorter than the path it must cover: WEBHOOK_TIMEOUT_MS (%s) plus %s for the gate check, the wait for an endpoint slot and the settle; set WEBHOOK_LEASE_MS to at least %d or lower WEBHOOK_TIMEOUT_MS (a lease that runs out mid-attempt lets another instance send the event again)",
			c.Lease, c.Timeout, LeaseAllowance, min.Milliseconds())
	}
	if len(c.RetrySchedule) > 100 {
		bad("WEBHOOK_RETRY_SCHEDULE", "has %d steps; at most 100", len(c.RetrySchedule))
	}
	for i, d := range c.RetrySchedule {
		if d <= 0 {
			bad("WEBHOOK_RETRY_SCHEDULE", "step %d is %s; every step must be positive", i+1, d)
		}
	}
	if c.BreakerThreshold < 0 {
		bad("WEBHOOK_CIRCUIT_BREAKER_THRESHOLD", "must be 0 (off) or more, got %d", c.BreakerThreshold)
	}
	if c.BreakerReset < time.Millisecond {
		bad("WEBHOOK_CIRCUIT_BREAKER_RESET_MS", "must be at least 1 ms, got %s", c.BreakerReset)
	}
	if c.RetryRPS < 1 {
		bad("WEBHOOK_RETRY_RPS", "must be at least 1, got %d", c.RetryRPS)
	}
	if c.Retention < time.Minute {
		bad("WEBHOOK_RETENTION", "must be at least 1m, got %s", c.Retention)
	}
	if c.MaxPayloadBytes < 2 {
		bad("WEBHOOK_MAX_PAYLOAD_BYTES", "must be at least 2, got %d", c.MaxPayloadBytes)
	}
	if c.EndpointDisableAfter < time.Minute {
		bad("WEBHOOK_ENDPOINT_DISABLE_AFTER", "must be at least 1m, got %s", c.EndpointDisableAfter)
	}
	if c.Scheme != sign.Fluxora && c.Scheme != sign.Standard {
		bad("WEBHOOK_SIGNATURE_SCHEME", "must be %q or %q, got %q", sign.Fluxora, sign.Standard, c.Scheme)
	}
	return errors.Join(errs...)
}

func defaultInstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "fluxhook"
	}
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomHex(3))
}
