package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/deadletters"
	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/stages/dispatcher"
)

// streamEvent is the payload of the ordering tests' events: its stream and its place in it.
type streamEvent struct {
	Stream string `json:"stream"`
	Seq    int    `json:"seq"`
}

// streamWatch wraps a consumer's answers to check what ordering promises while requests
// arrive: no two requests of one stream at once.
type streamWatch struct {
	mu       sync.Mutex
	inFlight map[string]int
	overlaps []string
}

func (w *streamWatch) wrap(respond func(a arrival, ev streamEvent, w http.ResponseWriter)) func(a arrival, rw http.ResponseWriter) {
	return func(a arrival, rw http.ResponseWriter) {
		var ev streamEvent
		_ = json.Unmarshal(a.Body, &ev)
		w.mu.Lock()
		if w.inFlight[ev.Stream] > 0 {
			w.overlaps = append(w.overlaps, fmt.Sprintf("%s#%d", ev.Stream, ev.Seq))
		}
		w.inFlight[ev.Stream]++
		w.mu.Unlock()
		respond(a, ev, rw)
		w.mu.Lock()
		w.inFlight[ev.Stream]--
		w.mu.Unlock()
	}
}

// insertSeqs commits the events seq from to to of stream, in one transaction, in seq order.
func (b *bundle) insertSeqs(stream string, from, to int) {
	b.t.Helper()
	if _, err := b.pool.Exec(context.Background(), `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		SELECT $1, 'stream.updated', jsonb_build_object('stream', $1::text, 'seq', i)
		FROM generate_series($2::int, $3::int) i ORDER BY i`, stream, from, to); err != nil {
		b.t.Fatal(err)
	}
}

