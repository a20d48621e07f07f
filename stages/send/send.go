package send

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
)

// Defaults, in one place, for the Config fields whose zero value means "default".
const (
	// DefaultTimeout is the original dispatcher's request timeout, kept so that consumers
	// tuned for it see no change.
	DefaultTimeout = 30 * time.Second
	// DefaultEndpointConcurrency lets one fast consumer absorb a full backlog drain while
	// bounding what a slow one can hold: at 30 s per request, 64 slots tie up 64 workers'
	// worth of attempts at most, never the whole pipeline.
	DefaultEndpointConcurrency = 64
	// DefaultMaxResponseBytes is enough to drain the typical short acknowledgement so the
	// connection can be reused, and small enough that an endless body costs nothing.
	DefaultMaxResponseBytes = 64 << 10
	// DefaultResponseExcerptBytes keeps the whole of a typical answer (an acknowledgement, a
	// JSON error, the start of an HTML error page) while a log row stays about the size its
	// payload makes it.
	DefaultResponseExcerptBytes = 1024
	// MaxResponseExcerptBytes bounds ResponseExcerptBytes: the excerpt is read within
	// DefaultMaxResponseBytes, and every byte of it is stored in each attempt's log row.
	MaxResponseExcerptBytes = 64 << 10
	// SaturatedWait is how long Send waits for a saturated endpoint's slot before releasing
	// the row (see acquire).
	SaturatedWait = 50 * time.Millisecond
	// SaturatedDelay is how soon a row released because its endpoint was saturated is
	// claimable again: long enough not to spin on a slow consumer, short enough that a
	// briefly busy one loses no throughput.
	SaturatedDelay = 100 * time.Millisecond
	// maxResponseHeaderBytes bounds response headers so a consumer cannot exhaust memory
	// with them; legitimate acknowledgements are far smaller.
	maxResponseHeaderBytes = 64 << 10
	// shutdownError is the Outcome.Error of a row whose attempt shutdown cancelled.
	shutdownError = "cancelled by shutdown"
)

// LeaseSpent is the Outcome.Error of a row released unsent because its lease had (nearly) run
// out before its attempt could start (delivery.Delivery.SendBy): the dispatcher logs it,
// since it means the process was paused or starved for about a lease.
const LeaseSpent = "not sent: its lease had run out before the attempt could start"

