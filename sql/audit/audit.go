// Package audit records every change made to fluxhook's objects through the management API
// or the CLI in webhook_audit (schema 16), and reads the trail back.
//
// An entry is written in the transaction of the change it records, so that the trail never
// shows a change that was rolled back nor misses one that committed. Secrets never reach it:
// callers pass the object as they show it to users (secrets and header values left out), and
// Record refuses an entry whose JSON still holds a field named like a secret.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/user"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the functions here run their statements through: a pool, a connection or a
// transaction (the change's own, so that both commit or neither).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Entry is one change.
type Entry struct {
	ID         int64           `json:"id"`
	At         time.Time       `json:"at"`
	Actor      string          `json:"actor"`
	Tenant     *string         `json:"tenant"`
	Action     string          `json:"action"`
	ObjectType string          `json:"object_type"`
	ObjectID   string          `json:"object_id"`
	Before     json.RawMessage `json:"before"`
	After      json.RawMessage `json:"after"`
}

// Change is what Record writes: the object before and after (nil for none), as JSON-encodable
// values without secrets.
type Change struct {
	Actor      string
	Tenant     *string
	Action     string
	ObjectType string
	ObjectID   string
	Before     any
	After      any
}

// secretFields are JSON field names that must never reach the trail: a caller that passed an
// object with its secret would otherwise store it for as long as the trail is kept.
var secretFields = []string{`"secret"`, `"previous_secret"`, `"hash"`, `"key"`, `"token"`}

