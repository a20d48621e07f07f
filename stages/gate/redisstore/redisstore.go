// Package redisstore is the gate.Store shared by every fluxhook instance through Redis: the
// circuit breaker and the retry rate limit survive restarts and hold across instances.
//
// Every decision is a Lua script (decide.lua, record.lua), so it is atomic however many
// instances call at once, and takes its time from Redis's TIME, so instances with skewed
// clocks agree. A claimed batch costs one round trip: one EVALSHA per endpoint in the batch,
// sent as one pipeline (a batch usually holds one or a few endpoints). A settled batch costs
// one more. EVALSHA is used so that scripts are not resent; when Redis answers NOSCRIPT
// (restarted, or SCRIPT FLUSH) the affected commands are sent again as EVAL, which caches the
// script, at the cost of one extra round trip that once.
//
// Keys, per endpoint (the SHA-256 hex of its URL, never the URL):
//
//	webhook_cb:{<hash>}        breaker state (hash: state, failures, open_until and, while
//	                           open or half-open, open_since and failed_probes); absent while
//	                           closed with no failures; expires gate.StateTTL after its last
//	                           change (plus the reset time while open)
//	webhook_cb_probe:{<hash>}  the half-open probe's owner token; expires after the probe timeout
//	webhook_rl:{<hash>}        rate-limit window: every attempt admitted (sorted set, scored by
//	                           time, at most the limit's newest); expires a second after the window
//	webhook_rl_retry:{<hash>}  the retries among them (sorted set, the same bounds), for the
//	                           share of the limit reserved for retries
//	webhook_rl_slot:{<hash>}   the latest slot handed to a deferred retry (µs by Redis's clock,
//	                           a string); expires a window and a second after that slot
//	webhook_rl_front:{<hash>}  the latest place promised to a retry refused again on its return
//	                           from a rate-limit deferral (gate.EndpointCheck.Returning), and
//	                           how many were promised it ("<µs>:<n>"); expires as the slot key
//
// A key holding something no script wrote (a key of another type, a field the scripts never
// write, a breaker, probe, slot or promise key without expiry, window entries scored in the
// future, a slot or a promise later than its key's expiry) never makes a script fail: decide.lua
// and record.lua read it as absent (a closed circuit with no failures, no probe in flight, an
// empty window, no slot handed out, no place promised) and delete it, so the endpoint behaves as a clean one from that call on (the
// breaker opens after Threshold failures counted from there); Inspect reads it the same way and
// leaves it. A probe key is a probe only while it expires within the longer of the probe timeout
// and gate.StateTTL (Inspect: gate.StateTTL). See state.lua.
//
// The hash inside braces is a Redis Cluster hash tag: an endpoint's keys share a slot, so each
// script runs on one node, and a pipeline spanning several endpoints is split per node by the
// cluster client (one round trip per node, in parallel).
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fluxora/fluxhook/stages/gate"
)

var (
	//go:embed state.lua
	stateSrc string // how every script reads the breaker and probe keys; prepended to each
	//go:embed decide.lua
	decideSrc string
	//go:embed record.lua
	recordSrc string
	//go:embed inspect.lua
	inspectSrc string

	decideScript  = redis.NewScript(stateSrc + decideSrc)
	recordScript  = redis.NewScript(stateSrc + recordSrc)
	inspectScript = redis.NewScript(stateSrc + inspectSrc)
)

// Options configures a Store.
type Options struct {
	// KeyPrefix is prepended to every key (default none), so that several deployments, or
	// tests running in parallel, can share one Redis without sharing state. It must not
	// contain '{' or '}', which would break the keys' cluster hash tags.
	KeyPrefix string
}

// Store is the Redis gate.Store.
type Store struct {
	client redis.UniversalClient
	prefix string
	owned  bool
}

var _ gate.Store = (*Store)(nil)

// New returns a Store on client, which the caller keeps and closes. Use it when the client is
// shared with other code, or built with options a URL cannot express.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: nil client")
	}
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return nil, fmt.Errorf("redisstore: key prefix %q must not contain '{' or '}'", opts.KeyPrefix)
	}
	return &Store{client: client, prefix: opts.KeyPrefix}, nil
}

