package endpoints

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Scope is whose endpoints a caller may see and change: nil is every tenant's (an admin key,
// the CLI), otherwise only that tenant's. A tenant key never sees an endpoint without a
// tenant: those receive the events without one, which no tenant owns.
type Scope = *string

// TestEventType is the event type of the test event the management API sends to one endpoint
// on request. Addressed to that endpoint alone, it is delivered whatever the endpoint's filter.
const TestEventType = "webhook.test"

//go:embed queries/page.sql
var pageSQL string

// PageQuery selects one page of endpoints.
type PageQuery struct {
	// Scope limits the page to the caller's tenant (nil: every tenant).
	Scope Scope
	// Tenant, when set, filters by tenant (an admin's choice, within Scope).
	Tenant *string
	// Enabled, when set, keeps enabled or disabled endpoints only.
	Enabled *bool
	// AfterCreated and AfterID are the last endpoint of the previous page (zero: the first).
	AfterCreated time.Time
	AfterID      string
	// Limit is the page size (1 to 500; 0 means 50).
	Limit int
}

// Page returns one page of endpoints, oldest first, for display: secrets that do not open
// are left empty, as List does. The order is stable while endpoints are added, so a cursor
// never skips or repeats one.
func Page(ctx context.Context, q Querier, c *Cipher, pq PageQuery) ([]Endpoint, error) {
	limit := pq.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, 500)
	var after, afterID any
	if !pq.AfterCreated.IsZero() {
		id, err := parseID(pq.AfterID)
		if err != nil {
			return nil, fmt.Errorf("cursor: %w", err)
		}
		after, afterID = pq.AfterCreated, id
	}
	rows, err := q.Query(ctx, pageSQL, pq.Scope, pq.Tenant, pq.Enabled, after, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("reading webhook_endpoints: %w", err)
	}
	list, _, err := collect(rows, c)
	if err != nil {
		return nil, err
	}
	if list == nil {
		list = []Endpoint{}
	}
	return list, nil
}

// LockInScope locks the endpoint id for the rest of tx if scope may see it, and returns an
// error matching ErrNotFound otherwise, exactly as for an endpoint that does not exist: a
// tenant learns nothing of another's ids. Every change the management API makes for a tenant
// key runs after it in the same transaction, so the endpoint cannot move to another tenant
// between the check and the change.
func LockInScope(ctx context.Context, tx pgx.Tx, id string, scope Scope) error {
	key, err := parseID(id)
	if err != nil {
		return err
	}
	var one int
	err = tx.QueryRow(ctx, `SELECT 1 FROM webhook_endpoints WHERE id = $1::uuid AND ($2::text IS NULL OR tenant = $2) FOR UPDATE`,
		key, scope).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return &notFoundError{id: key}
	}
	if err != nil {
		return fmt.Errorf("reading endpoint %s: %w", key, err)
	}
	return nil
}

// InScope says whether scope may see the endpoint e.
func InScope(e Endpoint, scope Scope) bool {
	return scope == nil || (e.Tenant == *scope && !e.EmptyTenant && *scope != "")
}
