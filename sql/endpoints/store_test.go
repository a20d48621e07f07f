package endpoints_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/send"
)

func newCipher(t *testing.T, key, previous string) *endpoints.Cipher {
	t.Helper()
	c, err := endpoints.NewCipher(key, previous)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustAdd(t *testing.T, db *sqltest.DB, c *endpoints.Cipher, n endpoints.New) endpoints.Endpoint {
	t.Helper()
	e, err := endpoints.Add(context.Background(), db.Pool, c, n)
	if err != nil {
		t.Fatalf("Add(%+v): %v", n, err)
	}
	return e
}

func mustGet(t *testing.T, db *sqltest.DB, c *endpoints.Cipher, id string) endpoints.Endpoint {
	t.Helper()
	e, err := endpoints.Get(context.Background(), db.Pool, c, id)
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return e
}

// rowText is the endpoint's whole row as PostgreSQL prints it: what anyone with read access
// to the table (or a dump of it) sees.
func rowText(t *testing.T, db *sqltest.DB, id string) string {
	t.Helper()
	var s string
	if err := db.Pool.QueryRow(context.Background(), "SELECT e::text FROM webhook_endpoints e WHERE id = $1::uuid", id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func storedSecrets(t *testing.T, db *sqltest.DB, id string) (string, *string) {
	t.Helper()
	var secret string
	var previous *string
	err := db.Pool.QueryRow(context.Background(), "SELECT secret, previous_secret FROM webhook_endpoints WHERE id = $1::uuid", id).Scan(&secret, &previous)
	if err != nil {
		t.Fatal(err)
	}
	return secret, previous
}

func TestAddGetRoundTrip(t *testing.T) {
	t.Parallel()
	for _, withKey := range []bool{false, true} {
		t.Run(map[bool]string{false: "clear", true: "sealed"}[withKey], func(t *testing.T) {
			t.Parallel()
			db := sqltest.NewMigrated(t)
			var c *endpoints.Cipher
			if withKey {
				c = newCipher(t, endpoints.GenerateKey(), "")
			}
			n := endpoints.New{
				URL:            "https://consumer.example/hooks?token=abc",
				Description:    "billing",
				Tenant:         "acme",
				EventTypes:     []string{"order.created", "stream.*"},
				Scheme:         endpoints.SchemeStandard,
				RetryRPS:       5,
				MaxConcurrency: 3,
				Headers:        map[string]string{"X-Team": "billing", "Authorization": "Bearer t"},
			}
			added := mustAdd(t, db, c, n)
			if !strings.HasPrefix(added.Secret, "whsec_") {
				t.Fatalf("generated standard secret %q lacks whsec_", added.Secret)
			}
			if key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(added.Secret, "whsec_")); err != nil || len(key) != 24 {
				t.Errorf("generated standard secret decodes to %d bytes, %v; want 24", len(key), err)
			}
			got := mustGet(t, db, c, added.ID)
			if got.URL != n.URL || got.Description != n.Description || got.Tenant != n.Tenant ||
				!slices.Equal(got.EventTypes, n.EventTypes) || got.Scheme != n.Scheme || got.RetryRPS != 5 ||
				got.MaxConcurrency != 3 || !maps.Equal(got.Headers, n.Headers) || !got.Enabled ||
				got.Secret != added.Secret || got.PreviousSecret != "" || got.CreatedAt.IsZero() {
				t.Errorf("Get = %+v\nafter Add(%+v) = %+v", got, n, added)
			}
			// Upper case ids (as some tools print UUIDs) find the endpoint too.
			if e := mustGet(t, db, c, strings.ToUpper(added.ID)); e.ID != added.ID {
				t.Errorf("Get(upper case id) = %s", e.ID)
			}
			stored, _ := storedSecrets(t, db, added.ID)
			if endpoints.IsSealed(stored) != withKey {
				t.Errorf("stored secret sealed = %v, want %v", endpoints.IsSealed(stored), withKey)
			}

			// Defaults: fluxora, every event, no tenant, enabled, limits from the dispatcher.
			def := mustAdd(t, db, c, endpoints.New{URL: "http://127.0.0.1:8080/hook"})
			if raw, err := hex.DecodeString(def.Secret); err != nil || len(raw) != 32 {
				t.Errorf("generated fluxora secret %q: want 64 hex digits", def.Secret)
			}
			got = mustGet(t, db, c, def.ID)
			if got.Scheme != endpoints.SchemeFluxora || len(got.EventTypes) != 0 || got.EventTypes == nil ||
				got.Tenant != "" || !got.Enabled || got.RetryRPS != 0 || got.MaxConcurrency != 0 ||
				len(got.Headers) != 0 || got.DisabledReason != "" {
				t.Errorf("defaults: %+v", got)
			}

			off := mustAdd(t, db, c, endpoints.New{URL: "https://x.example/", Disabled: true, Secret: "given-secret"})
			if off.Enabled || off.DisabledAt.IsZero() || off.DisabledReason == "" || off.Secret != "given-secret" {
				t.Errorf("added disabled: %+v", off)
			}

			list, err := endpoints.List(context.Background(), db.Pool, c)
			if err != nil || len(list) != 3 || list[0].ID != added.ID || list[2].ID != off.ID {
				t.Errorf("List = %d endpoints, %v; want the 3 added, oldest first", len(list), err)
			}
		})
	}
}

// TestSecretNotInTableWithKey is the point of WEBHOOK_ENCRYPTION_KEY: a reader of the table
// (a replica, a dump, a support query) never sees a secret, current or previous.
func TestSecretNotInTableWithKey(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, endpoints.GenerateKey(), "")
	e := mustAdd(t, db, c, endpoints.New{URL: "https://consumer.example/", Secret: "fluxora-plaintext-secret-1"})
	if row := rowText(t, db, e.ID); strings.Contains(row, "fluxora-plaintext-secret-1") || !strings.Contains(row, "enc:v2:") {
		t.Fatalf("the row shows the secret in clear: %s", row)
	}
	newSecret, err := endpoints.RotateSecret(ctx, db.Pool, c, e.ID, "rotated-plaintext-secret-2", 0)
	if err != nil || newSecret != "rotated-plaintext-secret-2" {
		t.Fatalf("RotateSecret = %q, %v", newSecret, err)
	}
	row := rowText(t, db, e.ID)
	for _, plain := range []string{"fluxora-plaintext-secret-1", "rotated-plaintext-secret-2"} {
		if strings.Contains(row, plain) {
			t.Errorf("the row shows %q in clear after a rotation: %s", plain, row)
		}
	}
	got := mustGet(t, db, c, e.ID)
	if got.Secret != "rotated-plaintext-secret-2" || got.PreviousSecret != "fluxora-plaintext-secret-1" {
		t.Errorf("secrets read back as %q, %q", got.Secret, got.PreviousSecret)
	}

	// Without a key the secret is stored as it is: the documented trade-off.
	clear := mustAdd(t, db, nil, endpoints.New{URL: "https://consumer.example/", Secret: "visible-secret"})
	if !strings.Contains(rowText(t, db, clear.ID), "visible-secret") {
		t.Errorf("without a key the secret is expected in clear")
	}
}

func TestWrongKey(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	rightKey := endpoints.GenerateKey()
	right := newCipher(t, rightKey, "")
	e := mustAdd(t, db, right, endpoints.New{URL: "https://consumer.example/", Tenant: "acme"})

	wrong := newCipher(t, endpoints.GenerateKey(), "")
	got, err := endpoints.Get(ctx, db.Pool, wrong, e.ID)
	if err == nil || !strings.Contains(err.Error(), "does not open with WEBHOOK_ENCRYPTION_KEY") || strings.Contains(err.Error(), e.Secret) {
		t.Errorf("Get with the wrong key: %v", err)
	}
	if got.ID != e.ID || got.Tenant != "acme" || got.Secret != "" {
		t.Errorf("Get with the wrong key returned %+v; want the endpoint without its secret", got)
	}
	if _, err := endpoints.Get(ctx, db.Pool, nil, e.ID); !errors.Is(err, endpoints.ErrNoKey) {
		t.Errorf("Get without a key: %v, want ErrNoKey", err)
	}
	// Listing and describing need no secret: they work with any key or none.
	for _, c := range []*endpoints.Cipher{wrong, nil} {
		list, err := endpoints.List(ctx, db.Pool, c)
		if err != nil || len(list) != 1 || list[0].ID != e.ID || list[0].Secret != "" {
			t.Errorf("List with a key that does not open: %v, %+v", err, list)
		}
		d, err := endpoints.Describe(ctx, db.Pool, c, e.ID)
		if err != nil || d.ID != e.ID || d.LoadError == "" || !d.SecretEncrypted {
			t.Errorf("Describe with a key that does not open: %v, %+v", err, d)
		}
	}
	// The previous key opens what it sealed: a key rotation never makes a secret unreadable.
	both := newCipher(t, endpoints.GenerateKey(), rightKey)
	if got := mustGet(t, db, both, e.ID); got.Secret != e.Secret {
		t.Errorf("WEBHOOK_ENCRYPTION_KEY_PREVIOUS does not open the secret it sealed")
	}
}

func TestReencrypt(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()

	if _, err := endpoints.Reencrypt(ctx, db.Pool, nil); err == nil || !strings.Contains(err.Error(), "WEBHOOK_ENCRYPTION_KEY is not set") {
		t.Errorf("Reencrypt without a key: %v", err)
	}

	oldKey := endpoints.GenerateKey()
	old := newCipher(t, oldKey, "")
	sealedOld := mustAdd(t, db, old, endpoints.New{URL: "https://a.example/", Secret: "secret-a"})
	if _, err := endpoints.RotateSecret(ctx, db.Pool, old, sealedOld.ID, "secret-a2", time.Hour); err != nil {
		t.Fatal(err)
	}
	// A secret inserted by SQL, in clear: reencrypt seals it.
	var clearID string
	if err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret) VALUES ('https://b.example/', 'secret-b') RETURNING id::text`).Scan(&clearID); err != nil {
		t.Fatal(err)
	}

	// Key rotation: the new key, with the old one as previous.
	newKey := endpoints.GenerateKey()
	rotating := newCipher(t, newKey, oldKey)
	sealedNew := mustAdd(t, db, rotating, endpoints.New{URL: "https://c.example/", Secret: "secret-c"})
	n, err := endpoints.Reencrypt(ctx, db.Pool, rotating)
	if err != nil || n != 2 {
		t.Fatalf("Reencrypt = %d, %v; want 2 (the old-key endpoint and the clear one)", n, err)
	}
	newOnly := newCipher(t, newKey, "")
	for id, want := range map[string][2]string{sealedOld.ID: {"secret-a2", "secret-a"}, clearID: {"secret-b", ""}, sealedNew.ID: {"secret-c", ""}} {
		got := mustGet(t, db, newOnly, id)
		if got.Secret != want[0] || got.PreviousSecret != want[1] {
			t.Errorf("after Reencrypt, %s opens with the new key alone to %q, %q; want %q", id, got.Secret, got.PreviousSecret, want)
		}
		if row := rowText(t, db, id); strings.Contains(row, want[0]) {
			t.Errorf("after Reencrypt the row still shows its secret: %s", row)
		}
	}
	if n, err := endpoints.Reencrypt(ctx, db.Pool, newOnly); err != nil || n != 0 {
		t.Errorf("a second Reencrypt = %d, %v; want 0: everything is sealed with the current key", n, err)
	}

	// A secret no key given opens: nothing is written, and the error names the endpoint.
	stranger := mustAdd(t, db, newCipher(t, endpoints.GenerateKey(), ""), endpoints.New{URL: "https://d.example/"})
	mustExec := func(sql string) {
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(`UPDATE webhook_endpoints SET secret = 'secret-e' WHERE url = 'https://a.example/'`)
	before, _ := storedSecrets(t, db, sealedOld.ID)
	if _, err := endpoints.Reencrypt(ctx, db.Pool, newOnly); err == nil || !strings.Contains(err.Error(), stranger.ID) ||
		!strings.Contains(err.Error(), "nothing was re-sealed") {
		t.Errorf("Reencrypt with an unopenable secret: %v", err)
	}
	if after, _ := storedSecrets(t, db, sealedOld.ID); after != before {
		t.Errorf("a failed Reencrypt wrote a secret")
	}
}

func TestAddValidation(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ok := endpoints.New{URL: "https://consumer.example/hook"}
	with := func(f func(*endpoints.New)) endpoints.New {
		n := ok
		f(&n)
		return n
	}
	cases := []struct {
		name  string
		n     endpoints.New
		field string
		text  string
	}{
		{"empty url", with(func(n *endpoints.New) { n.URL = "" }), "url", "empty"},
		{"plain http", with(func(n *endpoints.New) { n.URL = "http://consumer.example/" }), "url", "loopback"},
		{"ftp", with(func(n *endpoints.New) { n.URL = "ftp://consumer.example/" }), "url", "not supported"},
		{"credentials", with(func(n *endpoints.New) { n.URL = "https://u:p@consumer.example/" }), "url", "password"},
		{"star filter", with(func(n *endpoints.New) { n.EventTypes = []string{"*"} }), "event_types", `"*"`},
		{"inner star", with(func(n *endpoints.New) { n.EventTypes = []string{"a.*.b"} }), "event_types", "prefix"},
		{"blank filter", with(func(n *endpoints.New) { n.EventTypes = []string{""} }), "event_types", "empty"},
		{"reserved header", with(func(n *endpoints.New) { n.Headers = map[string]string{"Webhook-Signature": "x"} }), "headers", "reserved"},
		{"bad header name", with(func(n *endpoints.New) { n.Headers = map[string]string{"X Team": "x"} }), "headers", "not a valid"},
		{"framing header", with(func(n *endpoints.New) { n.Headers = map[string]string{"Trailer": "X-Sum"} }), "headers", "travels"},
		{"host with a comma", with(func(n *endpoints.New) { n.URL = "https://a.example,b.example/" }), "url", "host"},
		{"header newline", with(func(n *endpoints.New) { n.Headers = map[string]string{"X-Team": "a\nb"} }), "headers", "control"},
		{"headers differing in case", with(func(n *endpoints.New) { n.Headers = map[string]string{"X-Team": "a", "x-team": "b"} }), "headers", "case-insensitive"},
		{"scheme", with(func(n *endpoints.New) { n.Scheme = "hmac" }), "scheme", "fluxora"},
		{"standard without whsec_", with(func(n *endpoints.New) { n.Scheme = "standard"; n.Secret = "c2VjcmV0" }), "secret", "whsec_"},
		{"standard not base64", with(func(n *endpoints.New) { n.Scheme = "standard"; n.Secret = "whsec_not base64!" }), "secret", "base64"},
		{"standard empty key", with(func(n *endpoints.New) { n.Scheme = "standard"; n.Secret = "whsec_" }), "secret", "empty"},
		{"secret like a sealed one", with(func(n *endpoints.New) { n.Secret = "enc:v1:abc" }), "secret", "encrypted"},
		{"secret like a bound sealed one", with(func(n *endpoints.New) { n.Secret = "enc:v2:abc" }), "secret", "encrypted"},
		{"header like a sealed value", with(func(n *endpoints.New) { n.Headers = map[string]string{"X-Team": "enc:v2:abc"} }), "headers", "encrypted"},
		{"secret with spaces", with(func(n *endpoints.New) { n.Secret = " s3cret " }), "secret", "spaces"},
		{"negative retry rps", with(func(n *endpoints.New) { n.RetryRPS = -1 }), "retry_rps", "positive"},
		{"huge concurrency", with(func(n *endpoints.New) { n.MaxConcurrency = 1 << 40 }), "max_concurrency", "positive"},
		{"tenant with spaces", with(func(n *endpoints.New) { n.Tenant = "acme " }), "tenant", "spaces"},
		{"ordering", with(func(n *endpoints.New) { n.Ordering = "fifo" }), "ordering", `"fifo" is not an ordering; use "none"`},
		{"ordering in capitals", with(func(n *endpoints.New) { n.Ordering = "Stream" }), "ordering", `or "stream"`},
		{"ordering failure", with(func(n *endpoints.New) { n.OrderingFailure = "halt" }), "ordering_failure", `"halt" is not`},
		{"ordering failure allowed", with(func(n *endpoints.New) { n.OrderingFailure = "retry" }), "ordering_failure", `use "skip"`},
		{"long url", with(func(n *endpoints.New) { n.URL += "?pad=" + strings.Repeat("x", endpoints.MaxURL) }), "url", "at most 2048"},
		{"long description", with(func(n *endpoints.New) { n.Description = strings.Repeat("x", endpoints.MaxDescription+1) }), "description", "at most 1024"},
		{"NUL in description", with(func(n *endpoints.New) { n.Description = "a\x00b" }), "description", "NUL"},
		{"description not UTF-8", with(func(n *endpoints.New) { n.Description = "a\xffb" }), "description", "UTF-8"},
		{"escape in description", with(func(n *endpoints.New) { n.Description = "a\x1b[2Jb" }), "description", "control"},
		{"long tenant", with(func(n *endpoints.New) { n.Tenant = strings.Repeat("t", endpoints.MaxTenant+1) }), "tenant", "at most 200"},
		{"tenant not UTF-8", with(func(n *endpoints.New) { n.Tenant = "a\xff" }), "tenant", "UTF-8"},
		{"many headers", with(func(n *endpoints.New) { n.Headers = manyHeaders(endpoints.MaxHeaders+1, 1) }), "headers", "at most 32"},
		{"large headers", with(func(n *endpoints.New) { n.Headers = manyHeaders(2, endpoints.MaxHeaderBytes/2) }), "headers", "at most 8192"},
		{"many event types", with(func(n *endpoints.New) { n.EventTypes = manyTypes(endpoints.MaxEventTypes + 1) }), "event_types", "at most 100"},
		{"long event type", with(func(n *endpoints.New) { n.EventTypes = []string{strings.Repeat("e", endpoints.MaxEventType+1)} }), "event_types", "at most 200"},
		{"NUL in event type", with(func(n *endpoints.New) { n.EventTypes = []string{"a\x00"} }), "event_types", "printable"},
	}
	for _, tc := range cases {
		_, err := endpoints.Add(context.Background(), db.Pool, nil, tc.n)
		var inv *endpoints.InvalidError
		if !errors.As(err, &inv) || !errors.Is(err, endpoints.ErrInvalid) || inv.Field != tc.field || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: Add = %v; want an InvalidError on %s mentioning %q", tc.name, err, tc.field, tc.text)
		}
		if tc.field == "url" && !errors.Is(err, send.ErrInvalidURL) {
			t.Errorf("%s: %v does not wrap send.ErrInvalidURL", tc.name, err)
		}
		if tc.field == "secret" && tc.n.Secret != "" && len(tc.n.Secret) > 8 && strings.Contains(err.Error(), tc.n.Secret) {
			t.Errorf("%s: the error repeats the secret: %v", tc.name, err)
		}
	}
	var n int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM webhook_endpoints").Scan(&n); err != nil || n != 0 {
		t.Errorf("invalid endpoints were inserted: %d, %v", n, err)
	}
	// The accepted forms next to the refused ones.
	for _, n := range []endpoints.New{
		with(func(n *endpoints.New) { n.URL = "http://localhost:8080/hook" }),
		with(func(n *endpoints.New) { n.URL = "http://[::1]/hook" }),
		with(func(n *endpoints.New) { n.Scheme = "standard"; n.Secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" }),
		with(func(n *endpoints.New) {
			n.Headers = map[string]string{"Authorization": "Bearer x"}
			n.EventTypes = []string{"a.b", "c.*"}
		}),
	} {
		mustAdd(t, db, nil, n)
	}
}

// manyHeaders is n headers whose values are size bytes each.
func manyHeaders(n, size int) map[string]string {
	h := make(map[string]string, n)
	for i := range n {
		h[fmt.Sprintf("X-H%d", i)] = strings.Repeat("v", size)
	}
	return h
}

// manyTypes is a filter of n distinct event types.
func manyTypes(n int) []string {
	types := make([]string, n)
	for i := range types {
		types[i] = fmt.Sprintf("type.%d", i)
	}
	return types
}

// TestFieldBoundsHoldOnUpdate: an update is held to the bounds Add is, a merge of headers
// counting the headers it keeps; a disabled reason is bounded too; the largest endpoint within
// every bound is accepted.
func TestFieldBoundsHoldOnUpdate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	c := newCipher(t, endpoints.GenerateKey(), "")
	types := manyTypes(endpoints.MaxEventTypes)
	e := mustAdd(t, db, c, endpoints.New{URL: "https://consumer.example/" + strings.Repeat("p", endpoints.MaxURL-len("https://consumer.example/")),
		Description: strings.Repeat("d", endpoints.MaxDescription), Tenant: strings.Repeat("t", endpoints.MaxTenant),
		Headers: manyHeaders(2, endpoints.MaxHeaderBytes/2-4), EventTypes: types})
	long := strings.Repeat("x", endpoints.MaxDescription+1)
	more := map[string]string{"X-More": "v"}
	for name, p := range map[string]endpoints.Patch{
		"description": {Description: &long},
		"headers":     {Headers: &more, MergeHeaders: true},
	} {
		var inv *endpoints.InvalidError
		if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, p); !errors.As(err, &inv) || inv.Field != name {
			t.Errorf("Update(%s past its bound) = %v; want an InvalidError on %s", name, err, name)
		}
	}
	var inv *endpoints.InvalidError
	if err := endpoints.Disable(ctx, db.Pool, e.ID, long); !errors.As(err, &inv) || inv.Field != "reason" {
		t.Errorf("Disable with a reason past its bound = %v; want an InvalidError on reason", err)
	}
	// A header sent back masked counts by the value it keeps, not by the mask.
	auth := mustAdd(t, db, c, endpoints.New{URL: "https://consumer.example/auth",
		Headers: map[string]string{"Authorization": strings.Repeat("a", endpoints.MaxHeaderBytes-100)}})
	masked := map[string]string{"Authorization": "********", "X-More": strings.Repeat("m", 200)}
	if _, err := endpoints.Update(ctx, db.Pool, c, auth.ID, endpoints.Patch{Headers: &masked, HeaderMask: "********"}); !errors.As(err, &inv) || inv.Field != "headers" {
		t.Errorf("Update keeping a masked header past the bound = %v; want an InvalidError on headers", err)
	}
}

// TestTenantQuota: with New.TenantQuota, a tenant's endpoints stop at the quota, even when
// added concurrently; other tenants and adds without a quota are not held to it.
func TestTenantQuota(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	errs := make(chan error, 5)
	for i := range 5 {
		go func() {
			_, err := endpoints.AddAudited(ctx, db.Pool, nil, endpoints.New{URL: fmt.Sprintf("https://consumer.example/%d", i),
				Tenant: "acme", TenantQuota: 3}, "cli:test")
			errs <- err
		}()
	}
	refused := 0
	for range 5 {
		var quota *endpoints.QuotaError
		switch err := <-errs; {
		case errors.As(err, &quota):
			refused++
		case err != nil:
			t.Fatal(err)
		}
	}
	if refused != 2 {
		t.Fatalf("%d of 5 concurrent adds past a quota of 3 were refused; want 2", refused)
	}
	mustAdd(t, db, nil, endpoints.New{URL: "https://consumer.example/globex", Tenant: "globex", TenantQuota: 3})
	mustAdd(t, db, nil, endpoints.New{URL: "https://consumer.example/operator", Tenant: "acme"})
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, endpoints.GenerateKey(), "")
	e := mustAdd(t, db, c, endpoints.New{URL: "https://a.example/", Tenant: "acme", EventTypes: []string{"a.*"},
		RetryRPS: 4, Headers: map[string]string{"X-One": "1", "X-Two": "2"}})
	if _, err := endpoints.RotateSecret(ctx, db.Pool, c, e.ID, "", 0); err != nil {
		t.Fatal(err)
	}
	ptr := func(s string) *string { return &s }
	num := func(n int) *int { return &n }

	up, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{
		URL: ptr("https://b.example/"), Description: ptr("moved"), Tenant: ptr(""), EventTypes: &[]string{},
		RetryRPS: num(0), MaxConcurrency: num(7), Headers: &map[string]string{"x-one": "uno", "X-Three": "3"}, MergeHeaders: true,
	})
	if err != nil || up.NewSecret != "" {
		t.Fatalf("Update = %+v, %v", up, err)
	}
	got := mustGet(t, db, c, e.ID)
	if got.URL != "https://b.example/" || got.Description != "moved" || got.Tenant != "" || len(got.EventTypes) != 0 ||
		got.RetryRPS != 0 || got.MaxConcurrency != 7 ||
		!maps.Equal(got.Headers, map[string]string{"x-one": "uno", "X-Two": "2", "X-Three": "3"}) {
		t.Errorf("after Update: %+v", got)
	}
	before := got

	// Headers without merge replace them all; fields not in the patch stay.
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Headers: &map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	if got = mustGet(t, db, c, e.ID); len(got.Headers) != 0 || got.URL != before.URL || got.MaxConcurrency != 7 {
		t.Errorf("after replacing headers: %+v", got)
	}

	// Setting the scheme it has changes nothing, the secret included.
	if up, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Scheme: ptr("fluxora")}); err != nil || up.NewSecret != "" {
		t.Errorf("Update to the same scheme = %+v, %v", up, err)
	}
	if got := mustGet(t, db, c, e.ID); got.Secret != before.Secret || got.PreviousSecret == "" {
		t.Errorf("Update to the same scheme changed the secrets")
	}
	// A scheme change comes with a new secret in that scheme's form, and drops the previous one.
	up, err = endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Scheme: ptr("standard")})
	secret := up.NewSecret
	if err != nil || !strings.HasPrefix(secret, "whsec_") {
		t.Fatalf("Update to standard = %q, %v", secret, err)
	}
	if got := mustGet(t, db, c, e.ID); got.Scheme != "standard" || got.Secret != secret || got.PreviousSecret != "" || !got.PreviousUntil.IsZero() {
		t.Errorf("after the scheme change: %+v", got)
	}
	given := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Scheme: ptr("fluxora"), Secret: ptr(given)}); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, db, c, e.ID); got.Scheme != "fluxora" || got.Secret != given {
		t.Errorf("scheme change with a given secret: %+v", got)
	}

	for name, p := range map[string]endpoints.Patch{
		"secret without scheme":   {Secret: ptr("abc")},
		"secret with same scheme": {Scheme: ptr("fluxora"), Secret: ptr("abc")},
		"bad url":                 {URL: ptr("http://example.com/")},
		"bad filter":              {EventTypes: &[]string{"*"}},
		"bad header":              {Headers: &map[string]string{"Content-Type": "text/plain"}},
		"merged duplicate":        {Headers: &map[string]string{"X-A": "1", "x-a": "2"}, MergeHeaders: true},
		"bad scheme":              {Scheme: ptr("v2")},
		"standard secret":         {Scheme: ptr("standard"), Secret: ptr("plain")},
		"negative rps":            {RetryRPS: num(-3)},
		"bad ordering":            {Ordering: ptr("strict")},
		"empty ordering":          {Ordering: ptr("")},
		"bad ordering failure":    {OrderingFailure: ptr("pause")},
	} {
		if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, p); !errors.Is(err, endpoints.ErrInvalid) {
			t.Errorf("Update %s: %v, want ErrInvalid", name, err)
		}
	}
	if got := mustGet(t, db, c, e.ID); got.Scheme != "fluxora" || got.Secret != given || got.URL != before.URL {
		t.Errorf("a refused Update changed the endpoint: %+v", got)
	}
	// An empty patch checks existence only.
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{}); err != nil {
		t.Errorf("empty Update: %v", err)
	}
}

// TestOrdering: the schema 6 settings are written by Add and Update like the other fields, and
// read back by every read path (the dispatcher's LoadAll, Get, List, Describe).
func TestOrdering(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	ptr := func(s string) *string { return &s }
	type setting struct{ ordering, failure string }
	read := func(id string) map[string]setting {
		t.Helper()
		got := map[string]setting{}
		e := mustGet(t, db, nil, id)
		got["Get"] = setting{e.Ordering, e.OrderingFailure}
		d, err := endpoints.Describe(ctx, db.Pool, nil, id)
		if err != nil {
			t.Fatal(err)
		}
		got["Describe"] = setting{d.Ordering, d.OrderingFailure}
		list, err := endpoints.List(ctx, db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		all, _, err := endpoints.LoadAll(ctx, db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		for name, l := range map[string][]endpoints.Endpoint{"List": list, "LoadAll": all} {
			for _, e := range l {
				if e.ID == id {
					got[name] = setting{e.Ordering, e.OrderingFailure}
				}
			}
		}
		return got
	}
	check := func(what, id string, want setting) {
		t.Helper()
		got := read(id)
		if len(got) != 4 {
			t.Errorf("%s: read by %d paths, want 4: %v", what, len(got), got)
		}
		for path, s := range got {
			if s != want {
				t.Errorf("%s: %s reads ordering %q, ordering_failure %q; want %q, %q", what, path, s.ordering, s.failure, want.ordering, want.failure)
			}
		}
	}

	// "" is the defaults: unordered, and an ordered stream would skip its dead letters.
	def := mustAdd(t, db, nil, endpoints.New{URL: "https://a.example/"})
	if def.Ordering != endpoints.OrderingNone || def.OrderingFailure != endpoints.OrderingFailureSkip {
		t.Errorf("Add with no ordering returned %q, %q", def.Ordering, def.OrderingFailure)
	}
	check("defaults", def.ID, setting{endpoints.OrderingNone, endpoints.OrderingFailureSkip})

	ordered := mustAdd(t, db, nil, endpoints.New{URL: "https://b.example/", Ordering: endpoints.OrderingStream,
		OrderingFailure: endpoints.OrderingFailureStop})
	if ordered.Ordering != endpoints.OrderingStream || ordered.OrderingFailure != endpoints.OrderingFailureStop {
		t.Errorf("Add(stream, stop) returned %q, %q", ordered.Ordering, ordered.OrderingFailure)
	}
	check("added ordered", ordered.ID, setting{endpoints.OrderingStream, endpoints.OrderingFailureStop})
	// The failure mode may be chosen before the endpoint is ordered.
	ahead := mustAdd(t, db, nil, endpoints.New{URL: "https://c.example/", OrderingFailure: endpoints.OrderingFailureStop})
	check("stop without ordering", ahead.ID, setting{endpoints.OrderingNone, endpoints.OrderingFailureStop})

	// Update sets each only when given, and leaves the other fields as they are.
	if _, err := endpoints.Update(ctx, db.Pool, nil, def.ID, endpoints.Patch{Ordering: ptr(endpoints.OrderingStream)}); err != nil {
		t.Fatal(err)
	}
	check("ordering updated", def.ID, setting{endpoints.OrderingStream, endpoints.OrderingFailureSkip})
	if _, err := endpoints.Update(ctx, db.Pool, nil, def.ID, endpoints.Patch{OrderingFailure: ptr(endpoints.OrderingFailureStop)}); err != nil {
		t.Fatal(err)
	}
	check("failure updated", def.ID, setting{endpoints.OrderingStream, endpoints.OrderingFailureStop})
	if _, err := endpoints.Update(ctx, db.Pool, nil, def.ID, endpoints.Patch{Description: ptr("orders")}); err != nil {
		t.Fatal(err)
	}
	check("another field updated", def.ID, setting{endpoints.OrderingStream, endpoints.OrderingFailureStop})
	if _, err := endpoints.Update(ctx, db.Pool, nil, def.ID, endpoints.Patch{Ordering: ptr(endpoints.OrderingNone),
		OrderingFailure: ptr(endpoints.OrderingFailureSkip)}); err != nil {
		t.Fatal(err)
	}
	check("both updated back", def.ID, setting{endpoints.OrderingNone, endpoints.OrderingFailureSkip})
	if got := mustGet(t, db, nil, def.ID); got.URL != "https://a.example/" || got.Description != "orders" {
		t.Errorf("the ordering updates changed other fields: %+v", got)
	}

	// A refused value writes nothing, and its error names the value and the allowed ones.
	for _, tc := range []struct {
		p     endpoints.Patch
		field string
		want  []string
	}{
		{endpoints.Patch{Ordering: ptr("strict"), Description: ptr("x")}, "ordering", []string{`"strict" is not an ordering`, `"none"`, `"stream"`}},
		{endpoints.Patch{OrderingFailure: ptr("STOP")}, "ordering_failure", []string{`"STOP" is not`, `"skip"`, `"stop"`}},
		{endpoints.Patch{OrderingFailure: ptr("")}, "ordering_failure", []string{`"" is not`, `"skip"`, `"stop"`}},
	} {
		_, err := endpoints.Update(ctx, db.Pool, nil, ordered.ID, tc.p)
		var inv *endpoints.InvalidError
		if !errors.As(err, &inv) || inv.Field != tc.field || !errors.Is(err, endpoints.ErrInvalid) {
			t.Errorf("Update(%+v) = %v; want an InvalidError on %s", tc.p, err, tc.field)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Update(%+v) = %v; want it to mention %s", tc.p, err, w)
			}
		}
	}
	check("after refused updates", ordered.ID, setting{endpoints.OrderingStream, endpoints.OrderingFailureStop})
	if got := mustGet(t, db, nil, ordered.ID); got.Description != "" {
		t.Errorf("a refused update wrote its other fields: %+v", got)
	}

	// The table's CHECK stands behind the validation, for values written by SQL.
	for _, col := range []string{"ordering", "ordering_failure"} {
		if _, err := db.Pool.Exec(ctx, "UPDATE webhook_endpoints SET "+col+" = 'sometimes' WHERE id = $1::uuid", ordered.ID); err == nil ||
			!strings.Contains(err.Error(), "webhook_endpoints_"+col+"_check") {
			t.Errorf("SQL writing %s = 'sometimes': %v, want the CHECK to refuse it", col, err)
		}
	}
}

func TestDisableEnable(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	e := mustAdd(t, db, nil, endpoints.New{URL: "https://a.example/"})
	if err := endpoints.Disable(ctx, db.Pool, e.ID, "consumer decommissioned"); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, db, nil, e.ID)
	if got.Enabled || got.DisabledAt.IsZero() || got.DisabledReason != "consumer decommissioned" {
		t.Fatalf("after Disable: %+v", got)
	}
	firstDisabled := got.DisabledAt
	if err := endpoints.Disable(ctx, db.Pool, e.ID, ""); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, db, nil, e.ID); !got.DisabledAt.Equal(firstDisabled) || got.DisabledReason != endpoints.DefaultDisabledReason {
		t.Errorf("disabling again: disabled_at %v (was %v), reason %q", got.DisabledAt, firstDisabled, got.DisabledReason)
	}
	if _, err := db.Pool.Exec(ctx, "UPDATE webhook_endpoints SET failing_since = now() - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	if err := endpoints.Enable(ctx, db.Pool, e.ID); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, db, nil, e.ID); !got.Enabled || !got.DisabledAt.IsZero() || got.DisabledReason != "" || !got.FailingSince.IsZero() {
		t.Errorf("after Enable: %+v", got)
	}
}

func TestRotateSecret(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, endpoints.GenerateKey(), "")
	e := mustAdd(t, db, c, endpoints.New{URL: "https://a.example/", Scheme: "standard"})

	start := time.Now()
	secret, err := endpoints.RotateSecret(ctx, db.Pool, c, e.ID, "", 0)
	if err != nil || !strings.HasPrefix(secret, "whsec_") || secret == e.Secret {
		t.Fatalf("RotateSecret = %q, %v", secret, err)
	}
	got := mustGet(t, db, c, e.ID)
	if got.Secret != secret || got.PreviousSecret != e.Secret {
		t.Errorf("after rotation: secret %q previous %q; want %q, %q", got.Secret, got.PreviousSecret, secret, e.Secret)
	}
	if d := got.PreviousUntil.Sub(start); d < endpoints.DefaultGrace-time.Minute || d > endpoints.DefaultGrace+time.Minute {
		t.Errorf("previous secret expires %v from now, want the default grace %v", d, endpoints.DefaultGrace)
	}
	d, err := endpoints.Describe(ctx, db.Pool, c, e.ID)
	if err != nil || !d.PreviousSecretInGrace || !d.SecretEncrypted || d.LoadError != "" {
		t.Errorf("Describe after rotation: %+v, %v", d, err)
	}

	given := "whsec_Zmx1eGhvb2stcHJldmlvdXMtc2VjcmV0"
	if s, err := endpoints.RotateSecret(ctx, db.Pool, c, e.ID, given, 2*time.Hour); err != nil || s != given {
		t.Fatalf("RotateSecret(given) = %q, %v", s, err)
	}
	got = mustGet(t, db, c, e.ID)
	if got.Secret != given || got.PreviousSecret != secret {
		t.Errorf("second rotation: %q, %q", got.Secret, got.PreviousSecret)
	}
	if d := time.Until(got.PreviousUntil); d < time.Hour+50*time.Minute || d > 2*time.Hour+time.Minute {
		t.Errorf("grace 2h: previous expires in %v", d)
	}

	if _, err := endpoints.RotateSecret(ctx, db.Pool, c, e.ID, "not-whsec", 0); !errors.Is(err, endpoints.ErrInvalid) {
		t.Errorf("RotateSecret with a secret not in the scheme's form: %v", err)
	}
	if got := mustGet(t, db, c, e.ID); got.Secret != given {
		t.Errorf("a refused rotation changed the secret")
	}

	// A leaked secret: no grace.
	if _, err := endpoints.RotateSecret(ctx, db.Pool, c, e.ID, "", endpoints.NoGrace); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, db, c, e.ID); got.PreviousSecret != "" || !got.PreviousUntil.IsZero() {
		t.Errorf("NoGrace kept the previous secret: %+v", got)
	}
}

// insertDeliveries adds n pending delivery rows routed to endpointID, plus one processed one.
func insertDeliveries(t *testing.T, db *sqltest.DB, endpointID string, n int) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		INSERT INTO webhook_outbox (event_type, payload, endpoint_id, tenant, routed_at, attempt, processed, processed_at)
		SELECT 'order.created', jsonb_build_object('n', i), $1::uuid, 'acme', now(), 2, i > $2, CASE WHEN i > $2 THEN now() END
		FROM generate_series(1, $2 + 1) AS i`, endpointID, n)
	if err != nil {
		t.Fatal(err)
	}
}

