package api

import (
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// whoAmI is the caller as the API sees it: what the portal shows and decides by (an operator's
// session gets the tenant selector and the status overview).
type whoAmI struct {
	KeyID     string     `json:"key_id"`
	Tenant    *string    `json:"tenant"`
	Admin     bool       `json:"admin"`
	Portal    bool       `json:"portal"`
	ExpiresAt *time.Time `json:"expires_at"`
}

func (s *Server) me(q *request) error {
	writeJSON(q.w, http.StatusOK, whoAmI{KeyID: q.key.ID, Tenant: q.key.Tenant, Admin: q.key.Admin(), Portal: q.key.Portal,
		ExpiresAt: q.key.ExpiresAt})
	return nil
}

// tenantsSQL lists the tenants that have endpoints, after a name (keyset), for the operator's
// tenant selector: tenants exist only as the text on endpoints, events and keys.
const tenantsSQL = `SELECT DISTINCT tenant FROM webhook_endpoints
WHERE tenant IS NOT NULL AND tenant <> '' AND tenant > $1 ORDER BY tenant LIMIT $2`

func (s *Server) listTenants(q *request) error {
	limit, err := q.limit()
	if err != nil {
		return err
	}
	var c struct {
		After string `json:"a"`
	}
	if _, err := q.cursor(&c); err != nil {
		return err
	}
	rows, _ := s.cfg.Pool.Query(q.ctx, tenantsSQL, c.After, limit+1)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, pageOf(names, limit, asIs, func(last string) *string {
		c.After = last
		return encodeCursor(c)
	}))
	return nil
}
