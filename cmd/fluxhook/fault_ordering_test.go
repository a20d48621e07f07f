package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestFaultOrderedStreams is ordered delivery's property test: random streams go through two
// instances with WEBHOOK_ORDERING=stream while the consumer fails a share of attempts, one
// instance is frozen past its lease (its heads are taken over by the other) and the other is
// killed with SIGKILL and replaced. Every stream's first arrivals (by delivery id) must come
// strictly in the order the events were enqueued, and nothing may be lost.
func TestFaultOrderedStreams(t *testing.T) {
	t.Parallel()
	// 16 streams at 200 events/s: a stream's next event comes every 80 ms, sooner than a failed
	// attempt's retry (250 ms), so that without ordering streams would go out of order. 150
	// events each is 12 s of production: the freeze (past a 4 s lease) ends while events still
	// arrive, so that the kill after it finds rows in flight however slow the machine is;
	// with 60 (4.8 s) the queue could be drained before the kill and the wait for rows in
	// flight timed out.
	const streams, perStream = 16, 150
	db := sqltest.NewMigrated(t)
	c := newHookConsumer(t, func(ctx context.Context, req *hookRequest) int {
		h := fnv.New32a()
		fmt.Fprint(h, req.DeliveryID, req.Attempt)
		switch v := h.Sum32() % 100; {
		case v < 12:
			return http.StatusInternalServerError
		case v < 15:
			select { // slow: keeps heads in flight across the faults
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
				return 0
			}
		}
		return http.StatusOK
	})
	env := func(app string) map[string]string {
		e := killableEnv(t, db.URL, c.URL(), app)
		e["WEBHOOK_ORDERING"] = "stream"
		e["WEBHOOK_RETRY_SCHEDULE"] = "250ms,250ms,250ms,250ms,250ms,250ms,250ms,250ms,250ms,250ms"
		return e
	}
	frozen := startServe(t, "frozen serve", env("fluxhook-frozen"))
	victim := startServe(t, "victim serve", env("fluxhook-victim"))
	frozenID, victimID := frozen.instanceID(), victim.instanceID()

	prod := startProducer(t, db.Pool, streams*perStream, faultRate, func(i int) outbox.Event {
		s := fmt.Sprintf("s%d", i%streams)
		return outbox.Event{StreamID: s, EventType: "stream.updated", Payload: map[string]any{"stream": s, "seq": i / streams}}
	})
	leasedBy := func(instance string) []string {
		return queryStrings(t, db, `SELECT DISTINCT delivery_id::text FROM webhook_deliveries
			WHERE NOT processed AND leased_by = $1`, instance)
	}
	inFlight := map[string]bool{}

	// Lease expiry: freeze one instance with rows in flight, past its lease.
	pollUntil(t, faultWait, "the first instance to hold rows in flight under load", func() bool {
		return prod.produced() > streams*perStream/4 && len(leasedBy(frozenID)) > 0
	})
	frozen.signal(syscall.SIGSTOP)
	// A claim the instance sent just before it stopped still runs in PostgreSQL: its rows are
	// the frozen instance's too (it sends them when it wakes), so the leases are read only
	// once none of its sessions is running a statement.
	pollUntil(t, 15*time.Second, "the frozen instance's last statements to finish", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'fluxhook-frozen' AND state = 'active'`) == 0
	})
	for _, id := range leasedBy(frozenID) {
		inFlight[id] = true
	}
	pollUntil(t, faultWait, "the frozen instance's leases to run out and its rows to move on", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE NOT processed AND leased_by = $1
			AND lease_until > now()`, frozenID) == 0
	})
	frozen.signal(syscall.SIGCONT)

	// A kill: the other instance dies with rows in flight and a new one takes its place.
	pollUntil(t, faultWait, "the second instance to hold rows in flight", func() bool {
		return prod.produced() > streams*perStream/2 && len(leasedBy(victimID)) > 0
	})
	victim.kill()
	victim.waitExit(5 * time.Second)
	pollUntil(t, 15*time.Second, "the killed instance's sessions to end", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'fluxhook-victim'`) == 0
	})
	for _, id := range leasedBy(victimID) {
		inFlight[id] = true
	}
	replacement := startServe(t, "replacement serve", env("fluxhook-replacement"))

	ids := prod.wait(t, faultWait)
	waitSettled(t, db, faultWait, []*serveProc{frozen, replacement}, []*hookConsumer{c}, len(ids))
	tally := checkNoneLost(t, db, ids, []*hookConsumer{c}, faultExpect{InFlight: inFlight})

	// Every stream's first arrivals, and its first 2xx answers (what a consumer applies), in
	// the consumer's arrival order.
	reqs := c.requests()
	slices.SortFunc(reqs, func(a, b *hookRequest) int { return a.N - b.N })
	for _, okOnly := range []bool{false, true} {
		seen := map[string]bool{}
		next := map[string]int{}
		var out []string
		for _, r := range reqs {
			if seen[r.DeliveryID] || okOnly && (r.Status < 200 || r.Status > 299) {
				continue
			}
			seen[r.DeliveryID] = true
			var ev struct {
				Stream string `json:"stream"`
				Seq    int    `json:"seq"`
			}
			if err := json.Unmarshal(r.Body, &ev); err != nil {
				t.Fatalf("payload %s: %v", r.Body, err)
			}
			if ev.Seq != next[ev.Stream] {
				out = append(out, fmt.Sprintf("%s: event %d came first when %d was next", ev.Stream, ev.Seq, next[ev.Stream]))
			}
			next[ev.Stream] = ev.Seq + 1
		}
		what := "arrivals"
		if okOnly {
			what = "2xx answers"
		}
		if len(out) > 0 {
			t.Errorf("first %s out of order %d times: %v", what, len(out), out)
		}
		for s := range streams {
			if n := next[fmt.Sprintf("s%d", s)]; n != perStream {
				t.Errorf("stream s%d: first %s stopped at event %d of %d", s, what, n, perStream)
			}
		}
	}
	t.Logf("%s; %d rows in flight at the two faults", tally, len(inFlight))
	frozen.stopCleanly()
	replacement.stopCleanly()
}
