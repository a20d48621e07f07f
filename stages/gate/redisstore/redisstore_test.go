package redisstore_test

import (
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/gatetest"
	"github.com/fluxora/fluxhook/stages/gate/redisstore"
	"github.com/fluxora/fluxhook/stages/gate/redisstore/redistest"
)

// backend is one key prefix on a test Redis (url); each NewStore is a new client, as a
// separate fluxhook instance would have.
type backend struct {
	url    string
	prefix string
	clock  *redisstore.Store // reads Redis's TIME for Advance
}

func (b *backend) NewStore(t testing.TB) gate.Store { return redistest.OpenURL(t, b.url, b.prefix) }

// Advance lets Redis's own clock run on by d, plus 2 ms: Redis expires a key (the held probe) only once its millisecond
// clock is past the expiry, which it computed from a millisecond clock truncated when the key
// was set. Waiting exactly d by TIME's microseconds could end in the very millisecond the key
// expires in, where it still exists (CI saw "after the probe timeout no new probe").
func (b *backend) Advance(t testing.TB, d time.Duration) {
	redistest.WaitFor(t, b.clock.Client(), d+2*time.Millisecond)
}

// Slack is generous: Redis's clock runs on while a loaded CI machine under -race schedules the
// test, and every such pause shortens the delays the scripts compute.
func (b *backend) Slack() time.Duration { return 500 * time.Millisecond }

func TestContract(t *testing.T) {
	t.Parallel()
	gatetest.Run(t, contractBackend(redistest.URL()))
}

// contractBackend gives each contract test a key prefix of its own on the Redis at url.
func contractBackend(url string) func(t testing.TB) gatetest.Backend {
	return func(t testing.TB) gatetest.Backend {
		prefix := redistest.Prefix(t)
		return &backend{url: url, prefix: prefix, clock: redistest.OpenURL(t, url, prefix)}
	}
}
