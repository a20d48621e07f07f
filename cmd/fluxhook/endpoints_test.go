package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// runEndpointsCLI is runCLI with extra environment variables (the encryption keys).
func runEndpointsCLI(t *testing.T, db *sqltest.DB, vars map[string]string, args ...string) cliResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return db.URL
		}
		return vars[k]
	}
	code := run(append([]string{"endpoints"}, args...), &stdout, &stderr, getenv)
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// endpointJSON is the shape scripts read from --json: the fields the tests rely on.
type endpointJSON struct {
	ID                    string            `json:"id"`
	URL                   string            `json:"url"`
	Description           string            `json:"description"`
	Tenant                string            `json:"tenant"`
	EventTypes            []string          `json:"event_types"`
	Scheme                string            `json:"scheme"`
	Enabled               bool              `json:"enabled"`
	DisabledReason        string            `json:"disabled_reason"`
	DisabledAt            *time.Time        `json:"disabled_at"`
	RetryRPS              int               `json:"retry_rps"`
	MaxConcurrency        int               `json:"max_concurrency"`
	Headers               map[string]string `json:"headers"`
	Secret                string            `json:"secret"`
	SecretEncrypted       bool              `json:"secret_encrypted"`
	PreviousUntil         *time.Time        `json:"previous_secret_expires_at"`
	PreviousSecretInGrace bool              `json:"previous_secret_in_grace"`
	PendingDeliveries     int64             `json:"pending_deliveries"`
	StoppedStreams        int64             `json:"stopped_streams"`
	Ordering              string            `json:"ordering"`
	OrderingFailure       string            `json:"ordering_failure"`
	// PermanentStatuses is nil for JSON null (WEBHOOK_PERMANENT_STATUSES).
	PermanentStatuses *[]int `json:"permanent_statuses"`
}

func decodeEndpoint(t *testing.T, r cliResult) endpointJSON {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exited %d: %s", r.code, r.stderr)
	}
	var e endpointJSON
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
		t.Fatalf("--json printed %q: %v", r.stdout, err)
	}
	return e
}

// addEndpoint runs `endpoints add --json` and returns the endpoint with its secret.
func addEndpoint(t *testing.T, db *sqltest.DB, vars map[string]string, args ...string) endpointJSON {
	t.Helper()
	return decodeEndpoint(t, runEndpointsCLI(t, db, vars, append([]string{"add", "--json"}, args...)...))
}

// storedSecret is the secret endpoint id signs with, as stored (opened with key, "" when the
// table holds it in clear): how a test sees a secret it gave, which the commands never print.
func storedSecret(t *testing.T, db *sqltest.DB, key, id string) string {
	t.Helper()
	c, err := endpoints.NewCipher(key, "")
	if err != nil {
		t.Fatal(err)
	}
	e, err := endpoints.Get(context.Background(), db.Pool, c, id)
	if err != nil {
		t.Fatal(err)
	}
	return e.Secret
}

// secretValue matches the secret printed in an add or rotate-secret text block.
func secretValue(t *testing.T, stdout string) string {
	t.Helper()
	_, rest, ok := strings.Cut(stdout, "  secret: ")
	if !ok {
		t.Fatalf("no secret printed:\n%s", stdout)
	}
	s, _, _ := strings.Cut(rest, "\n")
	return s
}