// insertStreams commits streams × perStream events, interleaved across streams (round robin,
// a few events per transaction), each with its stream and place in the payload.
func (b *bundle) insertStreams(prefix string, streams, perStream int) {
	b.t.Helper()
	ctx := context.Background()
	for seq := range perStream {
		for s := 0; s < streams; s += 4 {
			var rows []string
			for k := s; k < min(s+4, streams); k++ {
				rows = append(rows, fmt.Sprintf(`('%s%d', 'stream.updated', '{"stream": "%s%d", "seq": %d}')`, prefix, k, prefix, k, seq))
			}
			if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload) VALUES `+strings.Join(rows, ", ")); err != nil {
				b.t.Fatal(err)
			}
		}
	}
}

// checkStreamOrder checks that each stream's first successful arrivals (by delivery id; failed
// says which arrivals the consumer refused) came in the order of their places, and returns how
// many distinct events arrived per stream.
func checkStreamOrder(t *testing.T, c *consumer, managed bool, failed func(arrival) bool) map[string]int {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	n := map[string]int{}
	for _, a := range c.arrivals() {
		if a.VerifyErr != nil && !managed { // a managed endpoint signs with its own secret
			t.Errorf("a request does not verify: %v", a.VerifyErr)
		}
		if seen[a.DeliveryID] || failed != nil && failed(a) {
			continue
		}
		seen[a.DeliveryID] = true
		var ev streamEvent
		if err := json.Unmarshal(a.Body, &ev); err != nil {
			t.Fatalf("payload %s: %v", a.Body, err)
		}
		if prev, ok := last[ev.Stream]; ok && ev.Seq <= prev {
			t.Errorf("stream %s: event %d arrived first after event %d", ev.Stream, ev.Seq, prev)
		}
		last[ev.Stream] = ev.Seq
		n[ev.Stream]++
	}
	return n
}

// failsFirst decides a deterministic share of deliveries that fail their first attempt.
func failsFirst(a arrival, oneIn uint32) bool {
	h := fnv.New32a()
	h.Write([]byte(a.DeliveryID))
	return a.Attempt == "1" && h.Sum32()%oneIn == 0
}

// TestOrderedStreams: with WEBHOOK_ORDERING=stream, each stream's events reach the consumer one
// at a time and in order, while a third of them fail their first attempt and are retried;
// nothing is lost.
func TestOrderedStreams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var watch streamWatch
	watch.inFlight = map[string]int{}
	c := newConsumer(t, watch.wrap(func(a arrival, ev streamEvent, w http.ResponseWriter) {
		if failsFirst(a, 3) {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	cfg := b.config(c.URL())
	cfg.Ordering = true
	cfg.RetrySchedule = []time.Duration{50 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond}
	b.start(cfg)
	const streams, perStream = 24, 8
	b.insertStreams("s", streams, perStream)
	b.waitSettled(60 * time.Second)
	got := checkStreamOrder(t, c, false, func(a arrival) bool { return failsFirst(a, 3) })
	for s := range streams {
		if n := got[fmt.Sprintf("s%d", s)]; n != perStream {
			t.Errorf("stream s%d: %d events arrived, want %d", s, n, perStream)
		}
	}
	if len(watch.overlaps) > 0 {
		t.Errorf("requests of one stream overlapped at %v", watch.overlaps)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE attempt > 1`); n == 0 {
		t.Error("no event was retried: the test did not exercise retries")
	}
	if !b.streamIndexValid() {
		t.Error("WEBHOOK_ORDERING=stream did not create the stream index")
	}
	if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

// TestOrderedEndpoint: an endpoint with ordering 'stream' receives each stream in order, while
// an unordered endpoint subscribed to the same events receives them all as well.
func TestOrderedEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var watch streamWatch
	watch.inFlight = map[string]int{}
	ordered := newConsumer(t, watch.wrap(func(a arrival, ev streamEvent, w http.ResponseWriter) {
		if failsFirst(a, 4) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	plain := newConsumer(t, nil)
	oep := b.addEndpoint(endpoints.New{URL: ordered.URL()})
	b.addEndpoint(endpoints.New{URL: plain.URL()})
	if _, err := b.pool.Exec(context.Background(), `UPDATE webhook_endpoints SET ordering = 'stream' WHERE id = $1`, oep.ID); err != nil {
		t.Fatal(err)
	}
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	cfg.RetrySchedule = []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}
	b.start(cfg)
	const streams, perStream = 16, 6
	b.insertStreams("e", streams, perStream)
	b.waitSettled(60 * time.Second)
	got := checkStreamOrder(t, ordered, true, func(a arrival) bool { return failsFirst(a, 4) })
	for s := range streams {
		if n := got[fmt.Sprintf("e%d", s)]; n != perStream {
			t.Errorf("ordered endpoint, stream e%d: %d events arrived, want %d", s, n, perStream)
		}
	}
	if len(watch.overlaps) > 0 {
		t.Errorf("requests of one stream overlapped at %v", watch.overlaps)
	}
	if n := len(plain.byDelivery()); n != streams*perStream {
		t.Errorf("the unordered endpoint received %d events, want %d", n, streams*perStream)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND order_key IS NULL`, oep.ID); n != 0 {
		t.Errorf("%d of the ordered endpoint's deliveries carry no order key", n)
	}
	eventually(t, 30*time.Second, "the stream index built once an endpoint orders", b.streamIndexValid)
}

// TestFailingStreamSkips: a stream whose head keeps failing holds only itself: every other
// stream is delivered while it retries, and once its head is dead-lettered (saying it was
// skipped) the stream's later events follow, in order.
func TestFailingStreamSkips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		var ev streamEvent
		_ = json.Unmarshal(a.Body, &ev)
		if ev.Stream == "bad" && ev.Seq == 0 {
			select { // the head fails only once the others are all in
			case <-release:
			case <-a.Ctx.Done():
			}
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	cfg := b.config(c.URL())
	cfg.Ordering = true
	cfg.RetrySchedule = []time.Duration{50 * time.Millisecond}
	cfg.Timeout = 60 * time.Second // the head's first attempt waits for the other streams
	b.start(cfg)
	ctx := context.Background()
	for seq := range 4 {
		if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
			VALUES ('bad', 'stream.updated', jsonb_build_object('stream', 'bad', 'seq', $1::int))`, seq); err != nil {
			t.Fatal(err)
		}
	}
	b.insertStreams("ok", 10, 5)
	eventually(t, 30*time.Second, "every other stream delivered", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE processed AND stream_id LIKE 'ok%'`) == 50
	})
	for _, a := range c.arrivals() {
		var ev streamEvent
		_ = json.Unmarshal(a.Body, &ev)
		if ev.Stream == "bad" && ev.Seq != 0 {
			t.Fatalf("stream bad's event %s arrived while its head was in flight", a.Body)
		}
	}
	close(release)
	eventually(t, 30*time.Second, "stream bad delivered after its head's dead letter", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE NOT processed`) == 0
	})
	got := checkStreamOrder(t, c, false, nil)
	if got["bad"] != 4 {
		t.Errorf("stream bad: %d events arrived, want 4 (its head and the 3 after it)", got["bad"])
	}
	var reason string
	if err := b.pool.QueryRow(ctx, `SELECT reason FROM webhook_dead_letter WHERE stream_id = 'bad'`).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, `skipped in stream "bad"'s order`) {
		t.Errorf("dead letter reason %q does not say the stream went on without it", reason)
	}
}

