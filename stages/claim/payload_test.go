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
// 1.5 times it comes back without its body, invalid with a reason naming its size, the limit
// and WEBHOOK_MAX_PAYLOAD_BYTES, and is not an event to route; a row between the limit and
// that bound is read and measured compacted, as it would be sent, so that a payload whose
// text form is over the limit but whose compacted form fits is still sent, byte for byte.
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
			if d := got["fits"]; d.Invalid != "" || string(d.Payload) != `{"a":1}` {
				t.Errorf("fits: payload %q, invalid %q; want it whole and valid", d.Payload, d.Invalid)
			}
			packed := "[" + strings.TrimSuffix(strings.Repeat("0,", 40), ",") + "]"
			if d := got["packed"]; d.Invalid != "" || string(d.Payload) != packed || !claim.NeedsRouting(d) {
				t.Errorf("packed: payload %q (%d bytes), invalid %q; want %d bytes, valid and to route",
					d.Payload, len(d.Payload), d.Invalid, len(packed))
			}
			if d := got["over"]; d.Invalid != claim.PayloadTooLarge(120, limit) {
				t.Errorf("over: invalid %q; want %q", d.Invalid, claim.PayloadTooLarge(120, limit))
			}
			var text int
			if err := db.Pool.QueryRow(ctx, `SELECT octet_length(payload::text) FROM webhook_outbox WHERE event_type = 'huge'`).Scan(&text); err != nil {
				t.Fatal(err)
			}
			d := got["huge"]
			want := fmt.Sprintf("invalid row: payload is %d bytes as JSON text (at least %d compacted), over the limit of %d (WEBHOOK_MAX_PAYLOAD_BYTES)",
				text, (2*text+2)/3, limit)
			if d.Payload != nil || !strings.HasPrefix(d.Invalid, want) {
				t.Errorf("huge: %d bytes of payload read, invalid %q; want no body and a reason starting %q", len(d.Payload), d.Invalid, want)
			}
			if claim.NeedsRouting(d) {
				t.Error("huge: an event to route; want it dead-lettered as it is (each delivery would be, for the same reason)")
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
	if len(res) != 1 || res[0].Invalid != "" || len(res[0].Payload) != 100000+len(`{"pad":""}`) {
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