func TestRemove(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	count := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := db.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	keep := mustAdd(t, db, nil, endpoints.New{URL: "https://keep.example/"})
	insertDeliveries(t, db, keep.ID, 1)

	// Nothing pending: removed at once.
	idle := mustAdd(t, db, nil, endpoints.New{URL: "https://idle.example/"})
	if r, err := endpoints.Remove(ctx, db.Pool, idle.ID, ""); err != nil || r != (endpoints.Removed{}) {
		t.Errorf("Remove of an idle endpoint = %+v, %v", r, err)
	}

	busy := mustAdd(t, db, nil, endpoints.New{URL: "https://busy.example/"})
	insertDeliveries(t, db, busy.ID, 2)
	d, err := endpoints.Describe(ctx, db.Pool, nil, busy.ID)
	if err != nil || d.PendingDeliveries != 2 {
		t.Errorf("Describe pending = %d, %v; want 2", d.PendingDeliveries, err)
	}
	_, err = endpoints.Remove(ctx, db.Pool, busy.ID, endpoints.PendingRefuse)
	var pe *endpoints.PendingError
	if !errors.As(err, &pe) || pe.Pending != 2 || pe.ID != busy.ID || !strings.Contains(err.Error(), "2 deliveries pending") {
		t.Fatalf("Remove with pending deliveries: %v", err)
	}
	if _, err := endpoints.Get(ctx, db.Pool, nil, busy.ID); err != nil {
		t.Errorf("a refused Remove removed the endpoint: %v", err)
	}

	if r, err := endpoints.Remove(ctx, db.Pool, busy.ID, endpoints.PendingDeadLetter); err != nil || r.DeadLettered != 2 || r.Dropped != 0 {
		t.Fatalf("Remove dead-letter = %+v, %v", r, err)
	}
	if _, err := endpoints.Get(ctx, db.Pool, nil, busy.ID); !errors.Is(err, endpoints.ErrNotFound) {
		t.Errorf("Get after Remove: %v", err)
	}
	if n := count(`SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1::uuid AND reason = 'endpoint removed'
		AND tenant = 'acme' AND attempts = 2 AND event_type = 'order.created'`, busy.ID); n != 2 {
		t.Errorf("%d dead letters for the removed endpoint, want 2", n)
	}
	if n := count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1::uuid AND NOT processed`, busy.ID); n != 0 {
		t.Errorf("%d deliveries still pending for the removed endpoint", n)
	}

	dropped := mustAdd(t, db, nil, endpoints.New{URL: "https://drop.example/"})
	insertDeliveries(t, db, dropped.ID, 3)
	if r, err := endpoints.Remove(ctx, db.Pool, dropped.ID, endpoints.PendingDrop); err != nil || r.Dropped != 3 || r.DeadLettered != 0 {
		t.Fatalf("Remove drop = %+v, %v", r, err)
	}
	if n := count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1::uuid`, dropped.ID); n != 1 {
		t.Errorf("drop left %d rows, want only the processed one (the delivery log)", n)
	}
	if n := count(`SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1::uuid`, dropped.ID); n != 0 {
		t.Errorf("drop dead-lettered %d rows", n)
	}
	// The other endpoint and its deliveries are untouched.
	if n := count(`SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1::uuid AND NOT processed`, keep.ID); n != 1 {
		t.Errorf("another endpoint's deliveries changed: %d pending", n)
	}
	if _, err := endpoints.Remove(ctx, db.Pool, keep.ID, "later"); !errors.Is(err, endpoints.ErrInvalid) {
		t.Errorf("Remove with an unknown action: %v", err)
	}
}

