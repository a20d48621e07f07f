package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Op names what a round trip to Redis was for. The values are the op label of
// fluxora_webhook_gate_store_round_trips_total.
type Op string

// The ops. The budget is one OpDecide per claimed batch and one OpRecord per settled batch;
// a second one for a batch means Redis had lost its scripts (restart, SCRIPT FLUSH) and they
// were sent again.
const (
	OpDecide  Op = "decide"
	OpRecord  Op = "record"
	OpInspect Op = "inspect"
	// OpOther is any command outside the store's scripts (a readiness PING, a test's TIME).
	OpOther Op = "other"
)

// Ops lists every Op, so that a caller can create its series at zero before the first call.
var Ops = []Op{OpDecide, OpRecord, OpInspect, OpOther}

type opKey struct{}

// withOp tags ctx with the op its Redis calls serve, for the round-trip hook.
func withOp(ctx context.Context, op Op) context.Context { return context.WithValue(ctx, opKey{}, op) }

func opOf(ctx context.Context) Op {
	if op, ok := ctx.Value(opKey{}).(Op); ok {
		return op
	}
	return OpOther
}

// CountRoundTrips installs a hook on the store's client that calls count once per round trip
// the client makes for a caller: once per pipeline (a whole Decide or Record is one) and once
// per single command. It is counted on the client rather than read from Redis's
// total_commands_processed because a pipeline of several EVALSHA is several commands but one
// wait, and because the server's counter mixes in every other client. With Redis Cluster, a
// pipeline whose endpoints live on several nodes is counted once although it goes to each
// node (in parallel). count must be cheap and safe for concurrent use. Call it before the
// store is used; a client passed to New is shared, and the hook stays on it.
func (s *Store) CountRoundTrips(count func(Op)) {
	s.client.AddHook(roundTripHook{count: count})
}

type roundTripHook struct{ count func(Op) }

// handshake reports whether cmd belongs to a new connection's handshake (HELLO, CLIENT
// SETINFO, AUTH, SELECT), which also passes through hooks: it is the connection's cost, paid
// once, not a caller's round trip.
func handshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

func (h roundTripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h roundTripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake(cmd) {
			h.count(opOf(ctx))
		}
		return next(ctx, cmd)
	}
}

func (h roundTripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !handshake(cmds[0]) {
			h.count(opOf(ctx))
		}
		return next(ctx, cmds)
	}
}

var _ redis.Hook = roundTripHook{}