// TestFailingStreamStops: with WEBHOOK_ORDERING_FAILURE=stop, a dead-lettered head stops its
// stream (other streams go on) until it is replayed; the replay goes first.
func TestFailingStreamStops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	failing := true
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		mu.Lock()
		defer mu.Unlock()
		if failing && strings.Contains(string(a.Body), `"stop"`) {
			w.WriteHeader(http.StatusGone) // permanent: dead-lettered at once
		}
	})
	cfg := b.config(c.URL())
	cfg.Ordering, cfg.OrderingStop = true, true
	b.start(cfg)
	ctx := context.Background()
	for seq := range 3 {
		if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
			VALUES ('stop', 'stream.updated', jsonb_build_object('stream', 'stop', 'seq', $1::int))`, seq); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the stream's head dead-lettered", func() bool {
		return b.count(`SELECT count(*) FROM webhook_dead_letter WHERE stream_id = 'stop'`) == 1
	})
	// Evidence that the dispatcher claimed after the head stopped its stream: an event of
	// another stream, inserted now, arrives.
	b.insertStreams("other", 1, 1)
	eventually(t, 30*time.Second, "another stream's event delivered", func() bool {
		return b.count(`SELECT count(*) FROM webhook_deliveries WHERE processed AND stream_id = 'other0'`) == 1
	})
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE stream_id = 'stop' AND processed`); n != 0 {
		t.Fatalf("%d of the stopped stream's rows settled; want none (its later events wait)", n)
	}
	if n := b.count(`SELECT count(*) FROM webhook_deliveries WHERE stream_id = 'stop' AND created_at = 'infinity'
		AND deferred_reason LIKE 'stream stopped: %'`); n != 1 {
		t.Fatalf("%d parked rows, want the stopped head", n)
	}
	// Replay, as `fluxhook dlq replay` does: the parked row is settled and the dead letter
	// re-enqueued with its order key, in one statement.
	mu.Lock()
	failing = false
	mu.Unlock()
	if _, err := b.pool.Exec(ctx, `WITH dl AS (
			UPDATE webhook_dead_letter SET replayed_at = now() WHERE stream_id = 'stop' RETURNING *
		), unpark AS (
			UPDATE webhook_outbox SET processed = true, processed_at = now() WHERE id = (SELECT outbox_id FROM dl)
		)
		INSERT INTO webhook_outbox (delivery_id, stream_id, event_type, payload, enqueued_at, order_key)
		SELECT delivery_id, stream_id, event_type, payload, enqueued_at, order_key FROM dl`); err != nil {
		t.Fatal(err)
	}
	b.waitSettled(30 * time.Second)
	var order []string
	for _, a := range c.arrivals() {
		if strings.Contains(string(a.Body), `"stop"`) {
			var ev streamEvent
			_ = json.Unmarshal(a.Body, &ev)
			order = append(order, fmt.Sprint(ev.Seq))
		}
	}
	if got := strings.Join(order, ","); got != "0,0,1,2" {
		t.Errorf("the stopped stream's arrivals were %s, want 0 (refused), 0 (replayed), 1, 2", got)
	}
}

// TestOrderedHoldBack: a producer transaction that drew a smaller id of a stream and has not
// committed holds back the stream's later event, committed by another transaction, until it
// ends; then both arrive, the smaller id first. Unordered rows are not held back.
func TestOrderedHoldBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	cfg := b.config(c.URL())
	cfg.Ordering = true
	b.start(cfg)
	ctx := context.Background()
	slow, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	if _, err := slow.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		VALUES ('h', 'stream.created', '{"stream": "h", "seq": 0}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		VALUES ('h', 'stream.updated', '{"stream": "h", "seq": 1}')`); err != nil {
		t.Fatal(err)
	}
	// An unordered event committed after both: its arrival shows a claim saw seq 1.
	unordered := b.enqueue(outbox.Event{EventType: "test.unordered"})
	eventually(t, 30*time.Second, "the unordered event delivered", func() bool {
		return len(c.byDelivery()[unordered]) > 0
	})
	for _, a := range c.arrivals() {
		if strings.Contains(string(a.Body), `"h"`) {
			t.Fatalf("stream h's event %s arrived while an older producer transaction was open", a.Body)
		}
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.waitSettled(30 * time.Second)
	if got := checkStreamOrder(t, c, false, nil); got["h"] != 2 {
		t.Errorf("stream h: %d events arrived, want 2", got["h"])
	}
}