// TestRemoveStoppedStream: an ordered stream stopped at a dead letter leaves its row parked,
// undelivered, with its dead letter already written. Removing the endpoint with dead-letter
// settles that row without a second dead letter (replaying both would send the event twice),
// and the rows behind it keep their order keys in theirs, as the dispatcher's dead letters do.
func TestRemoveStoppedStream(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	e := mustAdd(t, db, nil, endpoints.New{URL: "https://a.example/", Ordering: endpoints.OrderingStream,
		OrderingFailure: endpoints.OrderingFailureStop})
	var parked int64
	err := db.Pool.QueryRow(ctx, `
		INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key, created_at, deferred_reason)
		VALUES ('s1', 'order.created', '{"n": 1}', $1::uuid, now(), 100, 'infinity', 'stream stopped: permanent: HTTP 410')
		RETURNING id`, e.ID).Scan(&parked)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_dead_letter (outbox_id, delivery_id, stream_id, event_type, payload, attempts, reason, enqueued_at,
		                                 endpoint_id, order_key)
		SELECT id, delivery_id, stream_id, event_type, payload, attempt, 'permanent: HTTP 410', enqueued_at, endpoint_id, order_key
		FROM webhook_deliveries WHERE id = $1`, parked); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key)
		VALUES ('s1', 'order.created', '{"n": 2}', $1::uuid, now(), 101)`, e.ID); err != nil {
		t.Fatal(err)
	}
	// show counts the stopped stream, once, among its two pending rows.
	if d, err := endpoints.Describe(ctx, db.Pool, nil, e.ID); err != nil || d.StoppedStreams != 1 || d.PendingDeliveries != 2 {
		t.Errorf("Describe = %d stopped streams, %d pending, %v; want 1 and 2", d.StoppedStreams, d.PendingDeliveries, err)
	}

	r, err := endpoints.Remove(ctx, db.Pool, e.ID, endpoints.PendingDeadLetter)
	if err != nil || r != (endpoints.Removed{DeadLettered: 1}) {
		t.Fatalf("Remove = %+v, %v; want the row behind the stopped one dead-lettered", r, err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT d.order_key, d.reason, count(*) OVER (PARTITION BY d.delivery_id)
		FROM webhook_dead_letter d ORDER BY d.order_key`)
	if err != nil {
		t.Fatal(err)
	}
	type dead struct {
		key    int64
		reason string
		copies int64
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dead, error) {
		var d dead
		return d, r.Scan(&d.key, &d.reason, &d.copies)
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []dead{{100, "permanent: HTTP 410", 1}, {101, "endpoint removed", 1}}; !slices.Equal(got, want) {
		t.Errorf("dead letters after Remove = %+v, want %+v", got, want)
	}
	var pending int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE NOT processed`).Scan(&pending); err != nil || pending != 0 {
		t.Errorf("%d rows left undelivered after Remove (%v); the parked row must be settled too", pending, err)
	}
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	mustAdd(t, db, nil, endpoints.New{URL: "https://a.example/"})
	for _, id := range []string{"0b6f3c1e-9a4d-4c52-8f0e-3d2a1b4c5d6e", "nope", "", "0b6f3c1e9a4d4c528f0e3d2a1b4c5d6e", "'; DROP TABLE x; --"} {
		ops := map[string]error{}
		_, ops["Get"] = endpoints.Get(ctx, db.Pool, nil, id)
		_, ops["Describe"] = endpoints.Describe(ctx, db.Pool, nil, id)
		_, ops["Update"] = endpoints.Update(ctx, db.Pool, nil, id, endpoints.Patch{})
		ops["Disable"] = endpoints.Disable(ctx, db.Pool, id, "")
		ops["Enable"] = endpoints.Enable(ctx, db.Pool, id)
		_, ops["RotateSecret"] = endpoints.RotateSecret(ctx, db.Pool, nil, id, "", 0)
		_, ops["Remove"] = endpoints.Remove(ctx, db.Pool, id, endpoints.PendingDrop)
		for op, err := range ops {
			if !errors.Is(err, endpoints.ErrNotFound) || !strings.Contains(err.Error(), "not found") {
				t.Errorf("%s(%q) = %v, want ErrNotFound", op, id, err)
			}
		}
	}
	_, err := endpoints.Get(ctx, db.Pool, nil, "0B6F3C1E-9A4D-4C52-8F0E-3D2A1B4C5D6E")
	if err == nil || err.Error() != "endpoint 0b6f3c1e-9a4d-4c52-8f0e-3d2a1b4c5d6e not found" {
		t.Errorf("unknown id: %v", err)
	}
	_, err = endpoints.Get(ctx, db.Pool, nil, "nope")
	if err == nil || !strings.Contains(err.Error(), `endpoint "nope" not found`) || !strings.Contains(err.Error(), "UUID") {
		t.Errorf("malformed id: %v", err)
	}
}