// Config is the send stage's whole configuration, so that its defaults and limits can be
// read in one place; the zero value of every field means its default.
type Config struct {
	// DefaultURL is WEBHOOK_URL, used for rows whose endpoint_url is empty. It may be empty
	// when every row names its own endpoint.
	DefaultURL string
	// Timeout bounds one attempt end to end (dial, request, response headers and body
	// drain). Zero means DefaultTimeout. Set from WEBHOOK_TIMEOUT_MS.
	Timeout time.Duration
	// EndpointConcurrency is the most requests in flight to one endpoint; beyond it, Send
	// releases rows instead of queueing them. Zero means DefaultEndpointConcurrency.
	EndpointConcurrency int
	// MaxResponseBytes is how much of a response body is read (and discarded) so that the
	// connection can be reused; anything longer closes the connection instead. Zero means
	// DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// ResponseExcerptBytes is how much of each response body is kept as Outcome.Excerpt,
	// which settle stores with the attempt, so that the delivery log and dead letters show
	// what the consumer answered (WEBHOOK_RESPONSE_EXCERPT_BYTES). Nil means
	// DefaultResponseExcerptBytes; 0 keeps none. It is read out of the MaxResponseBytes that
	// are read anyway, so a smaller MaxResponseBytes bounds it too.
	ResponseExcerptBytes *int
	// MaxConnsPerHost caps connections to one host:port across all endpoints on it, to
	// protect a consumer that exposes many endpoint URLs. Zero means EndpointConcurrency.
	// Endpoints that share a host share this cap, so a saturated one can make the others
	// on that host wait (up to Timeout) for a connection; raise it when that matters.
	MaxConnsPerHost int
	// AllowedNetworks are networks that endpoints may reach although the SSRF guard would
	// refuse them: private, link-local, CGNAT, documentation and similar ranges, and loopback
	// for endpoints whose host is a name rather than localhost or a loopback IP. Set from
	// WEBHOOK_ALLOWED_NETWORKS (see ParseAllowedNetworks). An IPv4 network also allows the
	// IPv4-mapped IPv6 form of its addresses. Unspecified, multicast and broadcast addresses
	// stay refused whatever it says. Nil allows none. It applies to the URLs the operator
	// configured (DefaultURL, managed endpoints), not to rows' endpoint_url: see RowURLNetworks.
	AllowedNetworks []netip.Prefix
	// RowURLNetworks are the networks a row's endpoint_url may reach beyond public addresses,
	// loopback included (WEBHOOK_ROW_URL_NETWORKS, see ParseRowURLNetworks). It is a setting
	// of its own because a row's URL is written by whoever may insert into the outbox, not by
	// the operator: a network allowed for the operator's own endpoints must not open to every
	// producer, and a row naming localhost must not reach this machine's ports. Nil keeps row
	// URLs to public addresses.
	RowURLNetworks []netip.Prefix
	// Resolver looks up endpoint host names at dial time, so that the guard checks the
	// addresses actually dialled. Nil means net.DefaultResolver.
	Resolver Resolver
	// Conflict409Delivered says whether a 409 Conflict answer means the consumer already has
	// the event (WEBHOOK_409_DELIVERED): then the row is Delivered, with
	// Outcome.AlreadyDelivered set, instead of dead-lettered. Nil, the default, decides per
	// request by its wire format: true for the fluxora scheme, whose receiver answers 409 to a
	// delivery id it has already accepted, false for the Standard Webhooks scheme. Set it to
	// false for fluxora consumers that use 409 for something else (see ConflictDelivered).
	Conflict409Delivered *bool
	// PermanentStatuses are the answers dead-lettered at once besides 410 Gone
	// (WEBHOOK_PERMANENT_STATUSES); every other non-2xx answer is retried (see Classify). Nil
	// means DefaultPermanentStatuses; an empty slice, none.
	PermanentStatuses []int
	// RootCAs verifies consumers' certificates. Nil means the system's roots (which honour
	// SSL_CERT_FILE and SSL_CERT_DIR); tests and private CAs set it.
	RootCAs *x509.CertPool
}

// WithDefaults returns a copy of c with every zero field set to its default, so that code
// reading the config never needs to know which zero means what.
func (c Config) WithDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.EndpointConcurrency == 0 {
		c.EndpointConcurrency = DefaultEndpointConcurrency
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.ResponseExcerptBytes == nil {
		c.ResponseExcerptBytes = new(DefaultResponseExcerptBytes)
	}
	if c.MaxConnsPerHost == 0 {
		c.MaxConnsPerHost = c.EndpointConcurrency
	}
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	return c
}

