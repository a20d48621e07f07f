package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/sql/endpoints"
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

// TestOperatorCommandsUnderTheDocumentedGrants runs every operator command (status, enqueue,
// dlq, endpoints, api-keys) as a role with exactly the grants docs/install.md gives operators,
// through the paths that touch other tables (a replay, a purge, an endpoint removed with its
// pending deliveries dead-lettered, a tenant change, a key revoked, secrets resealed): each
// succeeds and records its change in the audit trail. Until that block existed, operators
// were told to use the schema owner, and nothing said what a role of their own needs.
func TestOperatorCommandsUnderTheDocumentedGrants(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	role := sqltest.NewRole(t, db)
	for _, stmt := range documentedGrants(t, "**Operators**", "fluxhook_ops") {
		stmt = strings.TrimSuffix(stmt, " TO fluxhook_ops") + " TO " + role
		mustExec(t, db, stmt)
	}
	url := withUser(t, db.URL, role)
	key := endpoints.GenerateKey()
	op := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		getenv := func(k string) string {
			return map[string]string{"DATABASE_URL": url, "WEBHOOK_ENCRYPTION_KEY": key}[k]
		}
		if code := run(args, &stdout, &stderr, getenv); code != 0 {
			t.Fatalf("fluxhook %s as the operators' role exited %d: %s%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
		}
		return stdout.String()
	}
	id := func(out string) string {
		t.Helper()
		var v struct{ ID string }
		if err := json.Unmarshal([]byte(out), &v); err != nil || v.ID == "" {
			t.Fatalf("no id in %q: %v", out, err)
		}
		return v.ID
	}
	pending := func(endpoint string) {
		t.Helper()
		mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, endpoint_id, routed_at, tenant)
			SELECT 'order.created', '{}', id, now(), tenant FROM webhook_endpoints WHERE id = $1`, endpoint)
	}

	replayed := insertDeadLetter(t, db, deadLetterFixture{eventType: "order.paid", reason: "attempts exhausted", replayed: true})
	toReplay := insertDeadLetter(t, db, deadLetterFixture{eventType: "order.paid", reason: "attempts exhausted"})
	toPurge := insertDeadLetter(t, db, deadLetterFixture{eventType: "order.refunded", reason: "attempts exhausted"})
	insertDeadLetter(t, db, deadLetterFixture{eventType: "order.shipped", reason: "attempts exhausted"})

	op("status")
	op("enqueue", "--event-type", "order.created")
	ep := id(op("endpoints", "add", "--json", "--url", "https://consumer.example/hooks", "--tenant", "acme"))
	op("endpoints", "list")
	op("endpoints", "show", ep)
	op("endpoints", "update", ep, "--description", "billing")
	op("endpoints", "disable", ep)
	op("endpoints", "enable", ep)
	op("endpoints", "rotate-secret", ep)
	op("endpoints", "reencrypt")
	pending(ep)
	op("endpoints", "update", ep, "--tenant", "globex")
	pending(ep)
	op("endpoints", "remove", ep, "--pending", "dead-letter")
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1`, ep); n != 2 {
		t.Errorf("%d dead letters of the removed endpoint's pending deliveries, want 2", n)
	}

	op("dlq", "list")
	op("dlq", "show", itoa(toReplay))
	op("dlq", "replay", itoa(toReplay))
	op("dlq", "replay", "--all-matching", "--event-type", "order.shipped")
	op("dlq", "purge", itoa(toPurge))
	op("dlq", "purge", "--all-matching", "--replayed-only")
	if n := queryInt(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE id = ANY ($1)`, []int64{replayed, toPurge}); n != 0 {
		t.Errorf("%d of the purged dead letters left", n)
	}

	admin := id(op("api-keys", "add", "--json", "--admin"))
	op("api-keys", "add", "--tenant", "acme")
	op("api-keys", "list")
	op("api-keys", "list", "--portal")
	op("api-keys", "revoke", admin)

	for _, action := range []string{"endpoint.create", "endpoint.delete", "dead_letter.replay", "dead_letter.purge", "api_key.revoke"} {
		if n := queryInt(t, db, `SELECT count(*) FROM webhook_audit WHERE action = $1`, action); n == 0 {
			t.Errorf("no %s in the audit trail", action)
		}
	}
}
