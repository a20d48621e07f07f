package claim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/claim"
	"github.com/fluxora/fluxhook/stages/delivery"
)

// TestClaimWithholdsOversizePayloads: with a limit, a row whose payload's text form is over
// 1.5 times it comes back without its body, marked Oversize with a reason naming its size,
// the limit and WEBHOOK_MAX_PAYLOAD_BYTES (still an event to route: its deliveries carry the
// reason); a row between the limit and that bound is read and measured compacted, as it
// would be sent, so that a payload whose text form is over the limit but whose compacted form
// fits is still sent, byte for byte.
// Both statements are checked (the one that orders and the one that does not): they share
// the part that withholds the body.
func TestClaimWithholdsOversizePayloads(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	const limit = 100
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			c := claim.New(db.Pool, fmt.Sprintf("ordered-%v", ordered), time.Minute)
			c.LimitPayload(limit)
			if ordered {
				c.SetOrdering(claim.Ordering{Active: true, Horizon: 1 << 62})
			}
			if err := c.Register(ctx); err != nil {
				t.Fatal(err)
			}
			// fits: small. packed: 40 zeros, 81 bytes compacted, 120 as text (a space after
			// each comma). over: 120 bytes compacted, 121 as text, read and measured. huge:
			// far over 150 as text, never read.
			if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload) VALUES
				('fits', '{"a": 1}'),
				('packed', (SELECT jsonb_agg(0) FROM generate_series(1, 40))),
				('over', jsonb_build_object('pad', repeat('x', 110))),
				('huge', jsonb_build_object('pad', repeat('x', 100000)))`); err != nil {
				t.Fatal(err)
			}
			res, err := c.Claim(ctx, 10, claim.Skip{}, ordered, claim.Cursor{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]*delivery.Delivery{}
			for _, d := range res.Rows {
				got[d.EventType] = d
			}
			if len(got) != 4 {
				t.Fatalf("claimed %d rows (%v); want the 4 inserted", len(res.Rows), got)
			}
			if d := got["fits"]; d.Oversize != "" || string(d.Payload) != `{"a":1}` {
				t.Errorf("fits: payload %q, invalid %q; want it whole and valid", d.Payload, d.Invalid)
			}
			packed := "[" + strings.TrimSuffix(strings.Repeat("0,", 40), ",") + "]"
			if d := got["packed"]; d.Oversize != "" || string(d.Payload) != packed {
				t.Errorf("packed: payload %q (%d bytes), oversize %q; want %d bytes, not oversize",
					d.Payload, len(d.Payload), d.Oversize, len(packed))
			}
			if d := got["over"]; d.Oversize != claim.PayloadTooLarge(120, limit) {
				t.Errorf("over: oversize %q; want %q", d.Oversize, claim.PayloadTooLarge(120, limit))
			}
			var text int
			if err := db.Pool.QueryRow(ctx, `SELECT octet_length(payload::text) FROM webhook_outbox WHERE event_type = 'huge'`).Scan(&text); err != nil {
				t.Fatal(err)
			}
			d := got["huge"]
			want := fmt.Sprintf("invalid row: payload is %d bytes as JSON text (at least %d compacted), over the limit of %d (WEBHOOK_MAX_PAYLOAD_BYTES)",
				text, (2*text+2)/3, limit)
			if d.Payload != nil || !strings.HasPrefix(d.Oversize, want) {
				t.Errorf("huge: %d bytes of payload read, oversize %q; want no body and a reason starting %q", len(d.Payload), d.Oversize, want)
			}
			for _, d := range got {
				if d.Invalid != "" || !claim.NeedsRouting(d) {
					t.Errorf("%s: invalid %q, to route %v; want every event valid and to route", d.EventType, d.Invalid, claim.NeedsRouting(d))
				}
			}
			if _, err := db.Pool.Exec(ctx, `DELETE FROM webhook_outbox`); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestClaimWithoutALimitReadsEveryPayload: a Claimer that was given no limit (tools, tests)
// hands every payload over whole, as it always did.
func TestClaimWithoutALimitReadsEveryPayload(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload)
		VALUES ('big', jsonb_build_object('pad', repeat('x', 100000)))`); err != nil {
		t.Fatal(err)
	}
	res := claimAll(ctx, t, db.Pool)
	if len(res) != 1 || res[0].Oversize != "" || len(res[0].Payload) != 100000+len(`{"pad":""}`) {
		t.Fatalf("claimed %d rows; want the one row, valid, its payload whole", len(res))
	}
}

