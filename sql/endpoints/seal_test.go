package endpoints_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// storedHeaders is the endpoint's headers column as stored: what a reader of the table sees.
func storedHeaders(t *testing.T, db *sqltest.DB, id string) map[string]string {
	t.Helper()
	var raw []byte
	if err := db.Pool.QueryRow(context.Background(), "SELECT headers FROM webhook_endpoints WHERE id = $1::uuid", id).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	h := map[string]string{}
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatalf("headers column %s is not a JSON object of strings: %v", raw, err)
	}
	return h
}

// sealV1 seals plain as fluxhook's first format did ("enc:v1:", no additional data), to stand
// for a secret stored before sealed values were bound to their endpoint.
func sealV1(t *testing.T, key, plain string) string {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(key)
	if err != nil {
		t.Fatal(err)
	}
	block, err := aes.NewCipher(raw)
	if err != nil {
		t.Fatal(err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	nonce := make([]byte, gcm.NonceSize())
	_, _ = rand.Read(nonce)
	return "enc:v1:" + base64.StdEncoding.EncodeToString(gcm.Seal(nonce, nonce, []byte(plain), nil))
}

func exec(t *testing.T, db *sqltest.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestHeadersSealedAtRest: with WEBHOOK_ENCRYPTION_KEY, custom header values (typically an
// Authorization the consumer checks) are sealed like secrets, by Add and by Update, while the
// column stays a JSON object of strings; the store opens them. A header written in clear by
// SQL still works next to sealed ones; without a key they are stored in clear.
func TestHeadersSealedAtRest(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, endpoints.GenerateKey(), "")
	h := map[string]string{"Authorization": "Bearer header-plaintext-1", "X-Team": "team-plaintext-2"}
	e := mustAdd(t, db, c, endpoints.New{URL: "https://consumer.example/", Headers: h})
	if !maps.Equal(e.Headers, h) {
		t.Errorf("Add returned headers %v, want %v", e.Headers, h)
	}
	sealedOnly := func(what string, want map[string]string) {
		t.Helper()
		row := rowText(t, db, e.ID)
		for _, v := range want {
			if strings.Contains(row, v) {
				t.Errorf("%s: the row shows the header value %q in clear: %s", what, v, row)
			}
		}
		stored := storedHeaders(t, db, e.ID)
		if len(stored) != len(want) {
			t.Errorf("%s: stored headers %v, want the names of %v", what, stored, want)
		}
		for k := range want {
			if !strings.HasPrefix(stored[k], "enc:v2:") {
				t.Errorf("%s: header %s is stored as %q, want an enc:v2: sealed value", what, k, stored[k])
			}
		}
		if got := mustGet(t, db, c, e.ID); !maps.Equal(got.Headers, want) {
			t.Errorf("%s: Get opens the headers to %v, want %v", what, got.Headers, want)
		}
		list, errs, err := endpoints.LoadAll(ctx, db.Pool, c)
		if err != nil || len(list) == 0 || errs[0] != nil || !maps.Equal(list[0].Headers, want) {
			t.Errorf("%s: LoadAll = %v, %v, %v; want the headers %v opened", what, list, errs, err, want)
		}
	}
	sealedOnly("add", h)

	merge := map[string]string{"X-New": "new-plaintext-3"}
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Headers: &merge, MergeHeaders: true}); err != nil {
		t.Fatal(err)
	}
	h["X-New"] = "new-plaintext-3"
	sealedOnly("update, merged", h)

	replace := map[string]string{"X-Only": "only-plaintext-4"}
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Headers: &replace}); err != nil {
		t.Fatal(err)
	}
	sealedOnly("update, replaced", replace)

	// A header added in clear by SQL (or before the key was set) still works.
	exec(t, db, `UPDATE webhook_endpoints SET headers = headers || '{"X-Sql": "from-sql"}' WHERE id = $1::uuid`, e.ID)
	if got := mustGet(t, db, c, e.ID); got.Headers["X-Sql"] != "from-sql" || got.Headers["X-Only"] != "only-plaintext-4" {
		t.Errorf("a header in clear next to a sealed one: Get = %v", got.Headers)
	}

	// Without a key they are stored as they are: the documented trade-off.
	clear := mustAdd(t, db, nil, endpoints.New{URL: "https://consumer.example/", Headers: map[string]string{"X-Team": "visible-value"}})
	if !strings.Contains(rowText(t, db, clear.ID), "visible-value") {
		t.Errorf("without a key the header value is expected in clear")
	}
}