// TestOrderedEndpointAtStart: a dispatcher that starts with an ordered endpoint's deliveries
// already waiting orders them from its first claim (its endpoints are loaded before it claims).
func TestOrderedEndpointAtStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := newConsumer(t, nil)
	ep := b.addEndpoint(endpoints.New{URL: c.URL()})
	ctx := context.Background()
	// The stream's second event is older by due time and first by id: an unordered claim
	// would take it first.
	if _, err := b.pool.Exec(ctx, `UPDATE webhook_endpoints SET ordering = 'stream' WHERE id = $1`, ep.ID); err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct {
		seq, key int
		age      string
	}{{1, 2, "2 seconds"}, {0, 1, "1 second"}} {
		if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key, created_at)
			VALUES ('st', 'stream.updated', jsonb_build_object('stream', 'st', 'seq', $1::int), $2, now(), $3, now() - $4::interval)`,
			row.seq, ep.ID, row.key, row.age); err != nil {
			t.Fatal(err)
		}
	}
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	b.start(cfg)
	b.waitSettled(30 * time.Second)
	if got := checkStreamOrder(t, c, true, nil); got["st"] != 2 {
		t.Errorf("stream st: %d events arrived, want 2", got["st"])
	}
}

// streamIndexValid reports whether ordered delivery's index exists and is valid.
func (b *bundle) streamIndexValid() bool {
	return b.count(`SELECT count(*) FROM pg_index WHERE indexrelid = to_regclass('webhook_outbox_stream_idx') AND indisvalid`) == 1
}

// TestOrderedDefaultBesideEndpoints: with WEBHOOK_ORDERING=stream and managed endpoints, the
// events kept for WEBHOOK_URL after routing are ordered there (routing leaves them for a claim
// to take as heads), while an unordered endpoint gets every event as well.
func TestOrderedDefaultBesideEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var watch streamWatch
	watch.inFlight = map[string]int{}
	def := newConsumer(t, watch.wrap(func(a arrival, ev streamEvent, w http.ResponseWriter) {
		if failsFirst(a, 3) {
			w.WriteHeader(http.StatusBadGateway)
		}
	}))
	plain := newConsumer(t, nil)
	b.addEndpoint(endpoints.New{URL: plain.URL()})
	cfg := b.config(def.URL())
	cfg.EncryptionKey = testKey
	cfg.Ordering = true
	cfg.RetrySchedule = []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}
	b.start(cfg)
	const streams, perStream = 12, 6
	b.insertStreams("d", streams, perStream)
	b.waitSettled(60 * time.Second)
	got := checkStreamOrder(t, def, false, func(a arrival) bool { return failsFirst(a, 3) })
	for s := range streams {
		if n := got[fmt.Sprintf("d%d", s)]; n != perStream {
			t.Errorf("default consumer, stream d%d: %d events arrived, want %d", s, n, perStream)
		}
	}
	if len(watch.overlaps) > 0 {
		t.Errorf("requests of one stream overlapped at %v", watch.overlaps)
	}
	if n := len(plain.byDelivery()); n != streams*perStream {
		t.Errorf("the unordered endpoint received %d events, want %d", n, streams*perStream)
	}
}

// TestOrderingChecksTheOutboxIDs: the hold-back assumes ids drawn one at a time by the
// sequence. With a sequence cache above 1, a dispatcher under WEBHOOK_ORDERING=stream refuses
// to start, naming the fix; an ordered row keyed beyond the sequence (an id a producer chose)
// is counted in ordered_rows_beyond_sequence as soon as an endpoint orders, instead of
// waiting unseen.
func TestOrderingChecksTheOutboxIDs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := newConsumer(t, nil)
	if _, err := b.pool.Exec(ctx, `ALTER SEQUENCE webhook_outbox_id_seq CACHE 20`); err != nil {
		t.Fatal(err)
	}
	cfg := b.config(c.URL())
	cfg.Ordering = true
	d, err := dispatcher.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Start(ctx)
	if err == nil {
		_ = d.Stop(ctx)
		t.Fatal("a dispatcher ordering streams started with the outbox's sequence caching 20 ids")
	}
	if !strings.Contains(err.Error(), "CACHE 20") || !strings.Contains(err.Error(), "ALTER SEQUENCE webhook_outbox_id_seq CACHE 1") {
		t.Errorf("refusal %q; want it to name the cache and the fix", err)
	}
	if _, err := b.pool.Exec(ctx, `ALTER SEQUENCE webhook_outbox_id_seq CACHE 1`); err != nil {
		t.Fatal(err)
	}

	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Ordering: endpoints.OrderingStream})
	if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (id, stream_id, event_type, payload, endpoint_id, routed_at, order_key)
		VALUES (1000000, 's', 't.far', '{}', $1, now(), 1000000)`, ep.ID); err != nil {
		t.Fatal(err)
	}
	cfg = b.config("")
	cfg.EncryptionKey = testKey
	d = b.start(cfg)
	if got, _ := metricValue(t, d.Registry(), "fluxora_webhook_ordered_rows_beyond_sequence", nil); got != 1 {
		t.Errorf("ordered_rows_beyond_sequence = %v, want 1 (the row keyed 1000000)", got)
	}
}

