package send

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/stages/delivery"
)

// A freed slot wakes the request that has waited longest: with no other request arriving to
// take it first, the waiters are served in order, and none is released while it waits.
func TestFreedSlotWakesWaitersInOrder(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan string, 3)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Test-Id")
		arrived <- id
		if id == "first" {
			<-release
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	s, err := New(Config{EndpointConcurrency: 1, RowURLNetworks: loopbackNetworks}) // a row URL to a loopback test server
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.slotWait = time.Minute // the waits end when a slot frees here, never by timeout
	ep, err := s.Endpoint(srv.URL + "/hook")
	if err != nil {
		t.Fatal(err)
	}
	newDelivery := func(id string) *delivery.Delivery {
		return &delivery.Delivery{Endpoint: ep, Payload: []byte(`{}`), Header: http.Header{"X-Test-Id": {id}}}
	}
	waiters := func() int {
		s.inflightMu.Lock()
		defer s.inflightMu.Unlock()
		if l := s.inflight[ep.Key]; l != nil {
			return len(l.waiters)
		}
		return 0
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}

	ds := map[string]*delivery.Delivery{"first": newDelivery("first"), "second": newDelivery("second"), "third": newDelivery("third")}
	var wg sync.WaitGroup
	wg.Go(func() { s.Send(context.Background(), ds["first"]) })
	if id := <-arrived; id != "first" {
		t.Fatalf("first request to arrive: %q", id)
	}
	wg.Go(func() { s.Send(context.Background(), ds["second"]) })
	eventually("the second request to queue", func() bool { return waiters() == 1 })
	wg.Go(func() { s.Send(context.Background(), ds["third"]) })
	eventually("the third request to queue", func() bool { return waiters() == 2 })

	close(release)
	wg.Wait()
	for _, want := range []string{"second", "third"} {
		if got := <-arrived; got != want {
			t.Fatalf("after the first request finished, %q arrived; want %q (waiters in order)", got, want)
		}
	}
	for id, d := range ds {
		if d.Outcome.Kind != delivery.Delivered {
			t.Errorf("%s: outcome %+v, want delivered", id, d.Outcome)
		}
	}
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	if l := s.inflight[ep.Key]; l != nil {
		t.Errorf("endpoint still holds %d slots and %d waiters after every request finished", l.inflight, len(l.waiters))
	}
}

// Many workers racing for one slot, some giving up (a short wait, a cancelled context) while
// others are being woken: the limit must hold throughout, and the books must balance, with
// every slot and waiter gone at the end and no release ever finding its endpoint forgotten.
// It drives acquire and release directly, so that "in flight" is exactly the time a worker
// holds a slot.
func TestSlotAccountingUnderContention(t *testing.T) {
	t.Parallel()
	s, err := New(Config{EndpointConcurrency: 1, RowURLNetworks: loopbackNetworks}) // a row URL to a loopback test server
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.slotWait = 200 * time.Microsecond
	const key = "k"
	var holding, most, taken, refused atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 2000 {
				ctx, cancel := context.WithCancel(context.Background())
				if (w+i)%5 == 0 {
					cancel()
				}
				if !s.acquire(ctx, key, s.cfg.EndpointConcurrency) {
					refused.Add(1)
					cancel()
					continue
				}
				taken.Add(1)
				h := holding.Add(1)
				for m := most.Load(); h > m && !most.CompareAndSwap(m, h); m = most.Load() {
				}
				if i%3 == 0 {
					time.Sleep(20 * time.Microsecond)
				}
				holding.Add(-1)
				s.release(key)
				cancel()
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m > 1 {
		t.Errorf("%d workers held the endpoint's one slot at once", m)
	}
	if taken.Load() == 0 || refused.Load() == 0 {
		t.Errorf("taken %d, refused %d: the test did not exercise both outcomes", taken.Load(), refused.Load())
	}
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	for key, l := range s.inflight {
		t.Errorf("endpoint %q left with %d in flight, %d queued, %d woken", key, l.inflight, len(l.waiters), l.woken)
	}
}