// TestSealedValuesBoundToEndpoint: a sealed value opens only where it was sealed (its
// endpoint, and the secret, the previous secret or the header of its name). Copied elsewhere
// by SQL, it makes the endpoint unusable (an error, as for a key that does not open) instead
// of signing with another endpoint's secret, reviving a rotated-out secret, or sending a
// secret as a header value.
func TestSealedValuesBoundToEndpoint(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, endpoints.GenerateKey(), "")
	add := func() endpoints.Endpoint {
		return mustAdd(t, db, c, endpoints.New{URL: "https://consumer.example/",
			Headers: map[string]string{"Authorization": "Bearer token-of-" + endpoints.GenerateKey(), "X-Other": "other"}})
	}
	cases := []struct {
		name string
		sql  string // $1 the victim endpoint, $2 the other one
	}{
		{"secret copied from another endpoint",
			`UPDATE webhook_endpoints SET secret = (SELECT secret FROM webhook_endpoints WHERE id = $2::uuid) WHERE id = $1::uuid`},
		{"previous secret swapped with the secret",
			`UPDATE webhook_endpoints SET secret = previous_secret, previous_secret = secret WHERE id = $1::uuid AND $2::uuid IS NOT NULL`},
		{"header copied to another header name",
			`UPDATE webhook_endpoints SET headers = jsonb_set(headers, '{X-Other}', headers->'Authorization') WHERE id = $1::uuid AND $2::uuid IS NOT NULL`},
		{"header copied from another endpoint",
			`UPDATE webhook_endpoints SET headers = jsonb_set(headers, '{Authorization}', (SELECT headers->'Authorization' FROM webhook_endpoints WHERE id = $2::uuid)) WHERE id = $1::uuid`},
		{"secret copied into a header",
			`UPDATE webhook_endpoints SET headers = jsonb_set(headers, '{X-Other}', to_jsonb((SELECT secret FROM webhook_endpoints WHERE id = $2::uuid))) WHERE id = $1::uuid`},
		{"header copied into the secret",
			`UPDATE webhook_endpoints SET secret = (SELECT headers->>'Authorization' FROM webhook_endpoints WHERE id = $2::uuid) WHERE id = $1::uuid`},
	}
	for _, tc := range cases {
		victim, other := add(), add()
		// A previous secret, in its grace, for the swap.
		if _, err := endpoints.RotateSecret(ctx, db.Pool, c, victim.ID, "", time.Hour); err != nil {
			t.Fatal(err)
		}
		before := mustGet(t, db, c, victim.ID)
		exec(t, db, tc.sql, victim.ID, other.ID)

		got, err := endpoints.Get(ctx, db.Pool, c, victim.ID)
		if err == nil || errors.Is(err, endpoints.ErrNotFound) {
			t.Errorf("%s: Get = %v; want an error saying a value does not open", tc.name, err)
			continue
		}
		if got.ID != victim.ID {
			t.Errorf("%s: Get returned %+v with its error; want the endpoint's other fields", tc.name, got)
		}
		// Neither the copied value opened nor its sealed text passed off as the value.
		for _, v := range []string{other.Secret, other.Headers["Authorization"], before.PreviousSecret, before.Headers["Authorization"]} {
			if got.Secret == v && v != before.Secret || got.PreviousSecret == v && v != before.PreviousSecret ||
				got.Headers["X-Other"] == v || got.Headers["Authorization"] == v && v != before.Headers["Authorization"] {
				t.Errorf("%s: Get opened a copied value: %+v", tc.name, got)
			}
			if strings.Contains(err.Error(), v) {
				t.Errorf("%s: the error shows a secret: %v", tc.name, err)
			}
		}
		for _, v := range got.Headers {
			if strings.HasPrefix(v, "enc:") {
				t.Errorf("%s: Get returned a header value still sealed: %v", tc.name, got.Headers)
			}
		}
		if strings.Contains(err.Error(), "enc:v") {
			t.Errorf("%s: the error shows stored text: %v", tc.name, err)
		}
		d, err := endpoints.Describe(ctx, db.Pool, c, victim.ID)
		if err != nil || d.LoadError == "" {
			t.Errorf("%s: Describe = %v, LoadError %q; want the problem in LoadError", tc.name, err, d.LoadError)
		}
		list, errs, err := endpoints.LoadAll(ctx, db.Pool, c)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range list {
			switch {
			case e.ID == victim.ID && errs[i] == nil:
				t.Errorf("%s: LoadAll loads the endpoint without an error: the dispatcher would use it", tc.name)
			case e.ID != victim.ID && errs[i] != nil:
				t.Errorf("%s: LoadAll fails endpoint %s too: %v", tc.name, e.ID, errs[i])
			}
		}
		exec(t, db, `DELETE FROM webhook_endpoints`)
	}
}

