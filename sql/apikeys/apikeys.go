// Package apikeys makes, checks and revokes the keys of fluxhook's management API
// (webhook_api_keys, schema 16).
//
// A key reads "fhk_<lookup>_<secret>": lookup is 16 hex characters that find the row, secret
// 256 random bits. Only the SHA-256 of the whole key is stored, so the table leaks nothing an
// attacker can call the API with; the stored hash is compared in constant time, so the time a
// wrong key takes says nothing about how much of it was right. A plain hash, not a slow one
// such as bcrypt: the key is random and 256 bits long, not a password a dictionary can guess,
// and a slow hash would cost every API request milliseconds of CPU.
package apikeys

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

// Prefix starts every key, and PortalPrefix every portal session, so that secret scanners
// (and people) recognise one in a log or a repository, and tell the two apart.
const (
	Prefix       = "fhk_"
	PortalPrefix = "fhp_"
)

// Querier is what the functions here run their statements through: a pool, a connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Key is one row of webhook_api_keys, never with its secret or hash.
type Key struct {
	ID          string     `json:"id"`
	Prefix      string     `json:"prefix"`
	Tenant      *string    `json:"tenant"`
	Description string     `json:"description"`
	CreatedBy   string     `json:"created_by"`
	CreatedAt   time.Time  `json:"created_at"`
	LastUsedAt  *time.Time `json:"last_used_at"`
	RevokedAt   *time.Time `json:"revoked_at"`
	// Portal says the key is a portal session, which ExpiresAt ends.
	Portal    bool       `json:"-"`
	ExpiresAt *time.Time `json:"-"`
}

// Admin says whether the key sees every tenant.
func (k Key) Admin() bool { return k.Tenant == nil }

// Actor is how the audit trail names the key: a portal session by its own id, so that the
// trail tells a change made in the portal from one made by the application.
func (k Key) Actor() string {
	if k.Portal {
		return "portal:" + k.ID
	}
	return "key:" + k.ID
}

// ErrNotFound is returned for a key id that does not exist.
var ErrNotFound = errors.New("api key not found")

// ErrInvalid is returned by Authenticate for anything but a known, unrevoked key: malformed,
// unknown, wrong secret and revoked all look the same to the caller, so that an attacker learns
// nothing from which it was.
var ErrInvalid = errors.New("invalid or revoked API key")

// New is a key to make.
type New struct {
	// Tenant limits the key to one tenant; nil makes an admin key.
	Tenant *string
	// Description is free text for people ("billing service", "portal").
	Description string
	// CreatedBy names who made it, as the audit trail does ("cli:alice", "key:<id>").
	CreatedBy string
}

// maxTenant and maxDescription bound what a key row may hold; a tenant is the same text
// endpoints carry, whose limit is the same.
const (
	maxTenant      = 200
	maxDescription = 500
)

// Validate says what is wrong with n, naming the field, or nil. Text PostgreSQL cannot store
// (a NUL byte, invalid UTF-8) is refused here, whoever the caller, so that it is a field's
// error rather than a failed statement; a tenant takes no control character either, as an
// endpoint's tenant does not.
func (n New) Validate() error {
	if n.Tenant != nil {
		t := *n.Tenant
		if t == "" || len(t) > maxTenant || strings.TrimSpace(t) != t {
			return fmt.Errorf("tenant: must be 1 to %d characters without surrounding spaces", maxTenant)
		}
		if !utf8.ValidString(t) || strings.ContainsFunc(t, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return errors.New("tenant: must be printable UTF-8 text, without control characters")
		}
	}
	if len(n.Description) > maxDescription {
		return fmt.Errorf("description: at most %d characters", maxDescription)
	}
	if !utf8.ValidString(n.Description) || strings.ContainsRune(n.Description, 0) {
		return errors.New("description: must be UTF-8 text without NUL bytes")
	}
	return nil
}

// Add makes a key and returns it with its secret, the only time the secret exists outside the
// caller's hands.
func Add(ctx context.Context, q Querier, n New) (Key, string, error) {
	return add(ctx, q, n, Prefix, "key", nil)
}

// AddPortalSession makes a portal session: a key of n's tenant (nil: an operator's session,
// every tenant) that ends after ttl. Returned with its secret, which goes into the portal link.
func AddPortalSession(ctx context.Context, q Querier, n New, ttl time.Duration) (Key, string, error) {
	if ttl <= 0 {
		return Key{}, "", errors.New("ttl: must be positive")
	}
	return add(ctx, q, n, PortalPrefix, "portal", &ttl)
}

