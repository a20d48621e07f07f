package dispatcher

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestLivenessWithEverySlotHeldByASlowRequest runs a dispatcher whose one slot is taken by a
// request that hangs, so the claiming loop waits for capacity and does not go round. Its clock
// is moved forward rather than waited on: past three poll intervals plus 30 s, which a limit
// ignoring the request timeout took for a stuck loop, /livez still answers 200, because a
// request may legitimately take the whole timeout; once the loop has been still for longer
// than any request can hold it, it is stuck, and /livez answers 503.
func TestLivenessWithEverySlotHeldByASlowRequest(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	arrived := make(chan struct{}, 1)
	consumer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read to the end: only then does the server notice the client going away.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-r.Context().Done() // hangs until the dispatcher gives up on it
	}))
	t.Cleanup(consumer.Close)

	const poll, timeout = 100 * time.Millisecond, 10 * time.Minute
	d, err := New(Config{
		DatabaseURL:  db.URL,
		DefaultURL:   consumer.URL + "/hook",
		Secret:       "test-secret",
		PollInterval: poll,
		Timeout:      timeout,
		MaxInFlight:  1,
	})
	if err != nil {
		t.Fatal(err)
	}
	var skew atomic.Int64
	d.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The request hangs for the whole timeout: cut the drain short at once.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = d.Stop(ctx)
	})
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	livez := func() int {
		t.Helper()
		resp, err := http.Get(srv.URL + "/livez")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	if _, err := outbox.Enqueue(context.Background(), db.Pool, outbox.Event{EventType: "test.slow", Payload: map[string]int{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(15 * time.Second):
		t.Fatal("the request never arrived")
	}
	// Wait until the loop is parked on the full slot: its last round is then fixed.
	deadline := time.Now().Add(15 * time.Second)
	for d.slots.Free() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the slot was never taken")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code := livez(); code != http.StatusOK {
		t.Fatalf("/livez right after the request started: %d, want 200", code)
	}

	// Past the old limit (3 poll intervals + 30 s), well within the request timeout.
	skew.Store(int64(3*poll + 30*time.Second + time.Minute))
	if code := livez(); code != http.StatusOK {
		t.Errorf("/livez with the loop waiting on a request within its timeout: %d, want 200", code)
	}

	// Longer than any request can hold the loop: stuck.
	skew.Store(int64(d.liveLimit() + time.Minute))
	if code := livez(); code != http.StatusServiceUnavailable {
		t.Errorf("/livez with the loop still for longer than the limit %s: %d, want 503", d.liveLimit(), code)
	}
	if err := d.Live(); err == nil {
		t.Errorf("Live() = nil for a stuck loop")
	}
}