// Validate reports the first invalid setting, naming the field and, where there is one, the
// environment variable, so that a bad configuration stops fluxhook before anything is claimed.
func (c Config) Validate() error {
	for i, p := range c.AllowedNetworks {
		if !p.IsValid() {
			return fmt.Errorf("WEBHOOK_ALLOWED_NETWORKS: entry %d is not a valid network; use CIDR form such as 10.1.0.0/16", i+1)
		}
	}
	for i, p := range c.RowURLNetworks {
		if !p.IsValid() {
			return fmt.Errorf("WEBHOOK_ROW_URL_NETWORKS: entry %d is not a valid network; use loopback or CIDR form such as 10.1.0.0/16", i+1)
		}
	}
	if c.DefaultURL != "" {
		if err := ValidateURL(c.DefaultURL); err != nil {
			return fmt.Errorf("WEBHOOK_URL: %w", err)
		}
		// A URL naming an IP address can be checked now rather than dead-lettering every row;
		// host names are checked when dialled, since what they resolve to may change.
		if u, err := url.Parse(c.DefaultURL); err == nil && !isLoopback(u.Hostname()) {
			if addr, err := netip.ParseAddr(u.Hostname()); err == nil {
				g := guard{allowed: c.AllowedNetworks}
				if err := g.check(addr, false, true); err != nil {
					return fmt.Errorf("WEBHOOK_URL: %w", err)
				}
			}
		}
	}
	if c.Timeout < 0 {
		return fmt.Errorf("WEBHOOK_TIMEOUT_MS: the request timeout must be positive, got %v", c.Timeout)
	}
	if c.EndpointConcurrency < 0 {
		return fmt.Errorf("send: EndpointConcurrency must be positive (0 for the default %d), got %d",
			DefaultEndpointConcurrency, c.EndpointConcurrency)
	}
	if c.MaxResponseBytes < 0 {
		return fmt.Errorf("send: MaxResponseBytes must be positive (0 for the default %d), got %d",
			DefaultMaxResponseBytes, c.MaxResponseBytes)
	}
	if c.MaxConnsPerHost < 0 {
		return fmt.Errorf("send: MaxConnsPerHost must be positive (0 for EndpointConcurrency), got %d", c.MaxConnsPerHost)
	}
	if p := c.ResponseExcerptBytes; p != nil && (*p < 0 || *p > MaxResponseExcerptBytes) {
		return fmt.Errorf("WEBHOOK_RESPONSE_EXCERPT_BYTES: must be from 0 (keep none) to %d bytes, got %d", MaxResponseExcerptBytes, *p)
	}
	return nil
}

// Sender makes delivery attempts. One Sender is shared by all send workers so that they
// share its connections and its per-endpoint concurrency counts; it is safe for concurrent
// use.
type Sender struct {
	cfg       Config
	permanent []int // cfg.PermanentStatuses, or DefaultPermanentStatuses; an endpoint's own list wins
	// transport makes every request. It is used directly, not through an http.Client: a
	// client exists to follow redirects, which fluxhook must not do (a 3xx is retried,
	// and following it would send signed payloads to a URL nobody validated), and to do so
	// it copies every request's headers; RoundTrip never follows a redirect and sends
	// d.Header as it is.
	transport *http.Transport
	guard     *guard // the transport's DialContext
	// rowTransport makes the requests to rows' endpoint_url, through rowGuard, which holds
	// them to RowURLNetworks. A transport of its own, not a flag on the dial: a transport
	// reuses idle connections by host and port, so a row URL naming the same host as
	// WEBHOOK_URL would otherwise ride a connection the operator's policy let through.
	rowTransport *http.Transport
	rowGuard     *guard

	defaultEndpoint *delivery.Endpoint // nil without DefaultURL

	// excerpt is how many bytes of a body are kept as Outcome.Excerpt and peek how many of a
	// 409's body classifyConflict reads, both within MaxResponseBytes; heads holds the
	// buffers (*[]byte of max(excerpt, peek) bytes) they are read into, so that reading them
	// allocates nothing but the excerpt's string.
	excerpt, peek int
	heads         sync.Pool

	endpointsMu sync.Mutex
	endpoints   map[string]*delivery.Endpoint // by raw endpoint_url

	inflightMu sync.Mutex
	// slotWait is SaturatedWait; a field so that tests can lengthen it.
	slotWait time.Duration

	// inflight is the load on each endpoint by Endpoint.Key; keys are removed when nothing is
	// in flight or waiting, so its size is bounded by the requests in flight and Saturated
	// scans only those.
	inflight map[string]*endpointLoad
}