// TestUpdateTenantDeadLettersPending: a tenant change moves the deliveries pending for the
// endpoint (routed under the old tenant, leased or not) to the dead-letter table, reason
// TenantChangedReason, in the update's statement; a change of anything else, or an update that
// sets the same tenant, leaves them pending, as it leaves other endpoints' deliveries.
func TestUpdateTenantDeadLettersPending(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	e := mustAdd(t, db, nil, endpoints.New{URL: "https://a.example/", Tenant: "acme"})
	other := mustAdd(t, db, nil, endpoints.New{URL: "https://b.example/", Tenant: "acme"})
	pending := func(id string) int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_outbox WHERE endpoint_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, ep := range []string{e.ID, e.ID, other.ID} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO webhook_outbox (event_type, payload, tenant, endpoint_id, routed_at, attempt)
			VALUES ('order.paid', '{}', 'acme', $1, now(), 2)`, ep); err != nil {
			t.Fatal(err)
		}
	}
	// One of them in flight: leased by a dispatcher.
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_outbox SET leased_by = 'x', lease_token = 1, lease_until = now() + interval '1 minute'
		WHERE id = (SELECT min(id) FROM webhook_outbox WHERE endpoint_id = $1)`, e.ID); err != nil {
		t.Fatal(err)
	}
	ptr := func(s string) *string { return &s }
	for _, p := range []endpoints.Patch{{Description: ptr("renamed")}, {Tenant: ptr("acme")}, {URL: ptr("https://c.example/")}} {
		up, err := endpoints.Update(ctx, db.Pool, nil, e.ID, p)
		if err != nil || up.DeadLettered != 0 || pending(e.ID) != 2 {
			t.Fatalf("Update(%+v) = %+v, %v with %d pending; want nothing dead-lettered, 2 pending", p, up, err, pending(e.ID))
		}
	}
	up, err := endpoints.Update(ctx, db.Pool, nil, e.ID, endpoints.Patch{Tenant: ptr("globex")})
	if err != nil || up.DeadLettered != 2 {
		t.Fatalf("Update to tenant globex = %+v, %v; want its 2 pending deliveries dead-lettered", up, err)
	}
	if n := pending(e.ID); n != 0 {
		t.Errorf("%d deliveries still pending for the endpoint after its tenant changed", n)
	}
	var dead int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_dead_letter WHERE endpoint_id = $1 AND reason = $2 AND tenant = 'acme'`,
		e.ID, endpoints.TenantChangedReason).Scan(&dead); err != nil || dead != 2 {
		t.Errorf("%d dead letters with reason %q (%v), want 2", dead, endpoints.TenantChangedReason, err)
	}
	if n := pending(other.ID); n != 1 {
		t.Errorf("another endpoint of the old tenant has %d pending deliveries, want its 1 untouched", n)
	}
	// Back to no tenant: the globex endpoint has nothing pending, and an acme row is not its.
	if up, err := endpoints.Update(ctx, db.Pool, nil, e.ID, endpoints.Patch{Tenant: ptr("")}); err != nil || up.DeadLettered != 0 {
		t.Errorf("Update to no tenant = %+v, %v", up, err)
	}
}

// TestPermanentStatuses is the round trip of an endpoint's WEBHOOK_PERMANENT_STATUSES override
// (schema 13): nil is the dispatcher's setting (NULL), an empty list none but 410 ('{}'), both
// kept apart through Add, Update, Get, LoadAll and the JSON of list and show; an Update
// without it leaves it alone; a status outside 300 to 599 is refused, naming the field.
func TestPermanentStatuses(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, endpoints.GenerateKey(), "")
	stored := func(id string) *string {
		t.Helper()
		var s *string
		if err := db.Pool.QueryRow(ctx, "SELECT permanent_statuses::text FROM webhook_endpoints WHERE id = $1::uuid", id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	jsonOf := func(e endpoints.Endpoint) string {
		t.Helper()
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return string(m["permanent_statuses"])
	}

	def := mustAdd(t, db, c, endpoints.New{URL: "https://default.example/"})
	if def.PermanentStatuses != nil || stored(def.ID) != nil || jsonOf(def) != "null" {
		t.Errorf("added without statuses: %v, stored %v, json %s; want nil, NULL, null", def.PermanentStatuses, stored(def.ID), jsonOf(def))
	}
	e := mustAdd(t, db, c, endpoints.New{URL: "https://a.example/", PermanentStatuses: []int{422, 404, 400, 404}})
	if want := []int{400, 404, 422}; !slices.Equal(e.PermanentStatuses, want) || !slices.Equal(mustGet(t, db, c, e.ID).PermanentStatuses, want) {
		t.Errorf("added with 422,404,400,404: %v; want %v", mustGet(t, db, c, e.ID).PermanentStatuses, want)
	}
	if s := stored(e.ID); s == nil || *s != "{400,404,422}" {
		t.Errorf("stored %v, want {400,404,422}", s)
	}
	none := mustAdd(t, db, c, endpoints.New{URL: "https://none.example/", PermanentStatuses: []int{}})
	if got := mustGet(t, db, c, none.ID); got.PermanentStatuses == nil || len(got.PermanentStatuses) != 0 || jsonOf(got) != "[]" {
		t.Errorf("added with none: %#v (json %s); want an empty, non-nil list", got.PermanentStatuses, jsonOf(got))
	}

	// An update of another field leaves it; an update sets it, to none, and back to NULL.
	desc := "x"
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Description: &desc}); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, db, c, e.ID).PermanentStatuses; !slices.Equal(got, []int{400, 404, 422}) {
		t.Errorf("after an update of the description: %v", got)
	}
	for _, step := range []struct {
		set    []int
		stored *string
	}{
		{[]int{404}, ptrTo("{404}")},
		{[]int{}, ptrTo("{}")},
		{nil, nil},
	} {
		set := step.set
		if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{PermanentStatuses: &set}); err != nil {
			t.Fatalf("Update to %#v: %v", set, err)
		}
		got := mustGet(t, db, c, e.ID).PermanentStatuses
		s := stored(e.ID)
		if (got == nil) != (set == nil) || !slices.Equal(got, set) || (s == nil) != (step.stored == nil) || s != nil && *s != *step.stored {
			t.Errorf("after Update to %#v: %#v, stored %v", set, got, s)
		}
	}
	all, errs, err := endpoints.LoadAll(ctx, db.Pool, c)
	if err != nil || len(all) != 3 || errors.Join(errs...) != nil {
		t.Fatalf("LoadAll = %d endpoints, %v, %v", len(all), errs, err)
	}
	if all[0].PermanentStatuses != nil || all[1].PermanentStatuses != nil || all[2].PermanentStatuses == nil {
		t.Errorf("LoadAll: %#v, %#v, %#v; want nil, nil, []", all[0].PermanentStatuses, all[1].PermanentStatuses, all[2].PermanentStatuses)
	}

	// Validation, on Add and Update, before anything is written; the column's CHECK backs it.
	for _, bad := range [][]int{{200}, {404, 600}, {0}} {
		var inv *endpoints.InvalidError
		_, err := endpoints.Add(ctx, db.Pool, c, endpoints.New{URL: "https://b.example/", PermanentStatuses: bad})
		if !errors.As(err, &inv) || inv.Field != "permanent_statuses" || !strings.Contains(err.Error(), "300 to 599") {
			t.Errorf("Add with %v: %v; want an invalid permanent_statuses naming 300 to 599", bad, err)
		}
		_, err = endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{PermanentStatuses: &bad})
		if !errors.As(err, &inv) || inv.Field != "permanent_statuses" {
			t.Errorf("Update with %v: %v; want an invalid permanent_statuses", bad, err)
		}
	}
	if _, err := db.Pool.Exec(ctx, "UPDATE webhook_endpoints SET permanent_statuses = '{404,200}' WHERE id = $1::uuid", e.ID); err == nil {
		t.Error("the column took 200: want its CHECK to refuse it")
	}
	if _, err := db.Pool.Exec(ctx, "UPDATE webhook_endpoints SET permanent_statuses = '{404,NULL}' WHERE id = $1::uuid", e.ID); err == nil {
		t.Error("the column took a NULL element: want its CHECK to refuse it")
	}
}

func ptrTo(s string) *string { return &s }

// TestDescribeSQLWrittenProblems: `endpoints show` reports what the dispatcher refuses in a row
// written by SQL (a URL it will not call, a header it will not send), the field first and
// without the header's value, and nothing for a sound row.
func TestDescribeSQLWrittenProblems(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := t.Context()
	for _, c := range []struct{ set, want string }{
		{``, ``},
		{`url = 'http://example.com/hook'`, `url: http:// is allowed only for loopback hosts`},
		{`headers = '{"Webhook-Signature": "v1,forged"}'`, `headers: header "Webhook-Signature" is reserved`},
		{`headers = '{"X-Token": "forged\r\nX-Other: 1"}'`, `headers: header "X-Token": the value has a control character`},
	} {
		e := mustAdd(t, db, nil, endpoints.New{URL: "https://sound.example/"})
		if c.set != "" {
			if _, err := db.Pool.Exec(ctx, `UPDATE webhook_endpoints SET `+c.set+` WHERE id = $1::uuid`, e.ID); err != nil {
				t.Fatal(err)
			}
		}
		d, err := endpoints.Describe(ctx, db.Pool, nil, e.ID)
		if err != nil || !strings.HasPrefix(d.LoadError, c.want) || c.want == "" && d.LoadError != "" || strings.Contains(d.LoadError, "forged") {
			t.Errorf("after SET %s: Describe problem %q, %v; want it to start %q, with no value", c.set, d.LoadError, err, c.want)
		}
	}
}

