package settle_test

import (
	"context"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/delivery"
	"github.com/fluxora/fluxhook/stages/settle"
)

// anchoredEndpoints inserts n endpoints and returns their ids.
func anchoredEndpoints(t *testing.T, db *sqltest.DB, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		var id string
		if err := db.Pool.QueryRow(context.Background(), `INSERT INTO webhook_endpoints (url, secret)
			VALUES ('http://127.0.0.1:1/hook', 's') RETURNING id::text`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func delivered(endpointID string) *delivery.Delivery {
	return &delivery.Delivery{EndpointID: endpointID, Outcome: delivery.Outcome{Kind: delivery.Delivered, Status: 204, Duration: time.Millisecond}}
}

// An event routed in memory is replaced in one statement: the event and its delivered
// deliveries go to the log, each delivery under an id of its own, the others become rows
// leased with the event's new token.
func TestSettleAnchoredReplacesTheEventsRow(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	ev := leased(t, db, "e", 1)[0]
	eps := anchoredEndpoints(t, db, 3)
	res, err := s.SettleAnchored(context.Background(), []settle.Anchored{{
		EventID: ev.ID, LeaseToken: myToken, NewToken: 100, Endpoints: 3,
		Delivered: []*delivery.Delivery{delivered(eps[0]), delivered(eps[1])}, Rows: []string{eps[2]},
	}}, time.Minute)
	if err != nil || !res.Written[100] || res.Refused != nil {
		t.Fatalf("SettleAnchored = %+v, %v; want the event written", res, err)
	}
	id := res.Rows[settle.AnchoredRow{Token: 100, Endpoint: eps[2]}]
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE id = $1 AND endpoint_id = $2 AND leased_by = 'me' AND lease_token = 100
		AND delivery_id = $3::uuid AND attempt = 1`, id, eps[2], ev.DeliveryID); n != 1 {
		t.Errorf("the in-flight delivery's row %d: %d found leased with the new token, want 1", id, n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE id = $1`, ev.ID); n != 0 {
		t.Errorf("the event's row is still in the queue")
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE id = $1 AND endpoint_id IS NULL AND error = 'routed to 3 endpoint(s)'`, ev.ID); n != 1 {
		t.Errorf("the event's log row: %d, want 1 saying where it went", n)
	}
	if n := count(t, db, `SELECT count(DISTINCT id) FROM webhook_delivery_log WHERE delivery_id = $1::uuid AND endpoint_id IS NOT NULL
		AND status_code = 204 AND id <> $2`, ev.DeliveryID, ev.ID); n != 2 {
		t.Errorf("delivered deliveries in the log under ids of their own: %d, want 2", n)
	}
}

// An event claimed again by the same instance after its lease ran out can come back twice in
// one settle, once per claim: only the claim that holds the lease writes, and only its own
// deliveries; the other claim's outcomes are refused (not written).
func TestSettleAnchoredTellsTwoClaimsOfOneEventApart(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	ev := leased(t, db, "e", 1)[0] // held by the claim with myToken
	eps := anchoredEndpoints(t, db, 2)
	res, err := s.SettleAnchored(context.Background(), []settle.Anchored{
		{EventID: ev.ID, LeaseToken: myToken - 1, NewToken: 200, Endpoints: 2, // the earlier claim
			Delivered: []*delivery.Delivery{delivered(eps[0])}, Rows: []string{eps[1]}},
		{EventID: ev.ID, LeaseToken: myToken, NewToken: 201, Endpoints: 2,
			Delivered: []*delivery.Delivery{delivered(eps[1])}, Rows: []string{eps[0]}},
	}, time.Minute)
	if err != nil || res.Written[200] || !res.Written[201] {
		t.Fatalf("SettleAnchored = %+v, %v; want only the lease holder's claim written", res, err)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1::uuid AND endpoint_id = $2`, ev.DeliveryID, eps[1]); n != 1 {
		t.Errorf("the holder's delivered delivery: %d log rows, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE delivery_id = $1::uuid AND endpoint_id = $2`, ev.DeliveryID, eps[0]); n != 0 {
		t.Errorf("the earlier claim's delivered delivery was logged %d times, want 0", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE delivery_id = $1::uuid`, ev.DeliveryID); n != 1 {
		t.Errorf("%d rows in the queue for the event, want 1: the holder's in-flight delivery", n)
	}
	if res.Rows[settle.AnchoredRow{Token: 201, Endpoint: eps[0]}] == 0 || len(res.Rows) != 1 {
		t.Errorf("new rows %v, want only the holder's delivery to %s", res.Rows, eps[0])
	}
}

// An event whose deliveries the database refuses to log (here a trigger on the log) must not
// hold back the batch, nor come back with it for ever: the others are written, and it is
// written with every delivery a row (AsRows), for Settle to write or dead-letter one by one.
func TestSettleAnchoredRefusedEventBecomesRows(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	sqltest.RefuseSettles(t, db, "NEW.event_type = 'poison' AND NEW.endpoint_id IS NOT NULL")
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	good := leased(t, db, "good", 1)[0]
	bad := leased(t, db, "poison", 1)[0]
	eps := anchoredEndpoints(t, db, 2)
	res, err := s.SettleAnchored(context.Background(), []settle.Anchored{
		{EventID: good.ID, LeaseToken: myToken, NewToken: 300, Endpoints: 2, Delivered: []*delivery.Delivery{delivered(eps[0]), delivered(eps[1])}},
		{EventID: bad.ID, LeaseToken: myToken, NewToken: 301, Endpoints: 2, Delivered: []*delivery.Delivery{delivered(eps[0])}, Rows: []string{eps[1]}},
	}, time.Minute)
	if err != nil || res.Refused == nil || !res.Written[300] || !res.Written[301] || res.AsRows[300] || !res.AsRows[301] || len(res.Failed) != 0 {
		t.Fatalf("SettleAnchored = %+v, %v; want the batch refused, the good event written, the poison one as rows", res, err)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE event_type = 'good' AND endpoint_id IS NOT NULL`); n != 2 {
		t.Errorf("the good event's deliveries: %d logged, want 2", n)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_outbox WHERE event_type = 'poison' AND lease_token = 301 AND endpoint_id IS NOT NULL`); n != 2 {
		t.Errorf("the poison event's deliveries: %d rows, want 2 (its delivered one included)", n)
	}
	if len(res.Rows) != 2 {
		t.Errorf("new rows %v, want the poison event's 2", res.Rows)
	}
}

// Warm runs both settle statements with nothing to settle: no error, nothing written, the
// leased rows of this instance untouched; and afterwards they settle as usual.
func TestWarmWritesNothing(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	s := settle.New(db.Pool, settle.Config{InstanceID: "me"})
	rows := leased(t, db, "e", 3)
	anchoredEndpoints(t, db, 2)
	snapshot := func() string {
		var got string
		if err := db.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(id || ':' || leased_by || ':' || lease_token || ':' ||
			lease_until || ':' || attempt || ':' || created_at, ',' ORDER BY id), '') FROM webhook_outbox`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	before := snapshot()
	for _, anchored := range []bool{true, false} {
		if err := s.Warm(context.Background(), anchored); err != nil {
			t.Fatalf("Warm(anchored %v): %v", anchored, err)
		}
	}
	if after := snapshot(); after != before {
		t.Errorf("the queue changed:\n%s\nwant\n%s", after, before)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_delivery_log`) + count(t, db, `SELECT count(*) FROM webhook_dead_letter`); n != 0 {
		t.Errorf("%d rows written to the log or the dead letters", n)
	}
	rows[0].Outcome = delivery.Outcome{Kind: delivery.Delivered, Status: 200}
	if res, err := s.Settle(context.Background(), rows[:1]); err != nil || res.Settled != 1 {
		t.Errorf("Settle after Warm = %+v, %v; want the row settled", res, err)
	}
}