// Record writes c. Call it with the transaction that makes the change.
func Record(ctx context.Context, q Querier, c Change) error {
	before, err := encode(c.Before)
	if err != nil {
		return fmt.Errorf("audit: encoding the object before %s: %w", c.Action, err)
	}
	after, err := encode(c.After)
	if err != nil {
		return fmt.Errorf("audit: encoding the object after %s: %w", c.Action, err)
	}
	if c.Actor == "" || c.Action == "" || c.ObjectType == "" || c.ObjectID == "" {
		return errors.New("audit: an entry needs an actor, an action, an object type and an object id")
	}
	_, err = q.Exec(ctx, `INSERT INTO webhook_audit (actor, tenant, action, object_type, object_id, before, after)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, c.Actor, c.Tenant, c.Action, c.ObjectType, c.ObjectID, before, after)
	if err != nil {
		return fmt.Errorf("audit: recording %s of %s %s: %w", c.Action, c.ObjectType, c.ObjectID, err)
	}
	return nil
}

// RecordAll writes every change in one statement: a bulk replay or purge records one entry per
// dead letter without a round trip each. Call it with the transaction that makes the changes.
func RecordAll(ctx context.Context, q Querier, changes []Change) error {
	if len(changes) == 0 {
		return nil
	}
	n := len(changes)
	actors, tenants, actions, types, ids := make([]string, n), make([]*string, n), make([]string, n), make([]string, n), make([]string, n)
	befores, afters := make([]*string, n), make([]*string, n)
	for i, c := range changes {
		if c.Actor == "" || c.Action == "" || c.ObjectType == "" || c.ObjectID == "" {
			return errors.New("audit: an entry needs an actor, an action, an object type and an object id")
		}
		b, err := encode(c.Before)
		if err != nil {
			return fmt.Errorf("audit: encoding the object before %s: %w", c.Action, err)
		}
		a, err := encode(c.After)
		if err != nil {
			return fmt.Errorf("audit: encoding the object after %s: %w", c.Action, err)
		}
		actors[i], tenants[i], actions[i], types[i], ids[i] = c.Actor, c.Tenant, c.Action, c.ObjectType, c.ObjectID
		if b != nil {
			s := string(b)
			befores[i] = &s
		}
		if a != nil {
			s := string(a)
			afters[i] = &s
		}
	}
	_, err := q.Exec(ctx, `INSERT INTO webhook_audit (actor, tenant, action, object_type, object_id, before, after)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[], $7::jsonb[])`,
		actors, tenants, actions, types, ids, befores, afters)
	if err != nil {
		return fmt.Errorf("audit: recording %d changes: %w", n, err)
	}
	return nil
}

func encode(v any) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if string(b) == "null" {
		return nil, nil
	}
	for _, f := range secretFields {
		if strings.Contains(string(b), f+":") {
			return nil, fmt.Errorf("the object has a field %s: leave secrets out of the audit trail", f)
		}
	}
	return b, nil
}

// Filter selects entries. Tenant, when set, is the scope of a tenant's key: only that tenant's
// entries. Before is a keyset cursor: entries with a smaller id (the list is newest first).
type Filter struct {
	Tenant     *string
	ObjectType string
	ObjectID   string
	Before     int64
	Limit      int
}

// List returns entries newest first.
func List(ctx context.Context, q Querier, f Filter) ([]Entry, error) {
	limit := f.Limit
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	// A tenant reads its own keys' and sessions' ids as actors; every other actor (an operator's
	// login name, an admin key's id) reads "operator", in the entry and in the created_by of
	// the object it shows (a key, a recovery): staff names are not a customer's to know.
	rows, _ := q.Query(ctx, `SELECT id, at, `+visibleActor("actor")+`, tenant, action, object_type, object_id,
		       `+visibleCreatedBy("before")+`, `+visibleCreatedBy("after")+`
		FROM webhook_audit
		WHERE ($1::text IS NULL OR tenant = $1)
		  AND ($2 = '' OR object_type = $2)
		  AND ($3 = '' OR object_id = $3)
		  AND ($4 = 0 OR id < $4)
		ORDER BY id DESC
		LIMIT $5`, f.Tenant, f.ObjectType, f.ObjectID, f.Before, limit)
	entries, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		var e Entry
		err := r.Scan(&e.ID, &e.At, &e.Actor, &e.Tenant, &e.Action, &e.ObjectType, &e.ObjectID, &e.Before, &e.After)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the audit trail: %w", err)
	}
	return entries, nil
}

// visibleActor is the SQL expression of actor (an SQL expression) as the caller whose tenant is
// $1 may read it: as it is for an admin ($1 NULL) and for the tenant's own keys and portal
// sessions, "operator" for any other.
func visibleActor(actor string) string {
	return fmt.Sprintf(`CASE WHEN $1::text IS NULL THEN %[1]s
		WHEN %[1]s ~ '^(key|portal):[0-9a-f-]{36}$' AND EXISTS (SELECT 1 FROM webhook_api_keys k
		     WHERE k.id = pg_catalog.split_part(%[1]s, ':', 2)::uuid AND k.tenant = $1) THEN %[1]s
		ELSE 'operator' END`, actor)
}

// visibleCreatedBy is the SQL expression of the JSON object column col with its created_by
// as visibleActor shows it.
func visibleCreatedBy(col string) string {
	return fmt.Sprintf(`CASE WHEN $1::text IS NULL OR %[1]s->>'created_by' IS NULL THEN %[1]s
		ELSE pg_catalog.jsonb_set(%[1]s, '{created_by}', pg_catalog.to_jsonb(%[2]s)) END`, col, visibleActor(col+"->>'created_by'"))
}

// VisibleActor returns actor as a caller of tenant may read it (nil: an admin, who reads it as
// it is): a tenant reads its own keys and portal sessions, and "operator" for any other actor.
func VisibleActor(ctx context.Context, q Querier, tenant *string, actor string) (string, error) {
	if tenant == nil {
		return actor, nil
	}
	var v string
	if err := q.QueryRow(ctx, `SELECT `+visibleActor("$2::text"), tenant, actor).Scan(&v); err != nil {
		return "", fmt.Errorf("reading who may be named: %w", err)
	}
	return v, nil
}

// CLIActor names the operating-system user running a CLI command, as the trail records it:
// "cli:<user>", or "cli" when the user cannot be told.
func CLIActor() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "cli:" + u.Username
	}
	return "cli"
}