// TestLoadOddRows: values SQL may store that Go's types do not hold as they are load without
// failing the other endpoints: a NULL entry of the filter as "" (which, as NULL in route.sql,
// matches no event type), and timestamps at ±infinity as the first and last times a
// time.Time here stands for, in SQL's order.
func TestLoadOddRows(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := t.Context()
	sound := mustAdd(t, db, nil, endpoints.New{URL: "https://sound.example/"})
	odd := mustAdd(t, db, nil, endpoints.New{URL: "https://odd.example/", EventTypes: []string{"a.b"}})
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_endpoints SET event_types = array_append(event_types, NULL),
		created_at = '-infinity', previous_secret = 'old', previous_secret_expires_at = 'infinity', disabled_at = 'infinity'
		WHERE id = $1::uuid`, odd.ID); err != nil {
		t.Fatal(err)
	}
	list, errs, err := endpoints.LoadAll(ctx, db.Pool, nil)
	if err != nil || len(list) != 2 || errs[0] != nil || errs[1] != nil {
		t.Fatalf("LoadAll = %d endpoints, %v, %v; want both, without errors", len(list), errs, err)
	}
	e := list[0] // created at -infinity: first
	if e.ID != odd.ID || list[1].ID != sound.ID {
		t.Fatalf("LoadAll's order: %s, %s; want the one created at -infinity first", e.ID, list[1].ID)
	}
	if !slices.Equal(e.EventTypes, []string{"a.b", ""}) || endpoints.Matches(e.EventTypes, "c.d") || !endpoints.Matches(e.EventTypes, "a.b") {
		t.Errorf("filter %q: want [a.b \"\"], matching a.b only", e.EventTypes)
	}
	if e.CreatedAt.IsZero() || !e.CreatedAt.Before(sound.CreatedAt) || !e.PreviousUntil.After(time.Now().AddDate(1000, 0, 0)) ||
		!e.DisabledAt.After(time.Now().AddDate(1000, 0, 0)) {
		t.Errorf("created %v, previous until %v, disabled %v: want the first time and the last two, none zero", e.CreatedAt, e.PreviousUntil, e.DisabledAt)
	}
}

// TestPageOddCreatedAt: endpoints created by SQL at ±infinity, or at a time outside the years
// 1 to 9999, are each paged once: a cursor at 'infinity' returned its own row again, a client
// paging forever.
func TestPageOddCreatedAt(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := t.Context()
	want := map[string]bool{}
	for _, at := range []string{"-infinity", "infinity", "", "0001-01-01 00:00:00.5+00", "0044-03-15 BC", "10000-01-01"} {
		e := mustAdd(t, db, nil, endpoints.New{URL: "https://sound.example/"})
		want[e.ID] = true
		if at != "" {
			if _, err := db.Pool.Exec(ctx, `UPDATE webhook_endpoints SET created_at = $2::timestamptz WHERE id = $1::uuid`, e.ID, at); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := map[string]bool{}
	pq := endpoints.PageQuery{Limit: 1}
	for page := 0; ; page++ {
		list, err := endpoints.Page(ctx, db.Pool, nil, pq)
		if err != nil || page > len(want) {
			t.Fatalf("page %d: %d endpoints, %v; seen %d of %d", page, len(list), err, len(seen), len(want))
		}
		if len(list) == 0 {
			break
		}
		if seen[list[0].ID] {
			t.Fatalf("endpoint %s (created %v) paged twice", list[0].ID, list[0].CreatedAt)
		}
		seen[list[0].ID] = true
		pq.AfterCreated, pq.AfterID = list[0].CreatedAt, list[0].ID
	}
	if len(seen) != len(want) {
		t.Errorf("paged %d endpoints, want %d", len(seen), len(want))
	}
}

// TestFramingHeadersKeptNotAdded: a header that changes how a request travels (Trailer, TE,
// Expect, Upgrade, Keep-Alive, Proxy-Connection) cannot be added, but an endpoint that stores
// one from before keeps it through every edit of its headers: refusing it there would refuse
// every change, a PATCH of GET's own output included.
func TestFramingHeadersKeptNotAdded(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := t.Context()
	e := mustAdd(t, db, nil, endpoints.New{URL: "https://sound.example/", Headers: map[string]string{"X-Team": "a"}})
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_endpoints SET headers = '{"X-Team": "a", "Keep-Alive": "timeout=5"}' WHERE id = $1::uuid`, e.ID); err != nil {
		t.Fatal(err)
	}
	merge := map[string]string{"X-Other": "b"}
	if _, err := endpoints.Update(ctx, db.Pool, nil, e.ID, endpoints.Patch{Headers: &merge, MergeHeaders: true}); err != nil {
		t.Errorf("a merge beside a stored Keep-Alive: %v", err)
	}
	all := map[string]string{"X-Team": "a", "keep-alive": "timeout=9", "X-Other": "b"}
	if _, err := endpoints.Update(ctx, db.Pool, nil, e.ID, endpoints.Patch{Headers: &all}); err != nil {
		t.Errorf("a replacement that keeps Keep-Alive (in another case): %v", err)
	}
	for _, name := range []string{"TE", "expect", "Upgrade", "Proxy-Connection", "Trailer"} {
		add := map[string]string{name: "x"}
		_, err := endpoints.Update(ctx, db.Pool, nil, e.ID, endpoints.Patch{Headers: &add, MergeHeaders: true})
		var ie *endpoints.InvalidError
		if !errors.As(err, &ie) || ie.Field != "headers" || !strings.Contains(err.Error(), name) {
			t.Errorf("adding %s: %v; want the headers field refused, naming it", name, err)
		}
	}
}