func TestEndpointsAddListShow(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)

	r := runEndpointsCLI(t, db, nil, "add", "--url", "https://consumer.example/hooks?token=tok123", "--event-types", "order.created, stream.*",
		"--tenant", "acme", "--scheme", "standard", "--description", "billing", "--retry-rps", "5", "--max-concurrency", "2",
		"--header", "X-Team=billing", "--header", "Authorization=Bearer hdr-secret")
	if r.code != 0 {
		t.Fatalf("add exited %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "WEBHOOK_ENCRYPTION_KEY is not set") || !strings.Contains(r.stderr, "in clear") {
		t.Errorf("add without a key does not warn that the secret is stored in clear: %q", r.stderr)
	}
	secret := secretValue(t, r.stdout)
	if !strings.HasPrefix(secret, "whsec_") || !strings.Contains(r.stdout, "Store this secret now") {
		t.Errorf("add printed:\n%s", r.stdout)
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(r.stdout, "added endpoint "), " ")

	j := addEndpoint(t, db, nil, "--url", "http://127.0.0.1:9000/hook", "--disabled")
	if j.ID == "" || len(j.Secret) != 64 || j.URL != "http://127.0.0.1:9000/hook" || j.Enabled || j.DisabledReason == "" ||
		j.Scheme != "fluxora" || j.EventTypes == nil || len(j.EventTypes) != 0 || j.Headers == nil || j.SecretEncrypted {
		t.Errorf("add --json = %+v", j)
	}
	secrets := []string{secret, j.Secret, "hdr-secret"}

	show := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", id, "--json"))
	if show.ID != id || show.Tenant != "acme" || strings.Join(show.EventTypes, "|") != "order.created|stream.*" || show.Scheme != "standard" ||
		show.RetryRPS != 5 || show.MaxConcurrency != 2 || show.Headers["X-Team"] != "billing" || show.Headers["Authorization"] != "xxxxx" ||
		show.Secret != "" || show.URL != "https://consumer.example/hooks?token=tok123" || !show.Enabled || show.Description != "billing" {
		t.Errorf("show --json = %+v", show)
	}

	r = runEndpointsCLI(t, db, nil, "list")
	if r.code != 0 {
		t.Fatalf("list exited %d: %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID ") || !strings.Contains(lines[0], "DISABLED REASON") {
		t.Fatalf("list printed:\n%s", r.stdout)
	}
	if !strings.Contains(lines[1], "https://consumer.example/hooks?…") || strings.Contains(r.stdout, "tok123") ||
		!strings.Contains(lines[1], "acme") || !strings.Contains(lines[1], "order.created,stream.*") || !strings.Contains(lines[1], "yes") {
		t.Errorf("list row of the first endpoint: %q", lines[1])
	}
	if !strings.Contains(lines[2], "no") || !strings.Contains(lines[2], "added disabled") || !strings.Contains(lines[2], "*") {
		t.Errorf("list row of the disabled endpoint: %q", lines[2])
	}

	r = runEndpointsCLI(t, db, nil, "list", "--json")
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 {
		t.Fatalf("list --json printed %q: %v", r.stdout, err)
	}
	for _, key := range []string{"id", "url", "enabled", "disabled_reason", "event_types", "scheme", "headers"} {
		if _, ok := list[0][key]; !ok {
			t.Errorf("list --json lacks %q: %v", key, list[0])
		}
	}
	if _, ok := list[0]["secret"]; ok {
		t.Errorf("list --json has a secret field")
	}

	r = runEndpointsCLI(t, db, nil, "show", id)
	for _, want := range []string{"id                  " + id, "tenant              acme", "event_types         order.created, stream.*",
		"scheme              standard", "secret              stored in clear", "previous_secret     none", "pending_deliveries  0",
		"headers             Authorization: xxxxx", "X-Team: billing", "retry_rps           5", "enabled             yes"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show lacks %q:\n%s", want, r.stdout)
		}
	}

	// Neither list nor show, text or JSON, ever prints a secret.
	for _, args := range [][]string{{"list"}, {"list", "--json"}, {"show", id}, {"show", id, "--json"}, {"show", j.ID}, {"show", j.ID, "--json"}} {
		r := runEndpointsCLI(t, db, nil, args...)
		for _, s := range secrets {
			if strings.Contains(r.stdout+r.stderr, s) {
				t.Errorf("endpoints %v printed the secret %q:\n%s", args, s, r.stdout)
			}
		}
	}
}

func TestEndpointsListEmpty(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	if r := runEndpointsCLI(t, db, nil, "list"); r.code != 0 || !strings.HasPrefix(r.stdout, "no endpoints") {
		t.Errorf("empty list: exit %d, %q", r.code, r.stdout)
	}
	if r := runEndpointsCLI(t, db, nil, "list", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("empty list --json: exit %d, %q", r.code, r.stdout)
	}
}

