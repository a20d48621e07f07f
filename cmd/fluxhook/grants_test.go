package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/sql/outbox"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestServeUnderTheDocumentedGrants runs serve as a role with exactly the grants
// docs/install.md gives dispatchers, the optional one left out: an endpoint ordering its
// streams delivers them in order (the hold-back reads the id sequence through a function that
// runs as the owner; with the caller's rights every claim failed, for every endpoint), another
// tenant's endpoint answering 410 is disabled (the lifecycle columns are granted), and the role
// cannot point an endpoint at another URL (nothing else of an endpoint is).
func TestServeUnderTheDocumentedGrants(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	role := createFluxhookRole(t, db, false)
	ordered := newHookConsumer(t, func(context.Context, *hookRequest) int { return http.StatusOK })
	gone := newHookConsumer(t, func(context.Context, *hookRequest) int { return http.StatusGone })
	add := func(args ...string) string {
		t.Helper()
		r := runCLI(t, db.URL, append([]string{"endpoints", "add", "--secret", serveSecret, "--json"}, args...)...)
		var ep struct{ ID string }
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &ep) != nil || ep.ID == "" {
			t.Fatalf("endpoints add %v exited %d: %s%s", args, r.code, r.stdout, r.stderr)
		}
		return ep.ID
	}
	orderedID := add("--url", ordered.URL(), "--tenant", "acme", "--ordering", "stream")
	goneID := add("--url", gone.URL(), "--tenant", "globex")

	env := faultEnv(withUser(t, db.URL, role), "")
	delete(env, "WEBHOOK_URL")
	p := startServe(t, "serve", env)
	var ids []string
	for range 3 {
		ids = append(ids, enqueueOne(t, db, outbox.Event{Tenant: "acme", StreamID: "order-1"}))
	}
	goneEvent := enqueueOne(t, db, outbox.Event{Tenant: "globex"})
	pollUntil(t, faultWait, "the ordered stream delivered and the 410 endpoint disabled", func() bool {
		return queryInt(t, db, `SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND status_code = 200`, orderedID) == 3 &&
			queryInt(t, db, `SELECT count(*) FROM webhook_endpoints WHERE id = $1 AND NOT enabled AND disabled_reason LIKE '%410%'`, goneID) == 1 &&
			queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1`, goneEvent) == 1
	})
	// Each answer (an empty body) is stored with its attempt, and the 410 as the dead letter's
	// last answer: schema 15's columns are written under the same grants.
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_delivery_log WHERE endpoint_id = $1 AND response_excerpt = ''`, orderedID); n != 3 {
		t.Errorf("%d of the ordered endpoint's attempts have the (empty) answer stored, want 3", n)
	}
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE delivery_id = $1 AND last_response_excerpt = ''`, goneEvent); n != 1 {
		t.Errorf("the 410's dead letter has no answer stored")
	}
	var got []string
	for _, r := range ordered.requests() {
		got = append(got, r.DeliveryID)
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Errorf("the ordered endpoint received %v, want the stream's events once each in order %v", got, ids)
	}
	p.stopCleanly()
	if logs := p.stderr.String(); strings.Contains(logs, `"msg":"claim failed"`) {
		t.Errorf("serve under the documented grants failed claims:\n%s", logs)
	}

	// The dispatcher's credentials cannot redirect an endpoint.
	as := sqltest.ConnectAs(t, db, role)
	if _, err := as.Exec(context.Background(), `UPDATE webhook_endpoints SET url = 'https://attacker.example/' WHERE id = $1`, orderedID); err == nil ||
		!strings.Contains(err.Error(), "permission denied") {
		t.Errorf("the dispatcher's role changed an endpoint's URL (err %v); want permission denied", err)
	}
}