// TestOrderingOffReleasesParkedRows: rows the dispatcher parked behind their streams' heads
// ('behind its stream', due when the head is) go at once when their endpoint stops ordering
// its streams, as the rows left due do; a row another mark holds, and another endpoint's
// parked row, stay as they are.
func TestOrderingOffReleasesParkedRows(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	e := mustAdd(t, db, nil, endpoints.New{URL: "https://a.example/", Ordering: endpoints.OrderingStream})
	other := mustAdd(t, db, nil, endpoints.New{URL: "https://b.example/", Ordering: endpoints.OrderingStream})
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO webhook_outbox (stream_id, event_type, payload, endpoint_id, routed_at, order_key, created_at, deferred_reason)
		VALUES ('s', 'parked', '{}', $1::uuid, now(), 101, now() + interval '1 hour', 'behind its stream'),
		       ('s', 'parked', '{}', $1::uuid, now(), 102, now() + interval '1 hour', 'behind its stream'),
		       ('s', 'gated', '{}', $1::uuid, now(), 100, now() + interval '1 hour', 'circuit breaker open'),
		       ('s', 'other', '{}', $2::uuid, now(), 101, now() + interval '1 hour', 'behind its stream')`, e.ID, other.ID); err != nil {
		t.Fatal(err)
	}
	none := endpoints.OrderingNone
	if _, err := endpoints.Update(ctx, db.Pool, nil, e.ID, endpoints.Patch{Ordering: &none}); err != nil {
		t.Fatal(err)
	}
	var due, later int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE event_type = 'parked' AND created_at <= now() AND deferred_reason IS NULL),
		count(*) FILTER (WHERE event_type IN ('gated', 'other') AND created_at > now())
		FROM webhook_outbox`).Scan(&due, &later); err != nil {
		t.Fatal(err)
	}
	if due != 2 || later != 2 {
		t.Errorf("after ordering was turned off: %d of the 2 parked rows due now, %d of the 2 others left as they were", due, later)
	}
}
