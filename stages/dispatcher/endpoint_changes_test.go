package dispatcher_test

import (
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
)

// TestFilterChangeBySQLIsAppliedAtTheNextClaim pins that a change of an endpoint's event-type
// filter alone, made by plain SQL while a dispatcher runs and routes in memory, is applied to
// the events claimed after it: a type the new filter names is delivered, one only the old
// filter named is not (it is recorded as matching no endpoint). The dispatcher learns of the
// change only through the version trigger; were the filter missing from its comparison, the
// cache would keep the old filter (until the 30 s re-read), delivering the old type and
// dead-lettering the new one as not matching.
func TestFilterChangeBySQLIsAppliedAtTheNextClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), EventTypes: []string{"order.*"}})
	b.startInMemory()
	first := b.enqueue(outbox.Event{EventType: "order.paid"})
	eventually(t, 10*time.Second, "the event the first filter names", func() bool { return len(c.byDelivery()[first]) == 1 })
	before := b.endpointsVersion()
	if _, err := b.pool.Exec(t.Context(), `UPDATE webhook_endpoints SET event_types = '{invoice.*}' WHERE id = $1`, ep.ID); err != nil {
		t.Fatal(err)
	}
	if after := b.endpointsVersion(); after <= before {
		t.Errorf("the filter change left the endpoints' version at %d", after)
	}
	dropped := b.enqueue(outbox.Event{EventType: "order.shipped"})
	added := b.enqueue(outbox.Event{EventType: "invoice.sent"})
	b.waitSettled(15 * time.Second)
	got := c.byDelivery()
	if len(got[dropped]) != 0 || len(got[added]) != 1 {
		t.Errorf("after the filter change the endpoint got the type it no longer names %d times (want 0), the type it now names %d (want 1)",
			len(got[dropped]), len(got[added]))
	}
	if n := b.count(`SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1 AND error = 'no endpoint matched'`, dropped); n != 1 {
		t.Errorf("the event of the type the filter no longer names is not recorded as matching no endpoint")
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}