func TestEndpointsEncryptedAtRest(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	key := map[string]string{"WEBHOOK_ENCRYPTION_KEY": endpoints.GenerateKey()}

	r := runEndpointsCLI(t, db, key, "add", "--url", "https://consumer.example/", "--secret-file", writeSecretFile(t, "secret", "my-plaintext-secret-42\n"))
	if r.code != 0 || strings.Contains(r.stderr, "warning") {
		t.Fatalf("add with a key: exit %d, stderr %q", r.code, r.stderr)
	}
	if strings.Contains(r.stdout, "my-plaintext-secret-42") || storedSecret(t, db, key["WEBHOOK_ENCRYPTION_KEY"], strings.Fields(r.stdout)[2]) != "my-plaintext-secret-42" {
		t.Errorf("add --secret-file printed the secret it was given, or did not store it:\n%s", r.stdout)
	}
	rotated := decodeEndpoint(t, runEndpointsCLI(t, db, key, "rotate-secret", "--json", strings.Fields(r.stdout)[2]))
	var table string
	if err := db.Pool.QueryRow(context.Background(), "SELECT string_agg(e::text, ' ') FROM webhook_endpoints e").Scan(&table); err != nil {
		t.Fatal(err)
	}
	for _, plain := range []string{"my-plaintext-secret-42", rotated.Secret} {
		if strings.Contains(table, plain) {
			t.Errorf("the table holds the secret %q in clear: %s", plain, table)
		}
	}
	if !strings.Contains(table, "enc:v2:") {
		t.Errorf("the table holds no sealed secret: %s", table)
	}
	show := decodeEndpoint(t, runEndpointsCLI(t, db, key, "show", "--json", rotated.ID))
	if !show.SecretEncrypted || !show.PreviousSecretInGrace {
		t.Errorf("show --json with a key: %+v", show)
	}
	if r := runEndpointsCLI(t, db, key, "show", rotated.ID); !strings.Contains(r.stdout, "encrypted at rest") ||
		!strings.Contains(r.stdout, "still signs until") {
		t.Errorf("show with a key:\n%s", r.stdout)
	}
	// Without the key, listing and showing still work (no secret is needed for them), and
	// show says what the dispatcher will run into.
	if r := runEndpointsCLI(t, db, nil, "list"); r.code != 0 || !strings.Contains(r.stdout, rotated.ID) {
		t.Errorf("list without the key: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
	if r := runEndpointsCLI(t, db, nil, "show", rotated.ID); r.code != 0 || !strings.Contains(r.stdout, "problem") ||
		!strings.Contains(r.stdout, "WEBHOOK_ENCRYPTION_KEY is not set") {
		t.Errorf("show without the key: exit %d\n%s", r.code, r.stdout)
	}
	// A malformed key is a configuration error named as such.
	r = runEndpointsCLI(t, db, map[string]string{"WEBHOOK_ENCRYPTION_KEY": "short"}, "list")
	if r.code != 2 || !strings.Contains(r.stderr, "WEBHOOK_ENCRYPTION_KEY") {
		t.Errorf("a malformed key: exit %d, %q", r.code, r.stderr)
	}
}

func TestEndpointsUpdate(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	e := addEndpoint(t, db, nil, "--url", "https://a.example/", "--tenant", "acme", "--event-types", "a.*", "--header", "X-One=1", "--header", "X-Two=2")

	r := runEndpointsCLI(t, db, nil, "update", e.ID, "--url", "https://b.example/", "--event-types", "", "--tenant", "",
		"--description", "moved", "--max-concurrency", "9", "--header", "x-one=uno", "--header", "X-Three=3")
	if r.code != 0 || !strings.Contains(r.stdout, "updated endpoint "+e.ID) || strings.Contains(r.stdout, "secret") {
		t.Fatalf("update: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", e.ID))
	if got.URL != "https://b.example/" || got.Tenant != "" || len(got.EventTypes) != 0 || got.Description != "moved" ||
		got.MaxConcurrency != 9 || len(got.Headers) != 3 || got.Headers["x-one"] != "uno" || got.Headers["X-Two"] != "2" {
		t.Errorf("after update: %+v", got)
	}
	got = decodeEndpoint(t, runEndpointsCLI(t, db, nil, "update", e.ID, "--clear-headers", "--header", "X-Only=1", "--json"))
	if len(got.Headers) != 1 || got.Headers["X-Only"] != "1" || got.Secret != "" {
		t.Errorf("update --clear-headers --header --json: %+v", got)
	}

	// A scheme change comes with a new secret, printed once.
	r = runEndpointsCLI(t, db, nil, "update", e.ID, "--scheme", "standard")
	if r.code != 0 || !strings.HasPrefix(secretValue(t, r.stdout), "whsec_") || !strings.Contains(r.stderr, "WEBHOOK_ENCRYPTION_KEY is not set") {
		t.Errorf("update --scheme: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	got = decodeEndpoint(t, runEndpointsCLI(t, db, nil, "update", e.ID, "--scheme", "fluxora", "--secret", "chosen-secret", "--json"))
	if got.Scheme != "fluxora" || got.Secret != "" || storedSecret(t, db, "", e.ID) != "chosen-secret" {
		t.Errorf("update --scheme --secret --json: %+v", got)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--url", "http://example.com/"}, "--url: invalid endpoint URL"},
		{[]string{"--event-types", "a.*.b"}, "--event-types:"},
		{[]string{"--header", "Webhook-Signature=x"}, "--header:"},
		{[]string{"--header", "novalue"}, "-header"},
		{[]string{"--retry-rps", "-1"}, "-retry-rps"},
		{[]string{"--scheme", "hmac"}, "--scheme:"},
		{[]string{"--scheme", "standard", "--secret", "not-whsec"}, "--secret:"},
		{[]string{"--secret", "s"}, "rotate-secret"},
		{[]string{"--tenant", " acme"}, "--tenant:"},
		{[]string{"--description", strings.Repeat("d", 1025)}, "--description: 1025 bytes; at most 1024"},
		{[]string{"--url", "https://b.example/?" + strings.Repeat("q", 2048)}, "--url:"},
		{[]string{"--event-types", strings.Repeat("e", 201)}, "--event-types:"},
		{nil, "needs something to change"},
		{[]string{"--json"}, "needs something to change"},
	} {
		r := runEndpointsCLI(t, db, nil, append([]string{"update", e.ID}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("update %v: exit %d, %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", e.ID)); got.URL != "https://b.example/" || got.Scheme != "fluxora" {
		t.Errorf("a refused update changed the endpoint: %+v", got)
	}
}

// TestEndpointsOrdering: --ordering and --ordering-failure are set by add and update like the
// other flags, validated by the store (exit 2 naming the flag), and printed by list and show.
func TestEndpointsOrdering(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)

	streamIndex := func() int {
		return queryInt(t, db, `SELECT count(*) FROM pg_index WHERE indexrelid = to_regclass('webhook_outbox_stream_idx') AND indisvalid`)
	}
	plain := addEndpoint(t, db, nil, "--url", "https://plain.example/")
	if plain.Ordering != "none" || plain.OrderingFailure != "skip" {
		t.Errorf("add without ordering flags: ordering %q, ordering_failure %q; want none, skip", plain.Ordering, plain.OrderingFailure)
	}
	if streamIndex() != 0 {
		t.Error("an unordered endpoint created the stream index (producers would pay for it)")
	}
	ordered := addEndpoint(t, db, nil, "--url", "https://ordered.example/", "--ordering", "stream", "--ordering-failure", "stop")
	if ordered.Ordering != "stream" || ordered.OrderingFailure != "stop" {
		t.Errorf("add --ordering stream --ordering-failure stop --json = %+v", ordered)
	}
	if streamIndex() != 1 {
		t.Error("add --ordering stream did not create the stream index ordered delivery needs")
	}
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", ordered.ID)); got.Ordering != "stream" || got.OrderingFailure != "stop" {
		t.Errorf("show --json of the ordered endpoint = %+v", got)
	}

	r := runEndpointsCLI(t, db, nil, "show", ordered.ID)
	for _, want := range []string{"ordering            stream (each stream's events one at a time, in order)\n",
		"ordering_failure    stop (a dead-lettered event stops its stream until it is replayed or purged)\n"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("show of the ordered endpoint lacks %q: exit %d\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
	r = runEndpointsCLI(t, db, nil, "show", plain.ID)
	for _, want := range []string{"ordering            none (no order between events)\n",
		"ordering_failure    skip (applies with ordering stream)\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show of the unordered endpoint lacks %q:\n%s", want, r.stdout)
		}
	}

	r = runEndpointsCLI(t, db, nil, "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 || !strings.Contains(lines[0], "  ORDERING  ") {
		t.Fatalf("list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if f := strings.Fields(lines[1]); len(f) < 5 || f[0] != plain.ID || f[4] != "none" {
		t.Errorf("list row of the unordered endpoint: %q", lines[1])
	}
	if f := strings.Fields(lines[2]); len(f) < 5 || f[0] != ordered.ID || f[4] != "stream/stop" {
		t.Errorf("list row of the ordered endpoint: %q", lines[2])
	}
	r = runEndpointsCLI(t, db, nil, "list", "--json")
	var list []endpointJSON
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 ||
		list[0].Ordering != "none" || list[0].OrderingFailure != "skip" || list[1].Ordering != "stream" || list[1].OrderingFailure != "stop" {
		t.Errorf("list --json = %q (%v)", r.stdout, err)
	}

	// update sets each one alone, and is something to change on its own.
	got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "update", plain.ID, "--ordering", "stream", "--json"))
	if got.Ordering != "stream" || got.OrderingFailure != "skip" || got.URL != "https://plain.example/" {
		t.Errorf("update --ordering stream --json = %+v", got)
	}
	if r := runEndpointsCLI(t, db, nil, "update", plain.ID, "--ordering-failure", "stop"); r.code != 0 || !strings.Contains(r.stdout, "updated endpoint "+plain.ID) {
		t.Errorf("update --ordering-failure stop: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", plain.ID)); got.Ordering != "stream" || got.OrderingFailure != "stop" {
		t.Errorf("after update --ordering-failure stop: %+v", got)
	}
	if r := runEndpointsCLI(t, db, nil, "list"); !strings.Contains(r.stdout, "stream/stop") || strings.Contains(r.stdout, "none") {
		t.Errorf("list after the updates:\n%s", r.stdout)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"add", "--url", "https://a.example/", "--ordering", "fifo"}, `--ordering: "fifo" is not an ordering; use "none"`},
		{[]string{"add", "--url", "https://a.example/", "--ordering-failure", "halt"}, `--ordering-failure: "halt" is not`},
		{[]string{"update", ordered.ID, "--ordering", "Stream"}, `or "stream"`},
		{[]string{"update", ordered.ID, "--ordering-failure", "pause"}, `use "skip"`},
		{[]string{"update", ordered.ID, "--ordering-failure", ""}, `--ordering-failure: "" is not`},
		{[]string{"update", ordered.ID, "--ordering"}, "flag needs an argument: --ordering"},
	} {
		r := runEndpointsCLI(t, db, nil, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("endpoints %q: exit %d, %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_endpoints`); n != 2 {
		t.Errorf("refused adds left %d endpoints, want 2", n)
	}
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", ordered.ID)); got.Ordering != "stream" || got.OrderingFailure != "stop" {
		t.Errorf("a refused update changed the endpoint: %+v", got)
	}
	if r := runEndpointsCLI(t, db, nil, "update", ordered.ID); r.code != 2 || !strings.Contains(r.stderr, "--ordering, --ordering-failure") {
		t.Errorf("update with nothing to change: exit %d, %q", r.code, r.stderr)
	}
}

func TestEndpointsDisableEnable(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	e := addEndpoint(t, db, nil, "--url", "https://a.example/")

	r := runEndpointsCLI(t, db, nil, "disable", e.ID, "--reason", "consumer down for maintenance")
	if r.code != 0 || !strings.Contains(r.stdout, "disabled endpoint "+e.ID+": consumer down for maintenance") {
		t.Fatalf("disable: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", e.ID))
	if got.Enabled || got.DisabledReason != "consumer down for maintenance" || got.DisabledAt == nil {
		t.Errorf("after disable: %+v", got)
	}
	if r := runEndpointsCLI(t, db, nil, "list"); !strings.Contains(r.stdout, "consumer down for maintenance") {
		t.Errorf("list does not show the disabled reason:\n%s", r.stdout)
	}
	got = decodeEndpoint(t, runEndpointsCLI(t, db, nil, "disable", "--json", e.ID))
	if got.DisabledReason != endpoints.DefaultDisabledReason {
		t.Errorf("disable without --reason: %+v", got)
	}
	got = decodeEndpoint(t, runEndpointsCLI(t, db, nil, "enable", e.ID, "--json"))
	if !got.Enabled || got.DisabledReason != "" || got.DisabledAt != nil {
		t.Errorf("enable --json: %+v", got)
	}
	if r := runEndpointsCLI(t, db, nil, "enable", e.ID); r.code != 0 || !strings.Contains(r.stdout, "enabled endpoint "+e.ID) {
		t.Errorf("enable: exit %d, %s", r.code, r.stdout)
	}
}

func TestEndpointsRotateSecret(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	e := addEndpoint(t, db, nil, "--url", "https://a.example/", "--scheme", "standard")

	r := runEndpointsCLI(t, db, nil, "rotate-secret", e.ID)
	if r.code != 0 || !strings.Contains(r.stdout, "keeps signing until") {
		t.Fatalf("rotate-secret: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	first := secretValue(t, r.stdout)
	if !strings.HasPrefix(first, "whsec_") || first == e.Secret {
		t.Errorf("rotate-secret printed the secret %q", first)
	}
	got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", e.ID))
	if !got.PreviousSecretInGrace || got.PreviousUntil == nil || time.Until(*got.PreviousUntil) < 23*time.Hour {
		t.Errorf("after rotate-secret: %+v", got)
	}

	got = decodeEndpoint(t, runEndpointsCLI(t, db, nil, "rotate-secret", e.ID, "--grace", "1h", "--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "--json"))
	if got.Secret != "" || storedSecret(t, db, "", e.ID) != "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" || got.PreviousUntil == nil || time.Until(*got.PreviousUntil) > time.Hour {
		t.Errorf("rotate-secret --grace 1h --secret --json: %+v", got)
	}
	r = runEndpointsCLI(t, db, nil, "rotate-secret", e.ID, "--grace", "0")
	if r.code != 0 || !strings.Contains(r.stdout, "no longer signs") {
		t.Errorf("rotate-secret --grace 0: exit %d\n%s", r.code, r.stdout)
	}
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", e.ID)); got.PreviousSecretInGrace || got.PreviousUntil != nil {
		t.Errorf("after --grace 0 a previous secret remains: %+v", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--secret", "not-whsec"}, "--secret:"},
		{[]string{"--grace", "-1h"}, "--grace"},
		{[]string{"--grace", "soon"}, "-grace"},
	} {
		r := runEndpointsCLI(t, db, nil, append([]string{"rotate-secret", e.ID}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("rotate-secret %v: exit %d, %q", tc.args, r.code, r.stderr)
		}
	}
}

// TestEndpointsShowStoppedStreams: show counts the endpoint's ordered streams stopped at a
// dead letter and says how to find them; an endpoint with none shows 0.
func TestEndpointsShowStoppedStreams(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	e := addEndpoint(t, db, nil, "--url", "https://ordered.example/")
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", e.ID)); got.StoppedStreams != 0 {
		t.Errorf("show stopped_streams = %d before any stream stopped, want 0", got.StoppedStreams)
	}
	mustExec(t, db, `INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key, created_at, deferred_reason)
		VALUES ('s1', 'order.created', '{}', $1::uuid, now(), 100, 'infinity', 'stream stopped: permanent: HTTP 410'),
		       ('s2', 'order.created', '{}', $1::uuid, now(), 200, 'infinity', 'stream stopped: attempts exhausted'),
		       ('s1', 'order.created', '{}', $1::uuid, now(), 101, now(), NULL)`, e.ID)
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", e.ID)); got.StoppedStreams != 2 || got.PendingDeliveries != 3 {
		t.Errorf("show --json: stopped_streams %d, pending_deliveries %d; want 2 and 3", got.StoppedStreams, got.PendingDeliveries)
	}
	r := runEndpointsCLI(t, db, nil, "show", e.ID)
	want := regexp.MustCompile(`(?m)^stopped_streams +2, each held at a dead letter until it is replayed or purged \(fluxhook dlq list --endpoint-id ` +
		regexp.QuoteMeta(e.ID) + `\)$`)
	if !want.MatchString(r.stdout) {
		t.Errorf("show lacks a line matching %s:\n%s", want, r.stdout)
	}
}

func TestEndpointsRemove(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	pendingFor := func(id string, n int) {
		t.Helper()
		mustExec(t, db, `INSERT INTO webhook_outbox (event_type, payload, endpoint_id, routed_at)
			SELECT 'order.created', '{}', $1::uuid, now() FROM generate_series(1, $2)`, id, n)
	}

	idle := addEndpoint(t, db, nil, "--url", "https://idle.example/")
	if r := runEndpointsCLI(t, db, nil, "remove", idle.ID); r.code != 0 || !strings.Contains(r.stdout, "removed endpoint "+idle.ID) {
		t.Errorf("remove: exit %d, %s%s", r.code, r.stdout, r.stderr)
	}

	busy := addEndpoint(t, db, nil, "--url", "https://busy.example/")
	pendingFor(busy.ID, 2)
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", busy.ID)); got.PendingDeliveries != 2 {
		t.Errorf("show pending_deliveries = %d, want 2", got.PendingDeliveries)
	}
	r := runEndpointsCLI(t, db, nil, "remove", busy.ID)
	if r.code != 1 || !strings.Contains(r.stderr, "2 deliveries pending") || !strings.Contains(r.stderr, "--pending dead-letter") ||
		!strings.Contains(r.stderr, "--pending drop") {
		t.Errorf("remove with pending deliveries: exit %d, %q", r.code, r.stderr)
	}
	r = runEndpointsCLI(t, db, nil, "remove", busy.ID, "--pending", "dead-letter", "--json")
	var rep removeReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep != (removeReport{ID: busy.ID, Removed: true, DeadLettered: 2}) {
		t.Errorf("remove --pending dead-letter --json: %q, %v", r.stdout, err)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1::uuid AND reason = 'endpoint removed'`, busy.ID); n != 2 {
		t.Errorf("%d dead letters, want 2", n)
	}

	dropped := addEndpoint(t, db, nil, "--url", "https://drop.example/")
	pendingFor(dropped.ID, 3)
	r = runEndpointsCLI(t, db, nil, "remove", "--pending", "drop", dropped.ID)
	if r.code != 0 || !strings.Contains(r.stdout, "3 pending deliveries dropped") {
		t.Errorf("remove --pending drop: exit %d, %s%s", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1::uuid`, dropped.ID); n != 0 {
		t.Errorf("drop left %d rows", n)
	}
	if r := runEndpointsCLI(t, db, nil, "remove", dropped.ID, "--pending", "later"); r.code != 2 || !strings.Contains(r.stderr, "--pending:") {
		t.Errorf("remove --pending later: exit %d, %q", r.code, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_endpoints`); n != 0 {
		t.Errorf("%d endpoints left", n)
	}
}

func TestEndpointsReencrypt(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	oldKey, newKey := endpoints.GenerateKey(), endpoints.GenerateKey()
	sealed := addEndpoint(t, db, map[string]string{"WEBHOOK_ENCRYPTION_KEY": oldKey}, "--url", "https://a.example/")
	mustExec(t, db, `INSERT INTO webhook_endpoints (url, secret, headers) VALUES ('https://b.example/', 'inserted-in-clear', '{"Authorization": "Bearer clear-token"}')`)

	if r := runEndpointsCLI(t, db, nil, "reencrypt"); r.code != 1 || !strings.Contains(r.stderr, "WEBHOOK_ENCRYPTION_KEY is not set") {
		t.Errorf("reencrypt without a key: exit %d, %q", r.code, r.stderr)
	}
	if r := runEndpointsCLI(t, db, map[string]string{"WEBHOOK_ENCRYPTION_KEY": newKey}, "reencrypt"); r.code != 1 ||
		!strings.Contains(r.stderr, sealed.ID) || !strings.Contains(r.stderr, "nothing was re-sealed") {
		t.Errorf("reencrypt without the old key: exit %d, %q", r.code, r.stderr)
	}
	rotating := map[string]string{"WEBHOOK_ENCRYPTION_KEY": newKey, "WEBHOOK_ENCRYPTION_KEY_PREVIOUS": oldKey}
	r := runEndpointsCLI(t, db, rotating, "reencrypt")
	if r.code != 0 || !strings.Contains(r.stdout, "re-encrypted the secrets of 2 endpoints with WEBHOOK_ENCRYPTION_KEY (secrets: 2, header values: 1)") ||
		!strings.Contains(r.stdout, "WEBHOOK_ENCRYPTION_KEY_PREVIOUS can be removed") {
		t.Errorf("reencrypt: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_endpoints e WHERE secret LIKE 'enc:v2:%' AND e::text NOT LIKE '%clear-token%'`); n != 2 {
		t.Errorf("%d sealed secrets after reencrypt, want 2", n)
	}
	r = runEndpointsCLI(t, db, map[string]string{"WEBHOOK_ENCRYPTION_KEY": newKey}, "reencrypt", "--json")
	if r.code != 0 || strings.Join(strings.Fields(r.stdout), "") != `{"reencrypted":0,"secrets":0,"headers":0}` {
		t.Errorf("reencrypt --json again: exit %d, %q", r.code, r.stdout)
	}
	// The new key alone opens the secret that the old one sealed.
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, map[string]string{"WEBHOOK_ENCRYPTION_KEY": newKey}, "show", "--json", sealed.ID)); !got.SecretEncrypted {
		t.Errorf("show after reencrypt: %+v", got)
	}
	if r := runEndpointsCLI(t, db, map[string]string{"WEBHOOK_ENCRYPTION_KEY": newKey}, "show", sealed.ID); strings.Contains(r.stdout, "problem") {
		t.Errorf("the new key does not open the re-encrypted secret:\n%s", r.stdout)
	}
}

func TestEndpointsErrors(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	missing := "0b6f3c1e-9a4d-4c52-8f0e-3d2a1b4c5d6e"
	for _, args := range [][]string{
		{"show", missing}, {"update", missing, "--url", "https://a.example/"}, {"disable", missing}, {"enable", missing},
		{"rotate-secret", missing}, {"remove", missing}, {"show", strings.ToUpper(missing)},
	} {
		r := runEndpointsCLI(t, db, nil, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "endpoint "+missing+" not found; list them with fluxhook endpoints list") {
			t.Errorf("endpoints %v: exit %d, %q; want 1 and not found", args, r.code, r.stderr)
		}
	}
	if r := runEndpointsCLI(t, db, nil, "show", "42"); r.code != 1 || !strings.Contains(r.stderr, `endpoint "42" not found`) || !strings.Contains(r.stderr, "UUID") {
		t.Errorf("show 42: exit %d, %q", r.code, r.stderr)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "needs a subcommand"},
		{[]string{"frobnicate"}, `unknown endpoints subcommand "frobnicate"`},
		{[]string{"add"}, "--url is required"},
		{[]string{"add", "--url", "https://a.example/", "--retry-rps", "x"}, "-retry-rps"},
		{[]string{"add", "--url", "https://a.example/", "--retry-rps", "-2"}, "--retry-rps:"},
		{[]string{"add", "--url", "ftp://a.example/"}, "--url:"},
		{[]string{"add", "--url", "https://u:p@a.example/"}, "--url:"},
		{[]string{"add", "--url", "https://a.example/", "--event-types", "*"}, "--event-types:"},
		{[]string{"add", "--url", "https://a.example/", "--header", "Content-Type=x"}, "--header:"},
		{[]string{"add", "--url", "https://a.example/", "--scheme", "standard", "--secret", "plain"}, "--secret:"},
		{[]string{"add", "--url", "https://a.example/", "extra"}, "unexpected argument"},
		{[]string{"show"}, "exactly one endpoint id"},
		{[]string{"show", "a", "b"}, "exactly one endpoint id"},
		{[]string{"list", "--nope"}, "-nope"},
		{[]string{"reencrypt", "x"}, "unexpected argument"},
	} {
		r := runEndpointsCLI(t, db, nil, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("endpoints %v: exit %d, %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_endpoints`); n != 0 {
		t.Errorf("refused commands added %d endpoints", n)
	}

	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		if r := runEndpointsCLI(t, db, nil, args...); r.code != 0 || !strings.Contains(r.stdout, "usage: fluxhook endpoints add|list|") {
			t.Errorf("endpoints %v: exit %d, %q", args, r.code, r.stdout)
		}
	}
	for _, sub := range []string{"add", "list", "show", "update", "disable", "enable", "rotate-secret", "remove", "reencrypt"} {
		if r := runEndpointsCLI(t, db, nil, sub, "-h"); r.code != 0 || !strings.Contains(r.stdout, "usage: fluxhook endpoints "+sub) {
			t.Errorf("endpoints %s -h: exit %d, %q", sub, r.code, r.stdout)
		}
	}
	if r := run([]string{"help"}, new(bytes.Buffer), new(bytes.Buffer), func(string) string { return "" }); r != 0 {
		t.Errorf("help exited %d", r)
	}
	var out bytes.Buffer
	run([]string{"help"}, &out, new(bytes.Buffer), func(string) string { return "" })
	if !strings.Contains(out.String(), "endpoints") {
		t.Errorf("fluxhook help does not list endpoints:\n%s", out.String())
	}
}

// TestEndpointsPermanentStatuses: --permanent-statuses is read as WEBHOOK_PERMANENT_STATUSES
// is (a list, or none) by add and update; update's "" goes back to the setting; --json says
// null for the setting and [] for none, show says which; a bad list exits 2 naming the flag.
func TestEndpointsPermanentStatuses(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	statuses := func(e endpointJSON) string {
		if e.PermanentStatuses == nil {
			return "null"
		}
		return fmt.Sprint(*e.PermanentStatuses)
	}

	if e := addEndpoint(t, db, nil, "--url", "https://plain.example/"); statuses(e) != "null" {
		t.Errorf("add without --permanent-statuses: %s, want null", statuses(e))
	}
	e := addEndpoint(t, db, nil, "--url", "https://a.example/", "--permanent-statuses", "422, 404,400")
	if statuses(e) != "[400 404 422]" {
		t.Errorf("add --permanent-statuses '422, 404,400': %s, want [400 404 422]", statuses(e))
	}
	r := runEndpointsCLI(t, db, nil, "show", e.ID)
	if !strings.Contains(r.stdout, "permanent_statuses  400, 404, 422 and 410") {
		t.Errorf("show lacks the permanent statuses:\n%s", r.stdout)
	}
	for _, step := range []struct{ arg, want, show string }{
		{"none", "[]", "none (only 410"},
		{"404", "[404]", "404 and 410"},
		{"", "null", "default (WEBHOOK_PERMANENT_STATUSES)"},
	} {
		got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "update", e.ID, "--json", "--permanent-statuses", step.arg))
		if statuses(got) != step.want {
			t.Errorf("update --permanent-statuses %q: %s, want %s", step.arg, statuses(got), step.want)
		}
		if r := runEndpointsCLI(t, db, nil, "show", e.ID); !strings.Contains(r.stdout, "permanent_statuses  "+step.show) {
			t.Errorf("after update --permanent-statuses %q, show lacks %q:\n%s", step.arg, step.show, r.stdout)
		}
	}
	for _, args := range [][]string{
		{"add", "--url", "https://b.example/", "--permanent-statuses", "404,200"},
		{"add", "--url", "https://b.example/", "--permanent-statuses", "4o4"},
		{"update", e.ID, "--permanent-statuses", "600"},
		{"update", e.ID, "--permanent-statuses", "none,404"},
	} {
		if r := runEndpointsCLI(t, db, nil, args...); r.code != 2 || !strings.Contains(r.stderr, "--permanent-statuses:") ||
			!strings.Contains(r.stderr, "300 to 599") {
			t.Errorf("endpoints %v: exit %d, %q; want 2 naming --permanent-statuses", args, r.code, r.stderr)
		}
	}
	if got := decodeEndpoint(t, runEndpointsCLI(t, db, nil, "show", "--json", e.ID)); statuses(got) != "null" {
		t.Errorf("a refused update changed the statuses: %s", statuses(got))
	}
}

// TestEndpointsListShowsPermanentStatuses: `endpoints list` has a PERMANENT column saying what
// `show` says first of each endpoint's permanent statuses: default for NULL (the setting), none
// for '{}', else the endpoint's own statuses.
func TestEndpointsListShowsPermanentStatuses(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	want := map[string]struct{ list, show string }{
		addEndpoint(t, db, nil, "--url", "https://default.example/").ID:                                    {"default", "default (WEBHOOK_PERMANENT_STATUSES)"},
		addEndpoint(t, db, nil, "--url", "https://none.example/", "--permanent-statuses", "none").ID:       {"none", "none (only 410"},
		addEndpoint(t, db, nil, "--url", "https://own.example/", "--permanent-statuses", "422,404,400").ID: {"400,404,422", "400, 404, 422 and 410"},
	}
	r := runEndpointsCLI(t, db, nil, "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 4 {
		t.Fatalf("list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if f := strings.Fields(lines[0]); len(f) < 6 || f[5] != "PERMANENT" {
		t.Fatalf("list's header has no PERMANENT column after ORDERING: %q", lines[0])
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		w, ok := want[f[0]]
		if !ok || len(f) < 6 || f[5] != w.list {
			t.Errorf("list row %q: want PERMANENT %q", line, w.list)
			continue
		}
		if r := runEndpointsCLI(t, db, nil, "show", f[0]); !strings.Contains(r.stdout, "permanent_statuses  "+w.show) {
			t.Errorf("show of %s lacks %q, which list's %q stands for:\n%s", f[0], w.show, w.list, r.stdout)
		}
		delete(want, f[0])
	}
	if len(want) > 0 {
		t.Errorf("list left out %v", want)
	}
}