// Open returns a Store on a new client for redisURL (see NewClient for the accepted forms);
// Close closes the client. It does not connect: a Redis that is down at startup makes the
// gate fail open until it answers, rather than stopping deliveries.
func Open(redisURL string, opts Options) (*Store, error) {
	client, err := NewClient(redisURL)
	if err != nil {
		return nil, err
	}
	s, err := New(client, opts)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// Client returns the Redis client, for health checks and tests.
func (s *Store) Client() redis.UniversalClient { return s.client }

// Ping checks that Redis answers (for readiness probes; the gate itself never needs it).
func (s *Store) Ping(ctx context.Context) error { return s.client.Ping(ctx).Err() }

// Close closes the client if Open created it. Safe to call more than once.
func (s *Store) Close() error {
	if !s.owned {
		return nil
	}
	s.owned = false
	return s.client.Close()
}

// Keys returns an endpoint's breaker state, probe and rate-limit window keys. RetryKeys
// returns the rate limiter's other two.
func (s *Store) Keys(hash string) (breaker, probe, rateLimit string) {
	return s.prefix + "webhook_cb:{" + hash + "}",
		s.prefix + "webhook_cb_probe:{" + hash + "}",
		s.prefix + "webhook_rl:{" + hash + "}"
}

// RetryKeys returns an endpoint's rate-limit keys for retries: the retries admitted in the
// window (for the share reserved for them) and the latest slot handed to a deferred retry.
// FrontKey returns the last.
func (s *Store) RetryKeys(hash string) (retries, slot string) {
	return s.prefix + "webhook_rl_retry:{" + hash + "}",
		s.prefix + "webhook_rl_slot:{" + hash + "}"
}

// FrontKey returns an endpoint's key for the latest place promised to a returning retry
// (gate.EndpointCheck.Returning). It is a key of its own, not a field of the slot key, so that
// a fluxhook that predates it (a rolling upgrade) reads the slot key as it always did.
func (s *Store) FrontKey(hash string) string {
	return s.prefix + "webhook_rl_front:{" + hash + "}"
}

func ms(d time.Duration) int64 { return max(1, d.Milliseconds()) }

// Decide implements gate.Store: one pipeline of one decide.lua call per endpoint.
func (s *Store) Decide(ctx context.Context, p gate.Params, checks []gate.EndpointCheck) ([]gate.EndpointDecision, error) {
	cmds, err := s.run(ctx, OpDecide, decideScript, len(checks), func(i int) ([]string, []any) {
		c := checks[i]
		ep := p.For(c)
		limit, reserve := max(ep.RetryRPS, 0), ep.RetryReserve()
		cb, probe, rl := s.Keys(c.Hash)
		retries, slot := s.RetryKeys(c.Hash)
		flags := make([]byte, len(c.Retry))
		back := make([]byte, len(c.Retry))
		for j, retry := range c.Retry {
			flags[j], back[j] = '0', '0'
			if retry {
				flags[j] = '1'
				if j < len(c.Returning) && c.Returning[j] {
					back[j] = '1'
				}
			}
		}
		return []string{cb, probe, rl, retries, slot, s.FrontKey(c.Hash)}, []any{
			max(p.Threshold, 0), limit, max(1, p.Window.Microseconds()), ms(p.ProbeTimeout),
			ms(gate.StateTTL), reserve, c.Token, string(flags), ms(p.Reset), string(back),
		}
	})
	if err != nil {
		return nil, err
	}
	out := make([]gate.EndpointDecision, len(checks))
	for i, cmd := range cmds {
		out[i] = parseDecision(cmd, checks[i])
	}
	return out, nil
}

func parseDecision(cmd *redis.Cmd, c gate.EndpointCheck) gate.EndpointDecision {
	vals, err := cmd.Slice()
	if err != nil {
		return gate.EndpointDecision{Err: err}
	}
	n := len(c.Retry)
	if len(vals) != 1+2*n {
		return gate.EndpointDecision{Err: fmt.Errorf("redisstore: decide returned %d values for %d rows", len(vals), n)}
	}
	dec := gate.EndpointDecision{Rows: make([]gate.RowDecision, n)}
	if t, _ := vals[0].(string); t != "" {
		dec.Transitions = parseTransitions(c.Hash, t)
	}
	for j := range n {
		code, ok1 := vals[1+2*j].(int64)
		delay, ok2 := vals[2+2*j].(int64)
		if !ok1 || !ok2 || code < 0 || code > int64(gate.DeferRateLimit) {
			return gate.EndpointDecision{Err: fmt.Errorf("redisstore: decide returned a malformed row: %v %v", vals[1+2*j], vals[2+2*j])}
		}
		dec.Rows[j] = gate.RowDecision{Verdict: gate.Verdict(code), Delay: time.Duration(delay) * time.Microsecond}
	}
	return dec
}

func parseTransitions(hash, s string) []gate.Transition {
	var out []gate.Transition
	for _, t := range strings.Split(s, ",") {
		from, to, ok := strings.Cut(t, ">")
		if ok {
			out = append(out, gate.Transition{Hash: hash, From: gate.State(from), To: gate.State(to)})
		}
	}
	return out
}

// Record implements gate.Store: one pipeline of one record.lua call per endpoint.
func (s *Store) Record(ctx context.Context, p gate.Params, results []gate.EndpointResult) ([]gate.Transition, error) {
	if !p.Breaker() || len(results) == 0 {
		return nil, nil
	}
	cmds, err := s.run(ctx, OpRecord, recordScript, len(results), func(i int) ([]string, []any) {
		r := results[i]
		cb, probe, _ := s.Keys(r.Hash)
		kinds := make([]byte, len(r.Rows))
		args := make([]any, 4, 4+len(r.Rows))
		for j, row := range r.Rows {
			switch row.Result {
			case gate.Success:
				kinds[j] = 's'
			case gate.Failure:
				kinds[j] = 'f'
			case gate.Neutral:
				kinds[j] = 'n'
			default:
				kinds[j] = 'r'
			}
			args = append(args, row.Token)
		}
		args[0], args[1], args[2], args[3] = p.Threshold, ms(p.Reset), ms(gate.StateTTL), string(kinds)
		return []string{cb, probe}, args
	})
	if err != nil {
		return nil, err
	}
	var trans []gate.Transition
	var errs []error
	for i, cmd := range cmds {
		t, err := cmd.Text()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if t != "" {
			trans = append(trans, parseTransitions(results[i].Hash, t)...)
		}
	}
	return trans, errors.Join(errs...)
}

// Inspect implements gate.Store.
func (s *Store) Inspect(ctx context.Context, hashes []string) ([]gate.Snapshot, error) {
	cmds, err := s.run(ctx, OpInspect, inspectScript, len(hashes), func(i int) ([]string, []any) {
		cb, probe, _ := s.Keys(hashes[i])
		return []string{cb, probe}, []any{ms(gate.StateTTL)}
	})
	if err != nil {
		return nil, err
	}
	out := make([]gate.Snapshot, len(hashes))
	for i, cmd := range cmds {
		vals, err := cmd.Slice()
		if err != nil {
			return nil, err
		}
		if len(vals) != 7 {
			return nil, fmt.Errorf("redisstore: inspect returned %d values", len(vals))
		}
		state, _ := vals[0].(string)
		failures, _ := vals[1].(int64)
		openFor, _ := vals[2].(int64)
		held, _ := vals[3].(int64)
		openSince, _ := vals[4].(int64)
		probes, _ := vals[5].(int64)
		now, _ := vals[6].(int64)
		snap := gate.Snapshot{Hash: hashes[i], State: gate.State(state), Failures: int(failures),
			OpenFor: time.Duration(openFor) * time.Microsecond, ProbeHeld: held == 1,
			FailedProbes: int(probes), At: time.UnixMicro(now)}
		if openSince > 0 { // 0: closed, or a spell whose start no script recorded
			snap.OpenSince = time.UnixMicro(openSince)
		}
		out[i] = snap
	}
	return out, nil
}

// run sends n calls of script, for op, as one pipeline of EVALSHA (one round trip) and, for the calls
// Redis answers NOSCRIPT (its script cache is empty after a restart), once more as EVAL. It
// returns an error only when every call failed; a call that failed alone carries its error.
func (s *Store) run(ctx context.Context, op Op, script *redis.Script, n int, call func(i int) ([]string, []any)) ([]*redis.Cmd, error) {
	if n == 0 {
		return nil, nil
	}
	ctx = withOp(ctx, op)
	keys := make([][]string, n)
	args := make([][]any, n)
	for i := range n {
		keys[i], args[i] = call(i)
	}
	cmds := make([]*redis.Cmd, n)
	exec := func(idx []int, eval bool) {
		_, _ = s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, i := range idx {
				if eval {
					cmds[i] = script.Eval(ctx, pipe, keys[i], args[i]...)
				} else {
					cmds[i] = script.EvalSha(ctx, pipe, keys[i], args[i]...)
				}
			}
			return nil
		})
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	exec(all, false)
	var missing []int
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		exec(missing, true)
	}
	var firstErr error
	failed := 0
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			failed++
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if failed == n {
		return nil, fmt.Errorf("redisstore: %w", firstErr)
	}
	return cmds, nil
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