func add(ctx context.Context, q Querier, n New, prefix, kind string, ttl *time.Duration) (Key, string, error) {
	if err := n.Validate(); err != nil {
		return Key{}, "", err
	}
	lookupBytes := make([]byte, 8)
	secretBytes := make([]byte, 32)
	if _, err := rand.Read(lookupBytes); err != nil {
		return Key{}, "", err
	}
	if _, err := rand.Read(secretBytes); err != nil {
		return Key{}, "", err
	}
	lookup := hex.EncodeToString(lookupBytes)
	token := prefix + lookup + "_" + base64.RawURLEncoding.EncodeToString(secretBytes)
	sum := sha256.Sum256([]byte(token))
	var ttlMS any
	if ttl != nil {
		ttlMS = ttl.Milliseconds()
	}
	row := q.QueryRow(ctx, `INSERT INTO webhook_api_keys (lookup, hash, tenant, description, created_by, kind, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, now() + $7::bigint * interval '1 millisecond') RETURNING `+columns,
		lookup, sum[:], n.Tenant, n.Description, n.CreatedBy, kind, ttlMS)
	k, err := scan(row)
	if err != nil {
		return Key{}, "", fmt.Errorf("adding an API key: %w", err)
	}
	return k, token, nil
}

// columns are the key's columns as scan reads them; prefix is what lists show of a key, enough
// to tell which one a leaked key is.
const columns = `id::text, CASE kind WHEN 'portal' THEN 'fhp_' ELSE 'fhk_' END || lookup, tenant, description, created_by,
	created_at, last_used_at, revoked_at, kind = 'portal', expires_at`

func scan(row pgx.Row) (Key, error) {
	var k Key
	err := row.Scan(&k.ID, &k.Prefix, &k.Tenant, &k.Description, &k.CreatedBy, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt,
		&k.Portal, &k.ExpiresAt)
	return k, err
}

// List returns the keys, newest first, revoked ones included (they are what the audit trail
// names); portal sessions are not keys anyone manages, and are left out.
func List(ctx context.Context, q Querier) ([]Key, error) {
	rows, _ := q.Query(ctx, `SELECT `+columns+` FROM webhook_api_keys WHERE kind = 'key' ORDER BY created_at DESC, id`)
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("listing API keys: %w", err)
	}
	return keys, nil
}

// Get returns one key by id.
func Get(ctx context.Context, q Querier, id string) (Key, error) {
	return get(ctx, q, id, "key")
}

func get(ctx context.Context, q Querier, id, kind string) (Key, error) {
	if !isUUID(id) {
		return Key{}, ErrNotFound
	}
	k, err := scan(q.QueryRow(ctx, `SELECT `+columns+` FROM webhook_api_keys WHERE id = $1::uuid AND kind = $2`, id, kind))
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrNotFound
	}
	return k, err
}

// Revoke ends a key at once: the next request with it gets 401. Revoking a revoked key is not
// an error and keeps its first revocation time. The portal sessions the key made live on:
// RevokeAudited ends them with it.
func Revoke(ctx context.Context, q Querier, id string) (Key, error) {
	return revoke(ctx, q, id, "key")
}

func revoke(ctx context.Context, q Querier, id, kind string) (Key, error) {
	if !isUUID(id) {
		return Key{}, ErrNotFound
	}
	k, err := scan(q.QueryRow(ctx, `UPDATE webhook_api_keys SET revoked_at = coalesce(revoked_at, now())
		WHERE id = $1::uuid AND kind = $2 RETURNING `+columns, id, kind))
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrNotFound
	}
	return k, err
}

// Session is a portal session as lists show it: its record and when it ends, never its token.
type Session struct {
	Key
	ExpiresAt time.Time `json:"expires_at"`
}

// SessionOf is the portal session k as lists show it.
func SessionOf(k Key) Session {
	s := Session{Key: k}
	if k.ExpiresAt != nil {
		s.ExpiresAt = *k.ExpiresAt
	}
	return s
}

// SessionFilter selects a page of portal sessions.
type SessionFilter struct {
	// Tenant, when set, keeps that tenant's sessions only.
	Tenant *string
	// AfterCreated and AfterID are the last session of the previous page (zero: the first).
	AfterCreated time.Time
	AfterID      string
	// Limit is the most sessions returned (1 to 1000; 0 means 100).
	Limit int
}

// ListPortalSessions returns the portal sessions that have not expired, revoked ones included
// (so that a revocation shows), newest first (created_at, then id): the links an operator may
// need to end before they expire. Expired ones are left out: they end by themselves, and one
// is made per link handed out.
func ListPortalSessions(ctx context.Context, q Querier, f SessionFilter) ([]Session, error) {
	limit := f.Limit
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	var after, afterID any
	if !f.AfterCreated.IsZero() {
		if !isUUID(f.AfterID) {
			return nil, ErrNotFound
		}
		after, afterID = f.AfterCreated, f.AfterID
	}
	rows, _ := q.Query(ctx, `SELECT `+columns+` FROM webhook_api_keys
		WHERE kind = 'portal' AND expires_at > now() AND ($1::text IS NULL OR tenant = $1)
		  AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3::uuid))
		ORDER BY created_at DESC, id DESC LIMIT $4`, f.Tenant, after, afterID, limit)
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Session, error) {
		k, err := scan(r)
		return SessionOf(k), err
	})
	if err != nil {
		return nil, fmt.Errorf("listing portal sessions: %w", err)
	}
	return list, nil
}