// TestOrderedEndpointHoldBack: the hold-back applies to a managed endpoint that orders streams
// as it does to WEBHOOK_ORDERING (TestOrderedHoldBack). A producer transaction that drew a
// smaller id of a stream and has not committed (a plain INSERT in an open transaction, as
// producers write) holds back the endpoint's delivery of the stream's later event, committed
// by another transaction and already routed, until it ends; then both arrive, the smaller id
// first. Otherwise the later event goes, and the earlier one, once committed, arrives after
// it: the stream went backwards.
func TestOrderedEndpointHoldBack(t *testing.T) {
	t.Parallel()
	b, oep, ordered, plain := startOrderedBeside(t)
	ctx := context.Background()
	slow, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	if _, err := slow.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		VALUES ('h', 'stream.created', '{"stream": "h", "seq": 0}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		VALUES ('h', 'stream.updated', '{"stream": "h", "seq": 1}')`); err != nil {
		t.Fatal(err)
	}
	b.assertStreamHeldBack(t, oep.ID, "h", plain, ordered, "an older producer transaction was open")
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.waitSettled(30 * time.Second)
	if got := checkStreamOrder(t, ordered, true, nil); got["h"] != 2 {
		t.Errorf("stream h: %d events arrived, want 2", got["h"])
	}
}

// TestRetriedHeadKeepsItsPlace: a stream's head that fails several times in a row keeps its
// place through every retry: its later events, waiting, are not sent before its first 2xx,
// and the consumer's first 2xx of each event come in id order. Each retry is a new row, so
// the order key must be carried from retry to retry: a retry keyed anew (its own id, or the
// failed attempt's: the same as the event's only for the first retry of a WEBHOOK_URL row)
// lets the later events go past it. Both consumers that order: a managed endpoint and
// WEBHOOK_ORDERING's default URL.
func TestRetriedHeadKeepsItsPlace(t *testing.T) {
	t.Parallel()
	const fails = 3 // the head's first three attempts fail
	for _, managed := range []bool{true, false} {
		t.Run(fmt.Sprintf("managed=%v", managed), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c, refused := refusingHead(t, fails)
			cfg := b.orderedConfig(c, managed)
			cfg.RetrySchedule = []time.Duration{20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond}
			b.start(cfg)
			// The head and three later events, committed together: the later ones wait.
			b.insertSeqs("r", 0, 3)
			b.waitSettled(30 * time.Second)
			headOK := -1
			attempts := 0
			for i, a := range c.arrivals() {
				var ev streamEvent
				if err := json.Unmarshal(a.Body, &ev); err != nil {
					t.Fatalf("payload %s: %v", a.Body, err)
				}
				switch {
				case ev.Seq == 0:
					attempts++
					if !refused(a) && headOK < 0 {
						headOK = i
					}
				case headOK < 0:
					t.Errorf("event %d was sent before the head's 2xx (after %d of its attempts)", ev.Seq, attempts)
				}
			}
			if attempts != fails+1 || headOK < 0 {
				t.Fatalf("the head was attempted %d times (2xx: %v), want %d: the test did not retry it enough", attempts, headOK >= 0, fails+1)
			}
			if got := checkStreamOrder(t, c, managed, refused); got["r"] != 4 {
				t.Errorf("stream r: %d events arrived, want 4", got["r"])
			}
			if n := b.count(`SELECT count(*) FROM webhook_dead_letter`); n != 0 {
				t.Errorf("%d dead letters, want none", n)
			}
		})
	}
}