// New builds a Sender from cfg, validating it first so that a bad WEBHOOK_URL or limit is
// reported at startup rather than as dead letters.
func New(cfg Config) (*Sender, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()

	newTransport := func(mkGuard func(*net.Dialer) *guard) (*http.Transport, *guard) {
		dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
		transport := &http.Transport{
			// No proxy from the environment: the dial-time private-network check must see the
			// consumer's own address, and a proxy would also see every signed request.
			Proxy:                  nil,
			TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: cfg.RootCAs},
			TLSHandshakeTimeout:    10 * time.Second,
			MaxIdleConns:           0, // no global cap: per host and IdleConnTimeout bound it
			MaxIdleConnsPerHost:    cfg.EndpointConcurrency,
			MaxConnsPerHost:        cfg.MaxConnsPerHost,
			IdleConnTimeout:        90 * time.Second,
			MaxResponseHeaderBytes: maxResponseHeaderBytes,
			// The body is discarded; asking for gzip would only add decompression work and a
			// header the consumer did not get from the original dispatcher.
			DisableCompression: true,
			ForceAttemptHTTP2:  false,
		}
		// Dialing goes through this one field so that the private-network guard can wrap it:
		// checking the address actually dialled, after DNS resolution, is the only check that a
		// DNS answer cannot sidestep. The guard dials the checked IP itself; the transport still
		// does TLS against the URL's host name, so certificates are verified as usual.
		g := mkGuard(dialer)
		transport.DialContext = g.DialContext
		return transport, g
	}
	transport, operatorGuard := newTransport(func(d *net.Dialer) *guard { return newGuard(cfg.Resolver, cfg.AllowedNetworks, false, d) })
	rowTransport, rowGuard := newTransport(func(d *net.Dialer) *guard { return newGuard(cfg.Resolver, cfg.RowURLNetworks, true, d) })

	permanent := cfg.PermanentStatuses
	if permanent == nil {
		permanent = DefaultPermanentStatuses
	}
	s := &Sender{
		cfg:          cfg,
		permanent:    permanent,
		guard:        operatorGuard,
		transport:    transport,
		rowGuard:     rowGuard,
		rowTransport: rowTransport,
		endpoints:    make(map[string]*delivery.Endpoint),
		inflight:     make(map[string]*endpointLoad),
		slotWait:     SaturatedWait,
	}
	if cfg.DefaultURL != "" {
		s.defaultEndpoint = newEndpoint(cfg.DefaultURL, "")
	}
	s.excerpt = int(min(int64(*cfg.ResponseExcerptBytes), cfg.MaxResponseBytes))
	s.peek = int(min(conflictPeekBytes, cfg.MaxResponseBytes))
	size := max(s.excerpt, s.peek)
	s.heads.New = func() any { b := make([]byte, size); return &b }
	return s, nil
}

// Send makes one attempt for d and records the result in d.Outcome, so that the caller only
// has to pass the row on to settle. d.Endpoint and d.Header must be set; d.Payload is sent
// byte for byte and d.Header as is (it is not copied, and not modified).
//
// Send never waits for a slot: if d's endpoint already has EndpointConcurrency requests in
// flight it makes no request and returns a Release outcome due after SaturatedDelay. If ctx
// is cancelled before a response arrives (shutdown forced), the outcome is a Release due at
// once, so that the row is retried by whichever instance claims it next.
func (s *Sender) Send(ctx context.Context, d *delivery.Delivery) {
	if d.Endpoint == nil {
		// A wiring bug, not a consumer failure: dead-letter with a reason rather than panic
		// in a long-running service or loop on the row forever.
		d.Outcome = delivery.Outcome{Kind: delivery.Permanent, Reason: "send: row reached the send stage without an endpoint"}
		return
	}
	if d.Header == nil {
		// Likewise a wiring bug: the sign stage did not run, and an unsigned request is
		// worse than a dead letter that can be replayed.
		d.Outcome = delivery.Outcome{Kind: delivery.Permanent, Reason: "send: row reached the send stage unsigned (no headers)"}
		return
	}
	if !d.Endpoint.Admits(d) {
		// Never across tenants: the dispatcher checks the tenant when it resolves the
		// endpoint; this is the last check, at the request itself.
		d.Outcome = delivery.Outcome{Kind: delivery.Permanent, Reason: TenantMismatch(d, d.Endpoint)}
		return
	}
	if ctx.Err() != nil {
		d.Outcome = delivery.Outcome{Kind: delivery.Release, Error: shutdownError}
		return
	}
	key := d.Endpoint.Key
	if !s.acquire(ctx, key, s.limit(d.Endpoint)) {
		d.Outcome = delivery.Outcome{Kind: delivery.Release, Delay: SaturatedDelay}
		return
	}
	defer s.release(key)
	// Checked last, after the wait for a slot: the later the check, the smaller the window
	// in which a paused dispatcher sends a row whose lease another claim already holds.
	if !d.SendBy.IsZero() && time.Now().Round(0).After(d.SendBy) { // wall clocks: see SendBy
		d.Outcome = delivery.Outcome{Kind: delivery.Release, Error: LeaseSpent}
		return
	}
	d.Outcome = s.attempt(ctx, d)
}