// RevokePortalSession ends a portal session at once, as Revoke ends a key; ErrNotFound for an
// id that is not a session's.
func RevokePortalSession(ctx context.Context, q Querier, id string) (Key, error) {
	return revoke(ctx, q, id, "portal")
}

// DeleteExpiredSessions deletes the portal sessions that have expired, batch rows a
// statement until none is left, and returns how many it deleted. A session is made for every
// portal link and works for a day at most, so without it the table grows by every link ever
// made; an expired session is refused, listed nowhere and ended by no one, so nothing reads it
// again. The audit trail names a session's changes by its id ("portal:<id>"), which stays in
// the trail. Small statements, so that no delete holds many row locks or a long transaction.
func DeleteExpiredSessions(ctx context.Context, q Querier, batch int) (int64, error) {
	if batch < 1 {
		return 0, errors.New("batch: must be positive")
	}
	var total int64
	for {
		tag, err := q.Exec(ctx, `DELETE FROM webhook_api_keys
			WHERE id IN (SELECT id FROM webhook_api_keys WHERE kind = 'portal' AND expires_at <= now() LIMIT $1)`, batch)
		if err != nil {
			return total, fmt.Errorf("deleting expired portal sessions: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}

// revokeSessionsMadeBy ends the live portal sessions the key k made (created_by is k's actor
// name) and returns them as they are now, revoked: before, each had no revocation time.
func revokeSessionsMadeBy(ctx context.Context, q Querier, k Key) ([]Key, error) {
	rows, _ := q.Query(ctx, `UPDATE webhook_api_keys SET revoked_at = now()
		WHERE kind = 'portal' AND created_by = $1 AND revoked_at IS NULL AND expires_at > now()
		RETURNING `+columns, k.Actor())
	ended, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) { return scan(r) })
	if err != nil {
		return nil, fmt.Errorf("revoking the portal sessions of key %s: %w", k.ID, err)
	}
	return ended, nil
}

// Authenticate returns the unrevoked, unexpired key or portal session token is, or
// ErrInvalid. It records the use at most once a minute per key, in the same round trip.
func Authenticate(ctx context.Context, q Querier, token string) (Key, error) {
	lookup, kind, ok := parse(token)
	if !ok {
		return Key{}, ErrInvalid
	}
	var hash []byte
	var k Key
	err := q.QueryRow(ctx, `WITH k AS (
			SELECT * FROM webhook_api_keys
			WHERE lookup = $1 AND kind = $2 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
		), used AS (
			UPDATE webhook_api_keys w SET last_used_at = now()
			FROM k WHERE w.id = k.id AND (k.last_used_at IS NULL OR k.last_used_at < now() - interval '1 minute')
		)
		SELECT hash, `+columns+` FROM k`,
		lookup, kind).Scan(&hash, &k.ID, &k.Prefix, &k.Tenant, &k.Description, &k.CreatedBy, &k.CreatedAt, &k.LastUsedAt, &k.RevokedAt,
		&k.Portal, &k.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrInvalid
	}
	if err != nil {
		return Key{}, fmt.Errorf("checking an API key: %w", err)
	}
	sum := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(hash, sum[:]) != 1 {
		return Key{}, ErrInvalid
	}
	return k, nil
}

// parse returns the lookup part of a well-formed key or portal session, and its kind.
func parse(token string) (lookup, kind string, ok bool) {
	kind = "key"
	rest, ok := strings.CutPrefix(token, Prefix)
	if !ok {
		if rest, ok = strings.CutPrefix(token, PortalPrefix); !ok {
			return "", "", false
		}
		kind = "portal"
	}
	lookup, secret, ok := strings.Cut(rest, "_")
	if !ok || len(lookup) != 16 || len(secret) != 43 {
		return "", "", false
	}
	if _, err := hex.DecodeString(lookup); err != nil {
		return "", "", false
	}
	return lookup, kind, true
}

// isUUID says whether s has the 8-4-4-4-12 hex form (sql.CanonicalUUID), so that a malformed
// id is not found rather than a database error from the ::uuid cast.
func isUUID(s string) bool {
	_, ok := fluxsql.CanonicalUUID(s)
	return ok
}
