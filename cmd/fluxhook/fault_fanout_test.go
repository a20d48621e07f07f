package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestFaultSIGKILLUnderLoadFanOut is TestFaultSIGKILLUnderLoad for managed endpoints: every
// event fans out to three endpoints, each its own consumer, routed in memory, where an
// event's leased row is the only record of its deliveries until the first of them is settled.
// One of two instances is killed while it holds such events: the survivor delivers every
// (event, endpoint) pair, the log holds exactly one delivered row for each, and only the
// events the victim held may reach an endpoint twice.
func TestFaultSIGKILLUnderLoadFanOut(t *testing.T) {
	t.Parallel()
	const events = 5 * faultRate // 5 s of load, 3,000 deliveries
	db := sqltest.NewMigrated(t)
	var consumers []*hookConsumer
	for i := range 3 {
		c := newHookConsumer(t, respondAfter(50*time.Millisecond))
		r := runCLI(t, db.URL, "endpoints", "add", "--url", c.URL(), "--secret", serveSecret, "--description", fmt.Sprint("fault ", i), "--json")
		if r.code != 0 {
			t.Fatalf("endpoints add exited %d: %s", r.code, r.stderr)
		}
		consumers = append(consumers, c)
	}
	endpointIDs := queryStrings(t, db, `SELECT id::text FROM webhook_endpoints ORDER BY description`)
	env := func(app string) map[string]string {
		e := killableEnv(t, db.URL, "", app)
		delete(e, "WEBHOOK_URL") // the endpoints only: events are routed in memory
		e["METRICS_ADDR"] = "127.0.0.1:0"
		return e
	}
	victim := startServe(t, "victim serve", env("fluxhook-victim"))
	survivor := startServe(t, "survivor serve", env("fluxhook-survivor"))
	victimID, victimMetrics := victim.instanceID(), victim.metricsAddr()
	both := []*serveProc{victim, survivor}

	prod := startProducer(t, db.Pool, events, faultRate, loadEvent)
	// Events the victim claimed (and routed in memory, or is about to) and has not settled
	// any delivery of: their rows are still the events' own (no endpoint), leased to it.
	heldInMemory := func() int {
		return queryInt(t, db, `SELECT count(*) FROM webhook_outbox WHERE leased_by = $1 AND endpoint_id IS NULL
			AND routed_at IS NULL AND lease_until > now() + interval '1 second'`, victimID)
	}
	waitAll(t, faultWait, "the victim to deliver under load", both, func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE leased_by = $1 AND endpoint_id IS NOT NULL`, victimID) >= 30
	})
	// Routing in memory starts once the instance's endpoint cache is confirmed, which waits
	// for its claims' snapshots to pass the transactions that could have changed the
	// endpoints: on a loaded machine, possibly after its first deliveries (by statement).
	pollUntil(t, faultWait, "the victim to route events in memory", func() bool {
		return scrapeMetric(t, victimMetrics, `fluxora_webhook_events_routed_total{by="memory"}`) > 0
	})
	// What it holds, taken before the kill as well as after: after, its leases may have run
	// out (the survivor claims them again) by the time its sessions are gone.
	leasedByVictim := func() []string {
		return queryStrings(t, db, `SELECT DISTINCT delivery_id::text FROM webhook_outbox WHERE leased_by = $1`, victimID)
	}
	// Struck the moment it holds some (they settle within about 50 ms).
	var inMemoryAtKill int
	pollUntil(t, faultWait, "the victim to hold events routed in memory", func() bool {
		inMemoryAtKill = heldInMemory()
		return inMemoryAtKill > 0
	})
	inFlight := idSet(leasedByVictim())
	if n := prod.produced(); n >= events {
		t.Fatalf("the producer had finished (%d events) before the kill; the kill must strike under load", n)
	}
	killInstance(t, db, victim, "fluxhook-victim")
	// The events it held, routed in memory or as delivery rows: the only ones that may arrive twice.
	for id := range idSet(leasedByVictim()) {
		inFlight[id] = true
	}

	ids := prod.wait(t, faultWait)
	waitSettled(t, db, faultWait, []*serveProc{survivor}, consumers, len(ids)*len(consumers))

	// Every (event, endpoint) pair delivered, each exactly once in the log.
	if n := queryInt(t, db, `SELECT count(*) FROM (SELECT delivery_id, endpoint_id FROM webhook_delivery_log
		WHERE endpoint_id IS NOT NULL AND status_code BETWEEN 200 AND 299 GROUP BY 1, 2 HAVING count(*) = 1) x`); n != len(ids)*len(consumers) {
		t.Errorf("%d (event, endpoint) pairs logged delivered exactly once, want %d", n, len(ids)*len(consumers))
	}
	if n := queryInt(t, db, `SELECT count(*) FROM (SELECT 1 FROM webhook_delivery_log WHERE endpoint_id IS NOT NULL
		GROUP BY delivery_id, endpoint_id HAVING count(*) FILTER (WHERE status_code BETWEEN 200 AND 299) > 1) x`); n != 0 {
		t.Errorf("%d (event, endpoint) pairs logged delivered more than once", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE endpoint_id IS NULL AND error = 'routed to 3 endpoint(s)'`); n != len(ids) {
		t.Errorf("%d events logged as routed to the 3 endpoints, want %d", n, len(ids))
	}
	// At the consumers: each endpoint got every event, twice only if the victim held it.
	twice := 0
	for i, c := range consumers {
		ok := map[string]int{}
		for _, r := range c.requests() {
			if r.VerifyErr != nil {
				t.Errorf("endpoint %d: request for %s failed verification: %v", i, r.DeliveryID, r.VerifyErr)
			}
			if r.Status == http.StatusOK {
				ok[r.DeliveryID]++
			}
		}
		for _, id := range ids {
			switch n := ok[id]; {
			case n == 0:
				t.Errorf("endpoint %d (%s) never got event %s", i, endpointIDs[i], id)
			case n > 1 && !inFlight[id]:
				t.Errorf("endpoint %d got event %s %d times, and the victim did not hold it", i, id, n)
			case n > 1:
				twice++
			}
		}
	}
	if got := scrapeMetric(t, survivor.metricsAddr(), `fluxora_webhook_events_routed_total{by="memory"}`); got == 0 {
		t.Error("the survivor routed no event in memory")
	}
	t.Logf("killed holding %d events (%d routed in memory, unsettled); %d (event, endpoint) deliveries arrived twice", len(inFlight), inMemoryAtKill, twice)
}