// TenantMismatch is the dead-letter reason of a delivery whose event's tenant is not its managed
// endpoint's (the endpoint's tenant was changed after the event was routed to it). The
// endpoint's tenant is named only in a dead letter without a tenant, which only the operator
// reads: a tenant's dead letter is that tenant's to read, and the endpoint's new tenant
// (another customer) is none of its business.
func TenantMismatch(d *delivery.Delivery, ep *delivery.Endpoint) string {
	id, event := strings.TrimPrefix(ep.Key, "ep:"), tenantName(d.Tenant, d.EmptyTenant)
	if d.Tenant == "" {
		return fmt.Sprintf("endpoint %s belongs to tenant %s, not to the event's tenant %s: never sent across tenants (replay it to an endpoint of tenant %s)",
			id, tenantName(ep.Tenant, ep.EmptyTenant), event, event)
	}
	return fmt.Sprintf("endpoint %s is no longer an endpoint of the event's tenant %s: never sent across tenants (replay it to an endpoint of tenant %s)",
		id, event, event)
}

func tenantName(t string, empty bool) string {
	switch {
	case empty:
		return `"" (the empty string)`
	case t == "":
		return "(none)"
	}
	return strconv.Quote(t)
}

// attempt performs the HTTP request; the caller holds the endpoint's slot.
func (s *Sender) attempt(ctx context.Context, d *delivery.Delivery) delivery.Outcome {
	reqCtx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()

	req, err := newRequest(reqCtx, d)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return delivery.Outcome{Kind: delivery.Permanent, Reason: ErrInvalidURL.Error() + ": " + err.Error()}
	}
	req.Header = d.Header
	req.ContentLength = int64(len(d.Payload))

	transport := s.transport
	if d.Endpoint.RowURL {
		transport = s.rowTransport
	}
	start := time.Now()
	resp, err := transport.RoundTrip(req) // see Sender.transport for why not a Client
	if err != nil {
		elapsed := time.Since(start)
		if ctx.Err() != nil {
			return delivery.Outcome{Kind: delivery.Release, Error: shutdownError, Duration: elapsed}
		}
		if strings.HasPrefix(err.Error(), "net/http: invalid header field") {
			// net/http refused to send the request at all (a header value with a control
			// character): the row can never be sent, and its endpoint did nothing wrong.
			// No Error, so the breaker does not count it as the endpoint's failure.
			return delivery.Outcome{Kind: delivery.Permanent, Reason: "invalid row: the request cannot be sent: " + err.Error(), Duration: elapsed}
		}
		// A tenant reads this attempt (a URL a producer or tenant wrote, or any endpoint of a
		// tenant's, whose DNS the tenant may control): a name that leads only to addresses it
		// may not use, and one that does not resolve at all, fail alike, retried with the same
		// error, so that test events cannot tell the dispatcher's internal names that exist
		// from those that do not. The log's detail says which.
		tenantReads := d.Endpoint.RowURL || d.Tenant != "" || d.EmptyTenant
		refused, isRefused := errRefused(err)
		var dnsErr *net.DNSError
		switch {
		case isRefused && tenantReads && !refused.literal:
			return delivery.Outcome{Kind: delivery.Retry, Error: unresolvedError, Detail: refused.Error(), Duration: elapsed}
		case !isRefused && tenantReads && errors.As(err, &dnsErr):
			return delivery.Outcome{Kind: delivery.Retry, Error: unresolvedError,
				Detail: describeError(err, s.cfg.Timeout, false), Duration: elapsed}
		}
		if isRefused {
			// A policy refusal, made before any connection: Permanent, because nothing but
			// the operator (WEBHOOK_ALLOWED_NETWORKS, then a replay) or the consumer's own
			// DNS can change it, and retrying for the schedule's days would only delay the
			// dead letter that tells someone to act. A failed lookup stays a Retry.
			// The dead letter and the attempt's error, which the row's or the endpoint's tenant
			// reads, get the refusal without the address and the settings (a tenant whose
			// endpoint's DNS it controls, even one the operator wrote, could map internal
			// names with test events); the log gets it whole.
			public, whole := refused.Public(), refused.Error()
			if refused.rowURL {
				// No Error: a row's URL refused by policy says nothing about any consumer, so
				// no breaker counts it (and the row has no endpoint of its own to blame).
				return delivery.Outcome{Kind: delivery.Permanent, Reason: public, Detail: whole, Duration: elapsed}
			}
			return delivery.Outcome{Kind: delivery.Permanent, Error: public, Reason: public, Detail: whole, Duration: elapsed}
		}
		timedOut := errors.Is(reqCtx.Err(), context.DeadlineExceeded)
		return delivery.Outcome{Kind: delivery.Retry, Error: describeError(err, s.cfg.Timeout, timedOut), Duration: elapsed}
	}
	status := resp.StatusCode
	if status == http.StatusSwitchingProtocols {
		// net/http hands over the connection itself as the body of a 101: no request deadline
		// bounds a read from it, and a consumer that switched and kept the socket open held the
		// send worker, its endpoint's slot and its in-flight slot for good (the row never
		// settled, and Stop never returned). It is no answer to a webhook: closed unread, and
		// counted as the failed attempt it is.
		_ = resp.Body.Close()
		return delivery.Outcome{Kind: delivery.Retry, Status: status, Error: statusError(status) + ": the consumer switched protocols instead of answering",
			Duration: time.Since(start)}
	}
	// The start of the body is kept: as the excerpt stored with the attempt, and for a 409 that
	// may mean "already delivered", to decide it (see classifyConflict). One read serves both,
	// into a pooled buffer; with excerpts off, only such a 409 reads into one.
	conflict := status == http.StatusConflict && ConflictDelivered(s.cfg.Conflict409Delivered, d.Header)
	keep := s.excerpt
	if conflict {
		keep = max(keep, s.peek)
	}
	var head []byte
	var buf *[]byte
	if keep > 0 {
		buf = s.heads.Get().(*[]byte)
		n, _ := io.ReadFull(resp.Body, (*buf)[:keep])
		head = (*buf)[:n]
	}
	// Drain a little so that the connection can be reused; whatever is left (or a body that
	// never ends) is cut off by Close, and a trickling body by the request timeout. A read
	// error here changes nothing: the consumer has already answered.
	_, _ = io.CopyN(io.Discard, resp.Body, s.cfg.MaxResponseBytes-int64(len(head)))
	_ = resp.Body.Close()

	permanent := s.permanent
	if d.Endpoint.PermanentStatuses != nil { // a managed endpoint's own list
		permanent = d.Endpoint.PermanentStatuses
	}
	out := delivery.Outcome{Kind: Classify(status, permanent), Status: status, Duration: time.Since(start)}
	if s.excerpt > 0 {
		out.Excerpt, out.Excerpted = excerptOf(head[:min(len(head), s.excerpt)], s.excerpt), true
	}
	switch {
	case conflict:
		out.Kind, out.Error = classifyConflict(head[:min(len(head), s.peek)], resp.Header.Get("Retry-After"))
		out.AlreadyDelivered = out.Kind == delivery.Delivered
	case out.Kind != delivery.Delivered:
		out.Error = statusError(status)
	}
	if buf != nil {
		s.heads.Put(buf) // head is not used beyond this point: excerptOf copied what it keeps
	}
	if status == http.StatusRequestEntityTooLarge {
		// Settle keeps a Permanent outcome's own Reason; without one it would write a bare
		// "permanent failure: HTTP 413 Request Entity Too Large".
		out.Reason = PayloadTooLargeReason(len(d.Payload), isFluxora(d.Header))
	}
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable || conflict && out.Kind == delivery.Retry {
		if v := resp.Header.Get("Retry-After"); v != "" {
			if delay, ok := ParseRetryAfter(v, time.Now()); ok {
				out.Delay = delay
			}
		}
	}
	return out
}

