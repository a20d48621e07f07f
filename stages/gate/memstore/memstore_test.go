package memstore_test

import (
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/gate"
	"github.com/fluxora/fluxhook/stages/gate/gatetest"
	"github.com/fluxora/fluxhook/stages/gate/memstore"
)

// backend is one in-process store on a fake clock: every "instance" shares it, as the gates
// of one process do.
type backend struct {
	clock *gatetest.Clock
	store *memstore.Store
}

func (b *backend) NewStore(testing.TB) gate.Store        { return b.store }
func (b *backend) Advance(_ testing.TB, d time.Duration) { b.clock.Advance(d) }
func (b *backend) Slack() time.Duration                  { return 0 }

func TestContract(t *testing.T) {
	t.Parallel()
	gatetest.Run(t, func(testing.TB) gatetest.Backend {
		clock := gatetest.NewClock()
		return &backend{clock: clock, store: memstore.New(memstore.Options{Now: clock.Now})}
	})
}