// TestOrderedEndpointWaitsForUnroutedEvents: an ordered endpoint's delivery of a stream's
// event waits while an earlier event of the stream has not been routed yet, here because
// another instance holds its lease (as while that instance routes it, or after it crashed):
// the dispatcher routes the later event but does not send it, though an unrelated event goes.
// Once the earlier event's lease ends, the dispatcher routes and sends it, and then the later
// one. The claim statement's head check counts events waiting to be routed
// (TestOrderedClaimWaitsForTheStreamsUnroutedEvents pins it at the claim level).
func TestOrderedEndpointWaitsForUnroutedEvents(t *testing.T) {
	t.Parallel()
	b, oep, ordered, plain := startOrderedBeside(t)
	ctx := context.Background()
	// Event 0 of stream u, leased by another instance that has not routed it.
	var first int64
	if err := b.pool.QueryRow(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload, leased_by, lease_token, lease_until)
		VALUES ('u', 'stream.created', '{"stream": "u", "seq": 0}', 'other', 1, now() + interval '1 hour') RETURNING id`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_outbox (stream_id, event_type, payload)
		VALUES ('u', 'stream.updated', '{"stream": "u", "seq": 1}')`); err != nil {
		t.Fatal(err)
	}
	b.assertStreamHeldBack(t, oep.ID, "u", plain, ordered, "its earlier event waited to be routed")
	// The other instance's lease ends; another event wakes the dispatcher.
	if _, err := b.pool.Exec(ctx, `UPDATE webhook_outbox SET lease_until = now() - interval '1 second' WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	b.enqueue(outbox.Event{EventType: "test.unordered"})
	b.waitSettled(30 * time.Second)
	if got := checkStreamOrder(t, ordered, true, nil); got["u"] != 2 {
		t.Errorf("stream u: %d events arrived, want 2", got["u"])
	}
}

// assertStreamHeldBack checks that the later event of stream, routed to the ordered endpoint
// epID, waits while why holds: a claim made after its routing (shown by an unordered event's
// arrival at plain) neither sent it to ordered nor leased its delivery.
func (b *bundle) assertStreamHeldBack(t *testing.T, epID, stream string, plain, ordered *consumer, why string) {
	t.Helper()
	eventually(t, 30*time.Second, "the later event routed to the ordered endpoint", func() bool {
		return b.count(`SELECT count(*) FROM webhook_outbox WHERE endpoint_id = $1 AND stream_id = $2`, epID, stream) == 1
	})
	unordered := b.enqueue(outbox.Event{EventType: "test.unordered"})
	eventually(t, 30*time.Second, "the unordered event delivered", func() bool {
		return len(plain.byDelivery()[unordered]) > 0
	})
	if got := ordered.arrivals(); len(got) > 0 {
		t.Fatalf("stream %s's event %s arrived while %s", stream, got[0].Body, why)
	}
	if n := b.count(`SELECT count(*) FROM webhook_outbox WHERE endpoint_id = $1 AND stream_id = $2
		AND lease_until IS NULL AND NOT processed`, epID, stream); n != 1 {
		t.Fatalf("the later event's ordered delivery was claimed while %s", why)
	}
}

// startOrderedBeside starts a dispatcher without WEBHOOK_URL and two endpoints: oep orders
// the streams of stream.* events (received by ordered), and another takes test.unordered
// events (received by plain), whose arrival shows that a claim ran.
func startOrderedBeside(t *testing.T) (b *bundle, oep endpoints.Endpoint, ordered, plain *consumer) {
	t.Helper()
	b = setup(t)
	ordered, plain = newConsumer(t, nil), newConsumer(t, nil)
	oep = b.addEndpoint(endpoints.New{URL: ordered.URL(), EventTypes: []string{"stream.*"}, Ordering: endpoints.OrderingStream})
	b.addEndpoint(endpoints.New{URL: plain.URL(), EventTypes: []string{"test.unordered"}})
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	b.start(cfg)
	return b, oep, ordered, plain
}

// TestScheduledEventTakesItsPlaceWhenDue: an event its producer scheduled for later (created_at
// ahead) does not hold a managed endpoint's stream back: it is routed, and takes its place in
// the stream, when it comes due, and the stream's event due now goes meanwhile. Under
// WEBHOOK_ORDERING=stream it is already in its place: it holds the stream until then.
func TestScheduledEventTakesItsPlaceWhenDue(t *testing.T) {
	t.Parallel()
	for _, managed := range []bool{true, false} {
		t.Run(map[bool]string{true: "managed endpoint", false: "WEBHOOK_URL"}[managed], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			w := &streamWatch{inFlight: map[string]int{}}
			c := newConsumer(t, w.wrap(func(arrival, streamEvent, http.ResponseWriter) {}))
			b.start(b.orderedConfig(c, managed))
			if _, err := b.pool.Exec(t.Context(), `INSERT INTO webhook_outbox (stream_id, event_type, payload, created_at)
				VALUES ('sch', 'stream.updated', '{"stream": "sch", "seq": 0}', now() + interval '1 second')`); err != nil {
				t.Fatal(err)
			}
			b.enqueue(outbox.Event{StreamID: "sch", EventType: "stream.updated", Payload: streamEvent{Stream: "sch", Seq: 1}})
			eventually(t, 15*time.Second, "both events", func() bool { return len(c.arrivals()) == 2 })
			seqs := arrivalSeqs(c)
			if want := map[bool][]int{true: {1, 0}, false: {0, 1}}[managed]; !slices.Equal(seqs, want) {
				t.Errorf("arrivals %v, want %v", seqs, want)
			}
			w.checkOverlaps(t)
		})
	}
}

// TestScheduledEventWaitsForTheStreamInFlight: a managed endpoint's event scheduled for later
// comes due while a later event of its stream, sent meanwhile, is still out: routed then, its
// delivery waits for that request to settle (it was sent beside it).
func TestScheduledEventWaitsForTheStreamInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := &streamWatch{inFlight: map[string]int{}}
	release := make(chan struct{})
	c := newConsumer(t, w.wrap(func(a arrival, ev streamEvent, rw http.ResponseWriter) {
		if ev.Seq == 1 {
			select { // out until the test lets it answer
			case <-release:
			case <-a.Ctx.Done():
			}
		}
	}))
	cfg := b.orderedConfig(c, true)
	cfg.Timeout = 30 * time.Second
	cfg.PollInterval = 50 * time.Millisecond // claims keep coming while the test watches
	d := b.start(cfg)
	if _, err := b.pool.Exec(t.Context(), `INSERT INTO webhook_outbox (stream_id, event_type, payload, created_at)
		VALUES ('sch', 'stream.updated', '{"stream": "sch", "seq": 0}', now() + interval '2 seconds')`); err != nil {
		t.Fatal(err)
	}
	b.enqueue(outbox.Event{StreamID: "sch", EventType: "stream.updated", Payload: streamEvent{Stream: "sch", Seq: 1}})
	eventually(t, 10*time.Second, "the event due now out", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.inFlight["sch"] == 1
	})
	eventually(t, 10*time.Second, "the scheduled event routed", func() bool {
		return b.count(`SELECT count(*) FROM webhook_outbox WHERE stream_id = 'sch' AND endpoint_id IS NOT NULL AND payload->>'seq' = '0'`) == 1
	})
	claims := d.Stats().Claims.Load()
	eventually(t, 10*time.Second, "claims after it was routed", func() bool { return d.Stats().Claims.Load() >= claims+2 })
	if n := len(c.arrivals()); n != 1 {
		t.Errorf("%d requests while event 1 is out, want 1", n)
	}
	close(release)
	eventually(t, 15*time.Second, "both events", func() bool { return len(c.arrivals()) == 2 })
	w.checkOverlaps(t)
}

// TestReplayWaitsForTheStreamInFlight: a stream went on past two dead letters (ordering_failure
// skip), and both are replayed together while the stream's next request is still out: they
// take their places back, but wait for that request to settle, so that the stream's requests
// stay one at a time (the first was sent at once, beside it). Then they go, in order, before
// the events still waiting.
func TestReplayWaitsForTheStreamInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	w := &streamWatch{inFlight: map[string]int{}}
	release := make(chan struct{})
	var refusedMu sync.Mutex
	refused := map[int]bool{}
	c := newConsumer(t, w.wrap(func(a arrival, ev streamEvent, rw http.ResponseWriter) {
		switch ev.Seq {
		case 0, 1:
			refusedMu.Lock()
			first := !refused[ev.Seq]
			refused[ev.Seq] = true
			refusedMu.Unlock()
			if first {
				rw.WriteHeader(http.StatusRequestEntityTooLarge) // dead-lettered at once
			}
		case 2:
			select { // out until the test lets it answer
			case <-release:
			case <-a.Ctx.Done():
			}
		}
	}))
	ep := b.addEndpoint(endpoints.New{URL: c.URL(), Ordering: endpoints.OrderingStream})
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	cfg.Timeout = 30 * time.Second
	d := b.start(cfg)
	b.insertStreams("rp", 1, 4)
	eventually(t, 20*time.Second, "event 2 out after two dead letters", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.inFlight["rp0"] == 1 && b.count(`SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1`, ep.ID) == 2
	})
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := deadletters.Replay(ctx, tx, deadletters.Selection{Matching: &deadletters.Filter{EndpointID: ep.ID}}, deadletters.Options{}); err != nil {
		t.Fatal(err)
	}
	// The replay's NOTIFY wakes the claims; a few of them pass the replayed rows by. Counted
	// from before the commit: read after it, the claims its NOTIFY woke could already be
	// done (CI, under load), and none more came for the wait.
	claims := d.Stats().Claims.Load()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "claims after the replay", func() bool { return d.Stats().Claims.Load() >= claims+2 })
	if n := len(c.arrivals()); n != 3 {
		t.Errorf("%d requests while event 2 is out, want 3 (the refused 0 and 1, event 2)", n)
	}
	close(release)
	b.waitSettled(30 * time.Second)
	seqs := arrivalSeqs(c)
	if !slices.Equal(seqs, []int{0, 1, 2, 0, 1, 3}) {
		t.Errorf("arrivals %v, want [0 1 2 0 1 3]: two refused, event 2, the replayed two, event 3", seqs)
	}
	w.checkOverlaps(t)
}

// orderedConfig is a config under which consumer c orders streams: as a managed endpoint's
// (added here, signing with its own secret), or as WEBHOOK_URL's under WEBHOOK_ORDERING=stream.
func (b *bundle) orderedConfig(c *consumer, managed bool) dispatcher.Config {
	b.t.Helper()
	if !managed {
		cfg := b.config(c.URL())
		cfg.Ordering = true
		return cfg
	}
	b.addEndpoint(endpoints.New{URL: c.URL(), Ordering: endpoints.OrderingStream})
	cfg := b.config("")
	cfg.Secret = ""
	cfg.EncryptionKey = testKey
	return cfg
}

// checkOverlaps fails t if two requests of one stream were ever out at once.
func (w *streamWatch) checkOverlaps(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.overlaps) > 0 {
		t.Errorf("requests of one stream overlapped: %v", w.overlaps)
	}
}

// arrivalSeqs is the place in its stream of each request c received, in arrival order.
func arrivalSeqs(c *consumer) []int {
	var seqs []int
	for _, a := range c.arrivals() {
		var ev streamEvent
		_ = json.Unmarshal(a.Body, &ev)
		seqs = append(seqs, ev.Seq)
	}
	return seqs
}

// TestParkedStreamKeepsItsOrder: a head that goes back for a retry a second or more away parks
// the stream's later events behind it (settle.sql marks them 'behind its stream', due with
// it), so that claims stop reading them meanwhile; when the head's retry is delivered they
// follow, in order, each once. Both consumers that order: a managed endpoint and
// WEBHOOK_ORDERING's default URL.
func TestParkedStreamKeepsItsOrder(t *testing.T) {
	t.Parallel()
	const fails = 2
	for _, managed := range []bool{true, false} {
		t.Run(fmt.Sprintf("managed=%v", managed), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c, refused := refusingHead(t, fails)
			cfg := b.orderedConfig(c, managed)
			cfg.RetrySchedule = []time.Duration{1100 * time.Millisecond, 1100 * time.Millisecond, time.Second}
			b.start(cfg)
			b.insertSeqs("p", 0, 4)
			eventually(t, 30*time.Second, "the later events parked behind the retried head", func() bool {
				return b.count(`SELECT count(*) FROM webhook_outbox WHERE deferred_reason = 'behind its stream' AND created_at > now()`) == 4
			})
			b.waitSettled(30 * time.Second)
			if got := checkStreamOrder(t, c, managed, refused); got["p"] != 5 {
				t.Errorf("stream p: %d events arrived, want 5", got["p"])
			}
			if n := len(c.arrivals()); n != 5+fails {
				t.Errorf("%d requests, want %d: the head's %d refused attempts and each event once", n, 5+fails, fails)
			}
		})
	}
}

// TestArrivalsParkBehindAWaitingHead: events of a stream that arrive while its head waits an
// hour for a retry are parked behind it too, so that claims stop reading them: a managed
// endpoint's as they are routed, WEBHOOK_ORDERING=stream's (never routed) by the dispatcher's
// park pass at its next maintenance tick.
func TestArrivalsParkBehindAWaitingHead(t *testing.T) {
	t.Parallel()
	for _, managed := range []bool{true, false} {
		t.Run(fmt.Sprintf("managed=%v", managed), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c, _ := refusingHead(t, math.MaxInt)
			cfg := b.orderedConfig(c, managed)
			cfg.RetrySchedule = []time.Duration{time.Hour, time.Hour}
			cfg.PollInterval = 300 * time.Millisecond
			b.start(cfg)
			parked := func() int {
				return b.count(`SELECT count(*) FROM webhook_outbox WHERE deferred_reason = 'behind its stream' AND created_at > now() + interval '50 minutes'`)
			}
			b.insertSeqs("p", 0, 4)
			eventually(t, 20*time.Second, "the four events behind the refused head parked", func() bool { return parked() == 4 })
			b.insertSeqs("p", 5, 9)
			eventually(t, 20*time.Second, "the five events that arrived later parked too", func() bool { return parked() == 9 })
			if n := len(c.arrivals()); n != 1 {
				t.Errorf("%d requests, want the head's one refused attempt", n)
			}
		})
	}
}

// TestOlderStreamIndexReplacedAfterStart: a dispatcher with WEBHOOK_ORDERING=stream that
// finds the stream index in its older form (keyed by stream alone, as a previous release built
// it) starts on it and delivers at once, and replaces it in the background.
func TestOlderStreamIndexReplacedAfterStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(context.Background(), `CREATE INDEX webhook_outbox_stream_idx
		ON webhook_outbox (stream_id, (coalesce(order_key, id))) WHERE NOT processed AND stream_id IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, nil)
	b.start(b.orderedConfig(c, false))
	b.insertStreams("e", 2, 3)
	b.waitSettled(30 * time.Second)
	if got := checkStreamOrder(t, c, false, func(arrival) bool { return false }); got["e0"] != 3 || got["e1"] != 3 {
		t.Errorf("arrivals per stream %v, want 3 each", got)
	}
	eventually(t, 30*time.Second, "the stream index replaced by its current form", func() bool {
		return b.count(`SELECT count(*) FROM pg_index WHERE indexrelid = to_regclass('webhook_outbox_stream_idx')
			AND indisvalid AND indnkeyatts = 3`) == 1
	})
}

// refusingHead returns a consumer that answers 503 to the first fails attempts of each stream's
// first event (seq 0) and 2xx to everything else, and the test of an arrival it refused.
func refusingHead(t *testing.T, fails int) (*consumer, func(arrival) bool) {
	t.Helper()
	refused := func(a arrival) bool {
		var ev streamEvent
		_ = json.Unmarshal(a.Body, &ev)
		n, _ := strconv.Atoi(a.Attempt)
		return ev.Seq == 0 && n <= fails
	}
	c := newConsumer(t, func(a arrival, w http.ResponseWriter) {
		if refused(a) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	return c, refused
}