// unresolvedError is the error of an attempt a tenant reads whose host does not resolve, or
// leads only to addresses the network policy refuses: the same for both (see Send).
const unresolvedError = "endpoint refused: its host does not resolve to an address it may use; the dispatcher's log says why"

// statusError is the error text for a non-2xx answer, e.g. "HTTP 503 Service Unavailable".
func statusError(status int) string {
	if text := http.StatusText(status); text != "" {
		return "HTTP " + strconv.Itoa(status) + " " + text
	}
	return "HTTP " + strconv.Itoa(status)
}

// acquire takes one of key's slots, waiting up to SaturatedWait for one to free. The short
// wait matters for a fast endpoint at its limit: its slots free within milliseconds, and
// releasing the row instead would cost a settle and a re-claim for nothing (measured: about
// half a release per event while draining a backlog to one endpoint). For a slow endpoint it
// bounds how long a worker is held before the row is released and claimed around.
//
// Waiters queue in order, and release wakes only the first of them. Waking every waiter on
// each release made them all contend for the one slot: acquire was 6.1% of the dispatcher's
// CPU while draining a backlog to one endpoint, 3.2% waking one (CPU profiles of
// `fluxhook bench --workload drain -profile DIR`). A free slot is not reserved for the woken
// waiter: a worker that arrives while it wakes up may take it, and the waiter queues again at
// the front. Handing the slot over instead costs every request a context switch, and
// measured slower than even waking every waiter (drain: 12,100-12,900 against 12,500-15,500
// events/s, dispatcher CPU 59-70 against 46-57 µs per event).
func (s *Sender) acquire(ctx context.Context, key string, limit int) bool {
	s.inflightMu.Lock()
	l := s.inflight[key]
	if l == nil {
		l = &endpointLoad{}
		s.inflight[key] = l
	}
	l.limit = limit
	if l.inflight < limit {
		l.inflight++
		s.inflightMu.Unlock()
		return true
	}
	wake := make(chan struct{}, 1) // release sends at most once per queueing, so never blocks
	l.waiters = append(l.waiters, wake)
	s.inflightMu.Unlock()

	timer := time.NewTimer(s.slotWait)
	defer timer.Stop()
	for {
		woken, giveUp := false, false
		select {
		case <-wake:
			woken = true
		case <-timer.C:
			giveUp = true
		case <-ctx.Done():
			giveUp = true
		}
		s.inflightMu.Lock()
		if !woken {
			select {
			case <-wake: // woken just as the wait ended
				woken = true
			default:
			}
		}
		if woken {
			l.woken-- // release took this waiter off the queue and counted it
		} else if i := slices.Index(l.waiters, wake); i >= 0 {
			l.waiters = slices.Delete(l.waiters, i, i+1)
		}
		// A free slot is taken even by a waiter about to give up: using it beats releasing
		// the row (a cancelled ctx makes the attempt end at once anyway).
		if l.inflight < l.limit {
			l.inflight++
			s.inflightMu.Unlock()
			return true
		}
		if giveUp {
			s.inflightMu.Unlock()
			return false
		}
		// Another worker took the slot first: wait again, first in line.
		l.waiters = slices.Insert(l.waiters, 0, wake)
		s.inflightMu.Unlock()
	}
}

