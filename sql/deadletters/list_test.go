package deadletters_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/deadletters"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

func ids(list []deadletters.DeadLetter) []int64 {
	out := []int64{}
	for _, d := range list {
		out = append(out, d.ID)
	}
	return out
}

func list(t *testing.T, db *sqltest.DB, f deadletters.Filter) []int64 {
	t.Helper()
	got, err := deadletters.List(context.Background(), db.Pool, f)
	if err != nil {
		t.Fatalf("List(%+v): %v", f, err)
	}
	return ids(got)
}

// TestListScopesAndFilters: a tenant's scope sees only its rows, whatever else the filter
// says; the filters combine with AND; a malformed filter is an InvalidError naming the field.
func TestListScopesAndFilters(t *testing.T) {
	t.Parallel()
	db := setup(t)
	a1 := insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: 3 * time.Hour})
	a2 := insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: time.Hour, replayed: true, reason: "permanent: HTTP 410"})
	a3 := insert(t, db, fixture{tenant: acme, endpoint: acmeOther, failedAgo: 2 * time.Hour, eventType: "user.deleted"})
	g1 := insert(t, db, fixture{tenant: globex, endpoint: globexEndpoint, failedAgo: 30 * time.Minute})
	n1 := insert(t, db, fixture{failedAgo: 10 * time.Minute})

	var now time.Time
	if err := db.Pool.QueryRow(context.Background(), "SELECT now()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		f    deadletters.Filter
		want []int64
	}{
		{"admin sees every tenant, newest first", deadletters.Filter{}, []int64{n1, g1, a2, a3, a1}},
		{"a tenant sees its own", deadletters.Filter{Tenant: acme}, []int64{a2, a3, a1}},
		{"the other tenant its own", deadletters.Filter{Tenant: globex}, []int64{g1}},
		{"a tenant asking for another's endpoint", deadletters.Filter{Tenant: acme, EndpointID: globexEndpoint}, []int64{}},
		{"an endpoint", deadletters.Filter{EndpointID: acmeEndpoint}, []int64{a2, a1}},
		{"an endpoint in upper case", deadletters.Filter{Tenant: acme, EndpointID: "AAAAAAAA-0000-4000-8000-00000000000A"}, []int64{a2, a1}},
		{"event type", deadletters.Filter{Tenant: acme, EventType: "user.deleted"}, []int64{a3}},
		{"reason", deadletters.Filter{ReasonContains: "http 4"}, []int64{a2}},
		{"replayed only", deadletters.Filter{Replayed: deadletters.ReplayedOnly}, []int64{a2}},
		{"not replayed", deadletters.Filter{Tenant: acme, Replayed: deadletters.NotReplayed}, []int64{a3, a1}},
		{"since", deadletters.Filter{Since: now.Add(-90 * time.Minute)}, []int64{n1, g1, a2}},
		{"until", deadletters.Filter{Until: now.Add(-90 * time.Minute)}, []int64{a3, a1}},
		{"since and until", deadletters.Filter{Since: now.Add(-150 * time.Minute), Until: now.Add(-45 * time.Minute)}, []int64{a2, a3}},
		{"failed within", deadletters.Filter{FailedWithin: 45 * time.Minute}, []int64{n1, g1}},
		{"limit", deadletters.Filter{Limit: 2}, []int64{n1, g1}},
	}
	for _, tc := range cases {
		if got := list(t, db, tc.f); !slices.Equal(got, tc.want) {
			t.Errorf("%s: List = %v, want %v", tc.name, got, tc.want)
		}
	}

	for _, tc := range []struct {
		f     deadletters.Filter
		field string
	}{
		{deadletters.Filter{EndpointID: "not-a-uuid"}, "endpoint_id"},
		{deadletters.Filter{DeliveryID: "42"}, "delivery_id"},
		{deadletters.Filter{Limit: -1}, "limit"},
		{deadletters.Filter{Since: now, Until: now.Add(-time.Hour)}, "until"},
	} {
		_, err := deadletters.List(context.Background(), db.Pool, tc.f)
		var inv *deadletters.InvalidError
		if !errors.Is(err, deadletters.ErrInvalid) || !errors.As(err, &inv) || inv.Field != tc.field {
			t.Errorf("List(%+v) = %v, want an InvalidError for %s", tc.f, err, tc.field)
		}
	}

	got, err := deadletters.List(context.Background(), db.Pool, deadletters.Filter{Tenant: acme, Limit: 1, IncludePayload: true})
	if err != nil || len(got) != 1 || string(got[0].Payload) != `{"n": 1}` {
		t.Errorf("List with payloads = %+v, %v", got, err)
	}
	got, err = deadletters.List(context.Background(), db.Pool, deadletters.Filter{Limit: 1})
	if err != nil || len(got) != 1 || got[0].Payload != nil {
		t.Errorf("List without payloads = %+v, %v", got, err)
	}
}

