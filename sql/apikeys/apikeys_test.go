package apikeys_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestMain fails the package if a test leaves a goroutine behind (a pool not closed).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKeysAuthenticateUntilRevoked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	acme := "acme"
	k, token, err := apikeys.Add(ctx, db.Pool, apikeys.New{Tenant: &acme, Description: "billing", CreatedBy: "cli:test"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(token, apikeys.Prefix) || !strings.HasPrefix(token, k.Prefix) || len(token) != 4+16+1+43 {
		t.Fatalf("token %q (prefix %q) is not fhk_<16 hex>_<43 base64url>", token, k.Prefix)
	}
	var stored int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_api_keys WHERE position($1 in hash::text || lookup || description) > 0`,
		token[len(token)-43:]).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("the key's secret is stored in clear (%d rows, %v)", stored, err)
	}

	got, err := apikeys.Authenticate(ctx, db.Pool, token)
	if err != nil || got.ID != k.ID || got.Admin() || *got.Tenant != "acme" {
		t.Fatalf("Authenticate(the key) = %+v, %v; want the acme key", got, err)
	}
	again, _ := apikeys.Get(ctx, db.Pool, k.ID)
	if again.LastUsedAt == nil {
		t.Fatal("a use of the key was not recorded in last_used_at")
	}

	// One character off, in the secret or the lookup; garbage; the right key revoked: all the same error.
	last := byte('A')
	if token[len(token)-1] == 'A' {
		last = 'B'
	}
	flipped := token[:len(token)-1] + string(last)
	for _, bad := range []string{flipped, "fhk_0000000000000000_" + token[len(token)-43:], "Bearer " + token, "", "fhk_"} {
		if _, err := apikeys.Authenticate(ctx, db.Pool, bad); !errors.Is(err, apikeys.ErrInvalid) {
			t.Errorf("Authenticate(%q) = %v; want ErrInvalid", bad, err)
		}
	}
	if _, err := apikeys.Revoke(ctx, db.Pool, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := apikeys.Authenticate(ctx, db.Pool, token); !errors.Is(err, apikeys.ErrInvalid) {
		t.Fatalf("a revoked key authenticated: %v", err)
	}
	if _, err := apikeys.Revoke(ctx, db.Pool, "00000000-0000-0000-0000-000000000000"); !errors.Is(err, apikeys.ErrNotFound) {
		t.Fatalf("revoking an unknown key: %v; want ErrNotFound", err)
	}
}

func TestKeyValidationNamesTheField(t *testing.T) {
	t.Parallel()
	empty, spaced, nul, notUTF8 := "", " acme", "ac\x00me", "ac\xffme"
	for _, n := range []apikeys.New{{Tenant: &empty}, {Tenant: &spaced}, {Description: strings.Repeat("x", 501)},
		{Tenant: &nul}, {Tenant: &notUTF8}, {Description: "a\x00b"}, {Description: "a\xffb"}} {
		err := n.Validate()
		if err == nil {
			t.Errorf("Validate(%+v) accepted it", n)
			continue
		}
		if !strings.HasPrefix(err.Error(), "tenant:") && !strings.HasPrefix(err.Error(), "description:") {
			t.Errorf("Validate(%+v) = %q; want the field named first", n, err)
		}
	}
	if err := (apikeys.New{}).Validate(); err != nil {
		t.Errorf("an admin key without description: %v", err)
	}
}

func TestPortalSessionsExpireAndAreNotKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	acme := "acme"
	s, token, err := apikeys.AddPortalSession(ctx, db.Pool, apikeys.New{Tenant: &acme, CreatedBy: "key:k"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(token, apikeys.PortalPrefix) || !s.Portal || s.ExpiresAt == nil {
		t.Fatalf("portal session %+v, token %q", s, token)
	}
	got, err := apikeys.Authenticate(ctx, db.Pool, token)
	if err != nil || got.ID != s.ID || got.Actor() != "portal:"+s.ID {
		t.Fatalf("Authenticate(the session) = %+v, %v", got, err)
	}
	// The same lookup and secret under the key prefix is not a key.
	if _, err := apikeys.Authenticate(ctx, db.Pool, apikeys.Prefix+strings.TrimPrefix(token, apikeys.PortalPrefix)); !errors.Is(err, apikeys.ErrInvalid) {
		t.Fatalf("a portal session passed as a key: %v", err)
	}
	if keys, _ := apikeys.List(ctx, db.Pool); len(keys) != 0 {
		t.Fatalf("api-keys list shows portal sessions: %+v", keys)
	}
	if _, err := apikeys.Revoke(ctx, db.Pool, s.ID); !errors.Is(err, apikeys.ErrNotFound) {
		t.Fatalf("revoking a portal session as a key: %v", err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_api_keys SET expires_at = now() - interval '1 second' WHERE id = $1`, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := apikeys.Authenticate(ctx, db.Pool, token); !errors.Is(err, apikeys.ErrInvalid) {
		t.Fatalf("an expired portal session authenticated: %v", err)
	}
	if _, _, err := apikeys.AddPortalSession(ctx, db.Pool, apikeys.New{CreatedBy: "x"}, 0); err == nil {
		t.Fatal("a session without a lifetime was made")
	}
}

// TestRevokingAKeyEndsTheSessionsItMade: a portal link handed out by a key that leaks or whose
// holder leaves must not outlive it. RevokeAudited ends the key's live sessions, and only its
// own; each revocation is an audit entry; a session is listed until it expires and revoked on
// its own with RevokePortalSessionAudited.
func TestRevokingAKeyEndsTheSessionsItMade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	minter, _, err := apikeys.Add(ctx, db.Pool, apikeys.New{CreatedBy: "cli:test"})
	if err != nil {
		t.Fatal(err)
	}
	acme := "acme"
	session := func(n apikeys.New) (apikeys.Key, string) {
		s, token, err := apikeys.AddPortalSession(ctx, db.Pool, n, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return s, token
	}
	mine, mineToken := session(apikeys.New{Tenant: &acme, CreatedBy: minter.Actor()})
	ops, opsToken := session(apikeys.New{CreatedBy: minter.Actor()})
	_, otherToken := session(apikeys.New{Tenant: &acme, CreatedBy: "key:someone-else"})
	expired, _ := session(apikeys.New{CreatedBy: minter.Actor()})
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_api_keys SET expires_at = now() - interval '1 second' WHERE id = $1`, expired.ID); err != nil {
		t.Fatal(err)
	}

	live, err := apikeys.ListPortalSessions(ctx, db.Pool, apikeys.SessionFilter{})
	if err != nil || len(live) != 3 {
		t.Fatalf("ListPortalSessions = %d sessions, %v; want the 3 not expired", len(live), err)
	}
	if onlyAcme, _ := apikeys.ListPortalSessions(ctx, db.Pool, apikeys.SessionFilter{Tenant: &acme}); len(onlyAcme) != 2 {
		t.Fatalf("acme's sessions: %d; want 2", len(onlyAcme))
	}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	k, ended, err := apikeys.RevokeAudited(ctx, tx, minter.ID, "cli:ops")
	if err != nil || k.RevokedAt == nil || len(ended) != 2 {
		t.Fatalf("RevokeAudited = %+v, %d sessions, %v; want the key and its 2 live sessions", k, len(ended), err)
	}
	if _, err := apikeys.RevokePortalSessionAudited(ctx, tx, minter.ID, "cli:ops"); !errors.Is(err, apikeys.ErrNotFound) {
		t.Fatalf("revoking a key as a session: %v; want ErrNotFound", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{mineToken, opsToken} {
		if _, err := apikeys.Authenticate(ctx, db.Pool, token); !errors.Is(err, apikeys.ErrInvalid) {
			t.Errorf("a session of the revoked key still authenticates: %v", err)
		}
	}
	other, err := apikeys.Authenticate(ctx, db.Pool, otherToken)
	if err != nil {
		t.Fatalf("another key's session was ended too: %v", err)
	}
	var entries []string
	rows, _ := db.Pool.Query(ctx, `SELECT action || ' ' || object_id || ' ' || actor FROM webhook_audit ORDER BY id`)
	for rows.Next() {
		var e string
		_ = rows.Scan(&e)
		entries = append(entries, e)
	}
	if rows.Err() != nil || len(entries) != 3 || entries[0] != "api_key.revoke "+minter.ID+" cli:ops" ||
		!slices.Contains(entries, "portal_session.revoke "+mine.ID+" cli:ops") || !slices.Contains(entries, "portal_session.revoke "+ops.ID+" cli:ops") {
		t.Fatalf("audit trail = %q; want the key's revocation and its two sessions'", entries)
	}

	s, err := apikeys.RevokePortalSessionAudited(ctx, db.Pool, other.ID, "cli:ops")
	if err != nil || s.RevokedAt == nil {
		t.Fatalf("RevokePortalSessionAudited = %+v, %v", s, err)
	}
	if _, err := apikeys.Authenticate(ctx, db.Pool, otherToken); !errors.Is(err, apikeys.ErrInvalid) {
		t.Fatalf("a revoked session authenticates: %v", err)
	}
}

// TestDeleteExpiredSessions deletes the expired portal sessions, in batches smaller than
// their number, and nothing else: not a session still live, not a key, revoked or not.
func TestDeleteExpiredSessions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := sqltest.NewMigrated(t)
	acme := "acme"
	n := apikeys.New{Tenant: &acme, CreatedBy: "key:test"}
	var expired []string
	for range 5 {
		s, _, err := apikeys.AddPortalSession(ctx, db.Pool, n, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		expired = append(expired, s.ID)
	}
	live, liveToken, err := apikeys.AddPortalSession(ctx, db.Pool, n, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := apikeys.Add(ctx, db.Pool, apikeys.New{Tenant: &acme, CreatedBy: "cli:test"})
	if err != nil {
		t.Fatal(err)
	}
	revoked, _, err := apikeys.Add(ctx, db.Pool, apikeys.New{Tenant: &acme, CreatedBy: "cli:test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apikeys.Revoke(ctx, db.Pool, revoked.ID); err != nil {
		t.Fatal(err)
	}
	// Expired a second ago, and one exactly now: Authenticate refuses both.
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_api_keys SET expires_at = now() - interval '1 second' WHERE id = ANY($1::uuid[])`,
		expired[1:]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE webhook_api_keys SET expires_at = now() WHERE id = $1::uuid`, expired[0]); err != nil {
		t.Fatal(err)
	}

	if _, err := apikeys.DeleteExpiredSessions(ctx, db.Pool, 0); err == nil {
		t.Error("a batch of 0 was accepted")
	}
	got, err := apikeys.DeleteExpiredSessions(ctx, db.Pool, 2)
	if err != nil || got != 5 {
		t.Fatalf("DeleteExpiredSessions = %d, %v; want the 5 expired sessions, in batches of 2", got, err)
	}
	var left []string
	rows, _ := db.Pool.Query(ctx, `SELECT id::text FROM webhook_api_keys ORDER BY id`)
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{live.ID, key.ID, revoked.ID}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Errorf("left %v; want the live session, the key and the revoked key %v", left, want)
	}
	if _, err := apikeys.Authenticate(ctx, db.Pool, liveToken); err != nil {
		t.Errorf("the live session no longer authenticates: %v", err)
	}
	if got, err := apikeys.DeleteExpiredSessions(ctx, db.Pool, 2); err != nil || got != 0 {
		t.Errorf("a second run = %d, %v; want nothing deleted", got, err)
	}
}