// limit is ep's concurrency: its own override, or EndpointConcurrency.
func (s *Sender) limit(ep *delivery.Endpoint) int {
	if ep.Concurrency > 0 {
		return ep.Concurrency
	}
	return s.cfg.EndpointConcurrency
}

// release frees key's slot and wakes the first waiter.
func (s *Sender) release(key string) {
	now := time.Now()
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	l := s.inflight[key]
	l.finished(now)
	l.inflight--
	if len(l.waiters) > 0 {
		next := l.waiters[0]
		l.waiters[0] = nil
		l.waiters = l.waiters[1:]
		l.woken++
		next <- struct{}{}
		return
	}
	s.forget(key, l)
}

// forget drops key's load once nothing is in flight or waiting for it (a woken waiter still
// counts: it holds this load); the caller holds inflightMu.
func (s *Sender) forget(key string, l *endpointLoad) {
	if l.inflight == 0 && len(l.waiters) == 0 && l.woken == 0 && s.inflight[key] == l {
		delete(s.inflight, key)
	}
}

// Saturated appends to dst the Keys of the endpoints that should get no more rows for now,
// and returns it, so that the claim can leave their rows unleased instead of claiming rows
// Send would only release. An endpoint is saturated when every slot is taken and the
// requests already waiting for one would not all get a slot within half of SaturatedWait at
// the rate its requests have been finishing (see endpointLoad.saturated). It is cheap enough
// to call before every claim: it scans only the endpoints with requests in flight. Reuse dst
// across calls to avoid allocating.
func (s *Sender) Saturated(dst []string) []string {
	now := time.Now()
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	for key, l := range s.inflight {
		if l.saturated(now, l.limit) {
			dst = append(dst, key)
		}
	}
	return dst
}