// TestLegacySealedValuesAndReencrypt: a secret sealed by an older fluxhook ("enc:v1:", not
// bound to its endpoint) still opens, so an upgrade keeps working; Reencrypt re-seals it
// bound ("enc:v2:"), seals header values stored in clear, re-seals header values sealed with
// the previous key, and has nothing left to do when run again.
func TestLegacySealedValuesAndReencrypt(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	key := endpoints.GenerateKey()
	c := newCipher(t, key, "")
	var legacy string
	err := db.Pool.QueryRow(ctx, `INSERT INTO webhook_endpoints (url, secret, previous_secret, previous_secret_expires_at, headers)
		VALUES ('https://legacy.example/', $1, $2, clock_timestamp() + interval '1 hour', '{"Authorization": "Bearer clear-header-1"}')
		RETURNING id::text`, sealV1(t, key, "legacy-secret-1"), sealV1(t, key, "legacy-previous-1")).Scan(&legacy)
	if err != nil {
		t.Fatal(err)
	}
	want := endpoints.Endpoint{Secret: "legacy-secret-1", PreviousSecret: "legacy-previous-1",
		Headers: map[string]string{"Authorization": "Bearer clear-header-1"}}
	check := func(what string, c *endpoints.Cipher) {
		t.Helper()
		got := mustGet(t, db, c, legacy)
		if got.Secret != want.Secret || got.PreviousSecret != want.PreviousSecret || !maps.Equal(got.Headers, want.Headers) {
			t.Errorf("%s: Get = %q, %q, %v; want %q, %q, %v", what, got.Secret, got.PreviousSecret, got.Headers,
				want.Secret, want.PreviousSecret, want.Headers)
		}
	}
	check("before reencrypt", c)

	// An endpoint added today needs nothing.
	mustAdd(t, db, c, endpoints.New{URL: "https://current.example/", Headers: map[string]string{"X-Team": "t"}})
	n, err := endpoints.Reencrypt(ctx, db.Pool, c)
	if err != nil || n != 1 {
		t.Fatalf("Reencrypt = %d, %v; want 1 (the legacy endpoint)", n, err)
	}
	secret, previous := storedSecrets(t, db, legacy)
	if !strings.HasPrefix(secret, "enc:v2:") || previous == nil || !strings.HasPrefix(*previous, "enc:v2:") {
		t.Errorf("after Reencrypt the secrets are stored as %q, %v; want enc:v2:", secret, previous)
	}
	if h := storedHeaders(t, db, legacy); !strings.HasPrefix(h["Authorization"], "enc:v2:") {
		t.Errorf("after Reencrypt the header is stored as %q; want enc:v2:", h["Authorization"])
	}
	if row := rowText(t, db, legacy); strings.Contains(row, "clear-header-1") {
		t.Errorf("after Reencrypt the row shows the header in clear: %s", row)
	}
	check("after reencrypt", c)
	if n, err := endpoints.Reencrypt(ctx, db.Pool, c); err != nil || n != 0 {
		t.Errorf("a second Reencrypt = %d, %v; want 0", n, err)
	}

	// Key rotation: header values sealed with the old key are re-sealed with the new one.
	newKey := endpoints.GenerateKey()
	if n, err := endpoints.Reencrypt(ctx, db.Pool, newCipher(t, newKey, key)); err != nil || n != 2 {
		t.Fatalf("Reencrypt with a new key = %d, %v; want 2", n, err)
	}
	check("after a key rotation", newCipher(t, newKey, ""))
	list, errs, err := endpoints.LoadAll(ctx, db.Pool, newCipher(t, newKey, ""))
	if err != nil || len(list) != 2 || errs[0] != nil || errs[1] != nil || list[1].Headers["X-Team"] != "t" {
		t.Errorf("after a key rotation, LoadAll with the new key alone = %+v, %v, %v", list, errs, err)
	}
}

