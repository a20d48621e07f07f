package redisstore_test

import (
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/gatetest"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// backend is one key prefix on the shared test Redis; each NewStore is a new client, as a
// separate fluxhook instance would have.
type backend struct {
	prefix string
	clock  *redisstore.Store // reads Redis's TIME for Advance
}

func (b *backend) NewStore(t testing.TB) gate.Store { return redistest.Open(t, b.prefix) }

func (b *backend) Advance(t testing.TB, d time.Duration) {
	redistest.WaitFor(t, b.clock.Client(), d)
}

// Slack is generous: Redis's clock runs on while a loaded CI machine under -race schedules the
// test, and every such pause shortens the delays the scripts compute.
func (b *backend) Slack() time.Duration { return 500 * time.Millisecond }

func TestContract(t *testing.T) {
	t.Parallel()
	gatetest.Run(t, func(t testing.TB) gatetest.Backend {
		prefix := redistest.Prefix(t)
		return &backend{prefix: prefix, clock: redistest.Open(t, prefix)}
	})
}