// rateWindow is the span over which an endpoint's finished requests are counted to judge
// whether the requests waiting for it will get a slot in time: half of SaturatedWait, so that
// a row judged worth claiming has twice the time it is expected to need.
const rateWindow = SaturatedWait / 2

// endpointLoad is one endpoint's requests in flight, those waiting in acquire for a slot (in
// order, each to be handed one by release), and how many finished in the current and the
// previous rateWindow.
type endpointLoad struct {
	// limit is the endpoint's concurrency (see Sender.limit), set by every acquire.
	limit    int
	inflight int
	waiters  []chan struct{}
	// woken counts waiters that release took off the queue and woke, and that have not yet
	// looked for their slot: they still wait, and still hold this load.
	woken          int
	windowStart    time.Time
	done, prevDone int
}

// roll moves the finished-request windows forward to now.
func (l *endpointLoad) roll(now time.Time) {
	switch elapsed := now.Sub(l.windowStart); {
	case elapsed < rateWindow:
	case elapsed < 2*rateWindow:
		l.prevDone, l.done = l.done, 0
		l.windowStart = l.windowStart.Add(rateWindow)
	default:
		l.prevDone, l.done = 0, 0
		l.windowStart = now
	}
}

// finished counts one request that finished at now.
func (l *endpointLoad) finished(now time.Time) {
	l.roll(now)
	l.done++
}

// saturated reports whether the endpoint should get no more rows: all limit slots are taken
// and at least as many requests wait as finished in a recent rateWindow. Counting only slots
// made every backlog drain to one fast consumer claim empty batches: its slots are always
// all taken, yet its queue empties within milliseconds (measured: 0.26 empty claims per
// claimed batch, 50 ms of waiting each time). An endpoint that finishes nothing, one that
// hangs, is saturated as soon as its slots are.
func (l *endpointLoad) saturated(now time.Time, limit int) bool {
	if l.inflight < limit {
		return false
	}
	l.roll(now)
	return len(l.waiters)+l.woken >= max(l.done, l.prevDone)
}

// Close closes idle keep-alive connections so that shutdown does not leave sockets open to
// consumers. Requests still in flight are not interrupted (cancel their context for that), and
// the Sender remains usable, dialling anew if called again.
func (s *Sender) Close() {
	s.transport.CloseIdleConnections()
	s.rowTransport.CloseIdleConnections()
}

// newRequest builds the POST for d. With the endpoint's URL parsed once (Endpoint.Parsed) it
// skips http.NewRequest's per-request parse; the transport never modifies req.URL, so one
// parsed URL can serve every request to the endpoint.
func newRequest(ctx context.Context, d *delivery.Delivery) (*http.Request, error) {
	u := d.Endpoint.Parsed
	if u == nil {
		return http.NewRequestWithContext(ctx, http.MethodPost, d.Endpoint.URL, bytes.NewReader(d.Payload))
	}
	body := d.Payload
	req := &http.Request{
		Method:     http.MethodPost,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Body:       io.NopCloser(bytes.NewReader(body)),
		GetBody:    func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil },
		Host:       u.Host,
	}
	return req.WithContext(ctx), nil
}