// TestSealedValuesKeptWithoutKey: the writes that keep a sealed value do so without holding
// the key where they can. A header merge without the key keeps the sealed headers as they are
// (still opening with the key, under their names); a rotation that keeps the current secret
// for a grace re-seals it as the previous secret, so it needs the key and says so, while a
// rotation without a grace does not.
func TestSealedValuesKeptWithoutKey(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, endpoints.GenerateKey(), "")
	e := mustAdd(t, db, c, endpoints.New{URL: "https://consumer.example/", Headers: map[string]string{"Authorization": "Bearer kept"}})

	merge := map[string]string{"X-Team": "added-without-key"}
	if _, err := endpoints.Update(ctx, db.Pool, nil, e.ID, endpoints.Patch{Headers: &merge, MergeHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, db, c, e.ID); got.Headers["Authorization"] != "Bearer kept" || got.Headers["X-Team"] != "added-without-key" {
		t.Errorf("after a merge without the key, Get = %v", got.Headers)
	}
	// With the key, a merge seals the header stored in clear too.
	merge = map[string]string{"X-Other": "o"}
	if _, err := endpoints.Update(ctx, db.Pool, c, e.ID, endpoints.Patch{Headers: &merge, MergeHeaders: true}); err != nil {
		t.Fatal(err)
	}
	for name, v := range storedHeaders(t, db, e.ID) {
		if !strings.HasPrefix(v, "enc:v2:") {
			t.Errorf("after a merge with the key, header %s is stored as %q", name, v)
		}
	}

	if _, err := endpoints.RotateSecret(ctx, db.Pool, nil, e.ID, "", time.Hour); !errors.Is(err, endpoints.ErrNoKey) ||
		!strings.Contains(err.Error(), "no grace") {
		t.Errorf("RotateSecret with a grace, without the key: %v; want ErrNoKey and the way out", err)
	}
	if after := mustGet(t, db, c, e.ID); after.Secret != e.Secret {
		t.Errorf("a refused rotation changed the secret")
	}
	fresh, err := endpoints.RotateSecret(ctx, db.Pool, c, e.ID, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, previous := storedSecrets(t, db, e.ID)
	if got := mustGet(t, db, c, e.ID); got.Secret != fresh || got.PreviousSecret != e.Secret || previous == nil || !strings.HasPrefix(*previous, "enc:v2:") {
		t.Errorf("after a rotation with the key: %q, %q, stored previous %v", got.Secret, got.PreviousSecret, previous)
	}
	if _, err := endpoints.RotateSecret(ctx, db.Pool, nil, e.ID, "leaked-replacement", endpoints.NoGrace); err != nil {
		t.Errorf("RotateSecret without a grace, without the key: %v", err)
	}
}
