package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/receiver"
)

// Each (event, endpoint) delivery counts once: repeats are duplicates, and arrivals on /hook,
// on a path beyond the endpoints or for an event that was not enqueued are unexpected.
func TestBenchFanoutArrivals(t *testing.T) {
	t.Parallel()
	a, b, c := [16]byte{1}, [16]byte{2}, [16]byte{3}
	arr := []arrivalRecord{
		{id: a, ep: 1, ns: 10}, {id: a, ep: 2, ns: 12}, {id: b, ep: 1, ns: 30}, {id: b, ep: 1, ns: 20}, // b@1 twice
		{id: a, ep: 0, ns: 5}, // /hook
		{id: c, ep: 1, ns: 7}, // not enqueued
		{id: b, ep: 3, ns: 9}, // no such endpoint
	}
	first, dups, unexpected := fanoutArrivals(arr, [][16]byte{a, b}, 2)
	if len(first) != 3 || dups != 1 || unexpected != 3 {
		t.Errorf("fanoutArrivals: %d deliveries, %d duplicates, %d unexpected; want 3, 1, 3", len(first), dups, unexpected)
	}
	if first[arrivalKey{b, 1}] != 20 {
		t.Errorf("b@1 first arrived at %d, want the earlier of its two arrivals, 20", first[arrivalKey{b, 1}])
	}
	if _, ok := first[arrivalKey{b, 2}]; ok {
		t.Error("b@2 never arrived but is counted")
	}
}

