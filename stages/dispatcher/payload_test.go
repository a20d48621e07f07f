package dispatcher_test

import (
	"context"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
)

// TestOversizePayloadsAreNeverRead: events whose payload is far over WEBHOOK_MAX_PAYLOAD_BYTES
// are dead-lettered with the reason (their size, the limit and the setting), both the row
// kept for WEBHOOK_URL and the delivery routed to a managed endpoint, without their bodies
// ever reaching the dispatcher, neither from the claim nor from the route statement:
// everything the process allocates while it claims, routes and dead-letters eight 24 MiB
// events stays below a quarter of their size (reading them whole allocated several times
// their size, and a batch of larger rows could kill the dispatcher before any was
// dead-lettered, each claimed again after its lease). A small event beside them is delivered
// to both. Not parallel: the allocation count is the whole process's, so this test runs alone.
func TestOversizePayloadsAreNeverRead(t *testing.T) {
	const rows, size = 8, 24 << 20
	b := setup(t)
	c := newConsumer(t, nil)
	ep := newConsumer(t, nil)
	b.addEndpoint(endpoints.New{URL: ep.URL()})
	cfg := b.config(c.URL())
	cfg.EncryptionKey = testKey
	cfg.MaxPayloadBytes = 1 << 20
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload)
		SELECT 'huge', jsonb_build_object('i', i, 'pad', repeat('x', $1)) FROM generate_series(1, $2) i`, size, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES ('fine', '{"ok": true}')`); err != nil {
		t.Fatal(err)
	}
	allocs := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(allocs)
	before := allocs[0].Value.Uint64()
	allocated := func() uint64 {
		metrics.Read(allocs)
		return allocs[0].Value.Uint64() - before
	}
	const bound = rows * size / 4
	b.start(cfg)
	// Until every row is settled, or as soon as the bound is crossed: a dispatcher that reads
	// the bodies fails here at once, rather than after its slow way through them.
	eventually(t, 60*time.Second, "every outbox row settled, or the allocation bound crossed", func() bool {
		return allocated() >= bound || b.count("SELECT count(*) FROM webhook_deliveries WHERE NOT processed") == 0
	})
	if a := allocated(); a >= bound {
		t.Fatalf("the process allocated %d MiB while dead-lettering %d rows of %d MiB; want under %d MiB (their bodies were read)",
			a>>20, rows, size>>20, bound>>20)
	} else {
		t.Logf("allocated %d MiB while the dispatcher ran", a>>20)
	}
	for name, c := range map[string]*consumer{"WEBHOOK_URL": c, "the managed endpoint": ep} {
		if got := c.arrivals(); len(got) != 1 || got[0].Event != "fine" {
			t.Errorf("%s got %d requests; want only the small event's", name, len(got))
		}
	}
	reasons, err := b.pool.Query(ctx, `SELECT reason FROM webhook_dead_letter WHERE event_type = 'huge'`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for reasons.Next() {
		var r string
		if err := reasons.Scan(&r); err != nil {
			t.Fatal(err)
		}
		n++
		if !strings.Contains(r, "over the limit of 1048576 (WEBHOOK_MAX_PAYLOAD_BYTES)") || !strings.Contains(r, "invalid row: payload is 251658") {
			t.Errorf("dead letter reason %q; want the payload's size, the limit and WEBHOOK_MAX_PAYLOAD_BYTES", r)
		}
	}
	if err := reasons.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 2*rows {
		t.Errorf("%d dead letters of the oversize events; want %d (WEBHOOK_URL's and the endpoint's)", n, 2*rows)
	}
}

// TestOversizeEventRoutedInMemoryIsDeadLettered: an event over WEBHOOK_MAX_PAYLOAD_BYTES
// routed in memory gives each of its deliveries the claim's reason: its endpoint's delivery
// is dead-lettered with it (the body was never read, so there is nothing to send), and the
// endpoint receives nothing.
func TestOversizeEventRoutedInMemoryIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ep := newConsumer(t, nil)
	added := b.addEndpoint(endpoints.New{URL: ep.URL()})
	b.addWarmUp()
	cfg := b.config("")
	cfg.EncryptionKey = testKey
	cfg.MaxPayloadBytes = 1024
	d := b.start(cfg)
	b.warmUp(d)
	routed := d.Stats().RoutedInMemory.Load()
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_outbox (event_type, payload)
		VALUES ('huge', jsonb_build_object('pad', repeat('x', 10000)))`); err != nil {
		t.Fatal(err)
	}
	b.waitSettled(10 * time.Second)
	if got := d.Stats().RoutedInMemory.Load(); got != routed+1 {
		t.Fatalf("%d events routed in memory; want the oversize one", got-routed)
	}
	if got := ep.arrivals(); len(got) != 0 {
		t.Errorf("the endpoint got %d requests; want none", len(got))
	}
	var reason string
	if err := b.pool.QueryRow(context.Background(), `SELECT reason FROM webhook_dead_letter
		WHERE event_type = 'huge' AND endpoint_id = $1`, added.ID).Scan(&reason); err != nil {
		t.Fatalf("the endpoint's dead letter: %v", err)
	}
	if !strings.HasPrefix(reason, "invalid row: payload is 10011 bytes as JSON text") ||
		!strings.Contains(reason, "over the limit of 1024 (WEBHOOK_MAX_PAYLOAD_BYTES)") {
		t.Errorf("dead letter reason %q; want the payload's size, the limit and WEBHOOK_MAX_PAYLOAD_BYTES", reason)
	}
}