// TestListCursor pages through dead letters some of which failed at the same instant (a
// removal dead-letters an endpoint's pending deliveries in one statement): every row comes
// once, in the order of one unpaged list, and rows failing meanwhile do not shift the pages.
func TestListCursor(t *testing.T) {
	t.Parallel()
	db := setup(t)
	for range 4 {
		insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: time.Hour})
	}
	// Three at one instant: the ties the id breaks.
	exec(t, db, `INSERT INTO webhook_dead_letter (delivery_id, event_type, payload, attempts, reason, enqueued_at, failed_at, tenant, endpoint_id)
		SELECT gen_random_uuid(), 'invoice.paid', '{}', 3, 'endpoint removed', now(), now() - interval '30 minutes', 'acme', $1::uuid
		FROM generate_series(1, 3)`, acmeEndpoint)
	insert(t, db, fixture{tenant: globex, endpoint: globexEndpoint, failedAgo: 20 * time.Minute})
	for range 2 {
		insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint, failedAgo: 10 * time.Minute})
	}
	all := list(t, db, deadletters.Filter{Tenant: acme, EndpointID: acmeEndpoint})
	if len(all) != 9 {
		t.Fatalf("the endpoint has %d dead letters, want 9", len(all))
	}

	var paged []int64
	f := deadletters.Filter{Tenant: acme, EndpointID: acmeEndpoint, Limit: 2}
	for page := 0; ; page++ {
		got, err := deadletters.List(context.Background(), db.Pool, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			break
		}
		paged = append(paged, ids(got)...)
		if page == 1 {
			// A new failure lands above the pages already read: never in a later one.
			insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint})
		}
		// The cursor goes through its text form, as through a URL.
		c, err := deadletters.ParseCursor(got[len(got)-1].Cursor().String())
		if err != nil {
			t.Fatal(err)
		}
		f.After = c
	}
	if !slices.Equal(paged, all) {
		t.Errorf("pages of 2 = %v, want the unpaged list %v", paged, all)
	}

	for _, bad := range []string{"", "12", "x_1", "1_x", "1_0", "1_-3"} {
		if _, err := deadletters.ParseCursor(bad); !errors.Is(err, deadletters.ErrInvalid) {
			t.Errorf("ParseCursor(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

// TestGetScoped: another tenant's dead letter is not found, with the error a missing one
// gives; the tenant's own and an admin's read work. ByDelivery likewise.
func TestGetScoped(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	own := insert(t, db, fixture{tenant: acme, endpoint: acmeEndpoint})
	theirs := insert(t, db, fixture{tenant: globex, endpoint: globexEndpoint})

	if d, err := deadletters.Get(ctx, db.Pool, own, acme); err != nil || d.ID != own || string(d.Payload) != `{"n": 1}` ||
		d.EndpointID == nil || *d.EndpointID != acmeEndpoint || d.Tenant == nil || *d.Tenant != "acme" {
		t.Errorf("Get of its own = %+v, %v", d, err)
	}
	if d, err := deadletters.Get(ctx, db.Pool, theirs, nil); err != nil || d.ID != theirs {
		t.Errorf("Get unscoped = %+v, %v", d, err)
	}
	_, errOther := deadletters.Get(ctx, db.Pool, theirs, acme)
	_, errMissing := deadletters.Get(ctx, db.Pool, 999999, acme)
	if !errors.Is(errOther, deadletters.ErrNotFound) || !errors.Is(errMissing, deadletters.ErrNotFound) {
		t.Fatalf("Get of another tenant's = %v, of a missing one = %v; want ErrNotFound for both", errOther, errMissing)
	}
	if want := "dead letter " + itoa(theirs) + " not found"; errOther.Error() != want {
		t.Errorf("Get of another tenant's: %q, want %q, as for a missing one (%q)", errOther, want, errMissing)
	}

	var delivery string
	if err := db.Pool.QueryRow(ctx, `SELECT delivery_id::text FROM webhook_dead_letter WHERE id = $1`, theirs).Scan(&delivery); err != nil {
		t.Fatal(err)
	}
	if _, err := deadletters.ByDelivery(ctx, db.Pool, delivery, acme); !errors.Is(err, deadletters.ErrNotFound) {
		t.Errorf("ByDelivery of another tenant's event = %v, want ErrNotFound", err)
	}
	if list, err := deadletters.ByDelivery(ctx, db.Pool, delivery, globex); err != nil || len(list) != 1 || list[0].ID != theirs {
		t.Errorf("ByDelivery of its own event = %+v, %v", list, err)
	}
}

// TestEndpointURLRedacted: a per-row URL's password is never returned.
func TestEndpointURLRedacted(t *testing.T) {
	t.Parallel()
	db := setup(t)
	id := insert(t, db, fixture{})
	exec(t, db, `UPDATE webhook_dead_letter SET endpoint_url = 'https://bot:hunter2@consumer.example/hook' WHERE id = $1`, id)
	d, err := deadletters.Get(context.Background(), db.Pool, id, nil)
	if err != nil || d.EndpointURL == nil || *d.EndpointURL != "https://bot:xxxxx@consumer.example/hook" {
		t.Errorf("Get: endpoint_url %v (%v), want the password redacted", d.EndpointURL, err)
	}
}