// The consumer verifies each endpoint's path with that endpoint's secret alone: a delivery
// signed with another endpoint's secret is rejected, not counted, and each arrival records
// the path it came on, through the consumer's wire format.
func TestBenchConsumerPerEndpointSecrets(t *testing.T) {
	t.Parallel()
	log := &arrivalLog{}
	srv := httptest.NewServer(benchConsumerMux("hook-secret", []string{"secret-0", "secret-1"}, log))
	defer srv.Close()
	const id = "0190a6c2-7b1e-7d3a-9f00-1234567890ab"
	post := func(path, secret string) int {
		t.Helper()
		body := `{"seq":1}`
		ts := time.Now().Unix()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set(receiver.HeaderDeliveryID, id)
		req.Header.Set(receiver.HeaderTimestamp, strconv.FormatInt(ts, 10))
		req.Header.Set(receiver.HeaderEvent, fanoutEventType)
		req.Header.Set(receiver.HeaderSignature, receiver.Signature(secret, ts, []byte(body)))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, secret string
		want         int
	}{
		{fanoutPath(1), "secret-1", http.StatusNoContent},
		{fanoutPath(0), "secret-0", http.StatusNoContent},
		{fanoutPath(1), "secret-0", http.StatusUnauthorized}, // endpoint 0's secret on endpoint 1's path
		{"/hook", "secret-1", http.StatusUnauthorized},
		{"/hook", "hook-secret", http.StatusNoContent},
		{fanoutPath(2), "secret-1", http.StatusNotFound}, // no third endpoint
	} {
		if got := post(tc.path, tc.secret); got != tc.want {
			t.Errorf("POST %s signed with %s: %d, want %d", tc.path, tc.secret, got, tc.want)
		}
	}
	c := &consumerProc{base: srv.URL, client: srv.Client()}
	st, err := c.stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Received != 3 || st.Rejected != 2 {
		t.Errorf("stats = %+v, want 3 received and 2 rejected", st)
	}
	arr, err := c.arrivals(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want, _ := parseUUID(id)
	var eps []uint16
	for _, a := range arr {
		if a.id != want || a.ns == 0 {
			t.Errorf("arrival %+v, want delivery %s with its time", a, id)
		}
		eps = append(eps, a.ep)
	}
	if len(eps) != 3 || eps[0] != 2 || eps[1] != 1 || eps[2] != 0 {
		t.Errorf("arrivals on paths %v, want [2 1 0] (/ep/1, /ep/0, /hook)", eps)
	}
	if n := uniqueCount(arr); n != 3 {
		t.Errorf("uniqueCount = %d, want 3: one event, three paths", n)
	}
}

// The fanout workload's checks: deliveries per second, at most one route statement per
// claimed batch with events (none when routed in memory; not computed without
// pg_stat_statements), and every delivery exactly once.
func TestBenchFanoutChecks(t *testing.T) {
	t.Parallel()
	one, two, zero := 1.0, 2.0, 0.0
	calls, none := int64(20), int64(0)
	idle := &fanoutIdleResult{Events: 10, Deliveries: 100, PerDelivery: percentiles{N: 100, P50: 1.8}}
	for _, tc := range []struct {
		name   string
		f      fanoutResult
		status map[string]string
		reason string
	}{
		{
			name: "met",
			f: fanoutResult{Endpoints: 10, Events: 200, Deliveries: 2000, Received: 2000, Seconds: 0.1, DeliveriesPerSecond: 20000,
				Routing: fanoutRouting{BatchesWithEvents: 20, RouteStatements: &calls, ClaimStatements: &calls, RouteStatementsPerBatch: &one}, Idle: idle},
			status: map[string]string{"200 events × 10 endpoints drained": checkMet, fanoutRouteCheck: checkMet, fanoutOnceCheck: checkMet,
				fanoutIdleCheck: checkMet, fanoutIdleOnce: checkMet},
		},
		{
			name: "met",
			f: fanoutResult{Endpoints: 10, Events: 200, Deliveries: 2000, Received: 2000, Seconds: 0.1, DeliveriesPerSecond: 20000,
				Routing: fanoutRouting{BatchesWithEvents: 20, RouteStatements: &none, ClaimStatements: &calls, RouteStatementsPerBatch: &zero}},
			status: map[string]string{"200 events × 10 endpoints drained": checkMet, fanoutRouteCheck: checkMet, fanoutOnceCheck: checkMet},
		},
		{
			name: "two route statements per batch, a duplicate, slow",
			f: fanoutResult{Endpoints: 10, Events: 200, Deliveries: 2000, Received: 2000, Duplicates: 1, Seconds: 0.2, DeliveriesPerSecond: 10000,
				Routing: fanoutRouting{BatchesWithEvents: 10, RouteStatements: &calls, ClaimStatements: &calls, RouteStatementsPerBatch: &two}},
			status: map[string]string{"200 events × 10 endpoints drained": checkMissed, fanoutRouteCheck: checkMissed, fanoutOnceCheck: checkMissed},
		},
		{
			name: "no pg_stat_statements, nothing arrived",
			f: fanoutResult{Endpoints: 10, Events: 200, Deliveries: 2000, Lost: 2000,
				Routing: fanoutRouting{BatchesWithEvents: 20, Unavailable: "pg_stat_database only (pg_stat_statements is not in shared_preload_libraries)"}},
			status: map[string]string{"200 events × 10 endpoints drained": checkNotComputed, fanoutRouteCheck: checkNotComputed, fanoutOnceCheck: checkMissed},
			reason: "pg_stat_statements is not in shared_preload_libraries",
		},
	} {
		r := &benchReport{Fanout: &tc.f}
		r.check()
		got := map[string]string{}
		for _, c := range r.Budget {
			got[c.What] = c.Status
			if c.What == fanoutRouteCheck && tc.reason != "" && c.Reason != tc.reason {
				t.Errorf("%s: route check's reason %q, want %q", tc.name, c.Reason, tc.reason)
			}
		}
		if len(got) != len(tc.status) {
			t.Errorf("%s: checks %v, want %v", tc.name, got, tc.status)
		}
		for what, want := range tc.status {
			if got[what] != want {
				t.Errorf("%s: %s is %q, want %q", tc.name, what, got[what], want)
			}
		}
		if r.BudgetMet != (tc.name == "met") {
			t.Errorf("%s: budget met %v", tc.name, r.BudgetMet)
		}
	}
}