func claimAll(ctx context.Context, t *testing.T, pool *pgxpool.Pool) []*delivery.Delivery {
	t.Helper()
	c := claim.New(pool, "all", time.Minute)
	res, err := c.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Rows
}

// TestRouteWithholdsOversizePayloads: events over the limit are routed like any other (each
// endpoint's delivery is dead-lettered by that endpoint's rules), their deliveries marked
// Oversize with the event's reason and given no body: the route statement returns no payload
// of such an event, nor, for a delivery id several events share (each delivery then brings
// its own payload), a payload over 1.5 times the limit.
func TestRouteWithholdsOversizePayloads(t *testing.T) {
	t.Parallel()
	db, c := newRegistered(t, "a")
	ctx := deadline(t)
	const limit = 100
	c.LimitPayload(limit)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_endpoints (url, secret, created_at) VALUES ('http://127.0.0.1:1/hook', 's', now() - interval '1 minute');
		INSERT INTO webhook_outbox (event_type, payload, enqueued_at) VALUES
			('fits', '{"a": 1}', now() - interval '10 seconds'),
			('over', jsonb_build_object('pad', repeat('x', 110)), now() - interval '10 seconds'),
			('huge', jsonb_build_object('pad', repeat('x', 100000)), now() - interval '10 seconds');
		INSERT INTO webhook_outbox (event_type, payload, enqueued_at, delivery_id)
		SELECT t, p, now() - interval '10 seconds', '00000000-0000-4000-8000-000000000001'
		FROM (VALUES ('shared-fits', '{"b": 2}'::jsonb), ('shared-huge', jsonb_build_object('pad', repeat('y', 100000)))) v(t, p)`); err != nil {
		t.Fatal(err)
	}
	res, err := c.Claim(ctx, 10, claim.Skip{}, false, claim.Cursor{})
	if err != nil || len(res.Rows) != 5 {
		t.Fatalf("claimed %d of 5 events: %v", len(res.Rows), err)
	}
	routed, err := c.Route(ctx, res.Rows, false)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*delivery.Delivery{}
	for _, d := range routed.Deliveries {
		got[d.EventType] = d
	}
	if len(got) != 5 {
		t.Fatalf("%d deliveries (%v); want one per event", len(routed.Deliveries), got)
	}
	for typ, body := range map[string]string{"fits": `{"a":1}`, "shared-fits": `{"b":2}`} {
		if d := got[typ]; d.Oversize != "" || string(d.Payload) != body {
			t.Errorf("%s: payload %q, oversize %q; want %s", typ, d.Payload, d.Oversize, body)
		}
	}
	if d := got["over"]; d.Payload != nil || d.Oversize != claim.PayloadTooLarge(120, limit) {
		t.Errorf("over: %d bytes of payload, oversize %q; want no body and %q", len(d.Payload), d.Oversize, claim.PayloadTooLarge(120, limit))
	}
	for _, typ := range []string{"huge", "shared-huge"} {
		if d := got[typ]; d.Payload != nil || !strings.HasPrefix(d.Oversize, "invalid row: payload is 1000") ||
			!strings.Contains(d.Oversize, "over the limit of 100 (WEBHOOK_MAX_PAYLOAD_BYTES)") {
			t.Errorf("%s: %d bytes of payload, oversize %q; want no body and the reason", typ, len(d.Payload), d.Oversize)
		}
	}
}
