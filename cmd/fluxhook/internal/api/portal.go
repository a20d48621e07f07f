package api

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/audit"
)

// DefaultPortalSessionTTL is how long a portal link works unless the request says otherwise.
const DefaultPortalSessionTTL = time.Hour

// maxPortalSessionTTL bounds a link's life: a link is a credential in a browser's history.
const maxPortalSessionTTL = 24 * time.Hour

// portalSession is the answer to a session request: the link to show the tenant.
type portalSession struct {
	ID        string    `json:"id"`
	Tenant    *string   `json:"tenant"`
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (s *Server) createTenantPortalSession(q *request) error {
	tenant := q.r.PathValue("tenant")
	return s.createPortalSession(q, &tenant)
}

func (s *Server) createAdminPortalSession(q *request) error {
	return s.createPortalSession(q, nil)
}

// createPortalSession makes a link to the portal for tenant (nil: an operator's, every
// tenant), valid for the request's ttl_seconds or DefaultPortalSessionTTL.
func (s *Server) createPortalSession(q *request, tenant *string) error {
	var in struct {
		TTLSeconds  *int64 `json:"ttl_seconds"`
		Description string `json:"description"`
	}
	if q.r.ContentLength != 0 {
		if err := q.decode(&in); err != nil {
			return err
		}
	}
	ttl := s.cfg.PortalSessionTTL
	if ttl <= 0 {
		ttl = DefaultPortalSessionTTL
	}
	if in.TTLSeconds != nil {
		// Checked as seconds before the conversion, which would wrap a huge value into range.
		if secs := *in.TTLSeconds; secs < 60 || secs > int64(maxPortalSessionTTL/time.Second) {
			return errInvalid("ttl_seconds", "ttl_seconds: from 60 to %d, not %d", int(maxPortalSessionTTL.Seconds()), *in.TTLSeconds)
		}
		ttl = time.Duration(*in.TTLSeconds) * time.Second
	}
	n := apikeys.New{Tenant: tenant, Description: in.Description, CreatedBy: q.actor()}
	if err := n.Validate(); err != nil {
		field, _, _ := strings.Cut(err.Error(), ":")
		return errInvalid(field, "%v", err)
	}
	var out portalSession
	err := pgx.BeginFunc(q.ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		// The making key, locked against its revocation until this session commits: a
		// revocation either waits and then ends this session with the key's others, or comes
		// first, and then no session is made with a revoked key.
		var live bool
		if err := tx.QueryRow(q.ctx, `SELECT EXISTS (SELECT 1 FROM webhook_api_keys
			WHERE id = $1::uuid AND revoked_at IS NULL FOR SHARE)`, q.key.ID).Scan(&live); err != nil {
			return err
		}
		if !live {
			return errUnauthorized
		}
		k, token, err := apikeys.AddPortalSession(q.ctx, tx, n, ttl)
		if err != nil {
			return err
		}
		out = portalSession{ID: k.ID, Tenant: k.Tenant, URL: s.publicURL(q.r) + "/portal/#session=" + token, ExpiresAt: *k.ExpiresAt}
		return audit.Record(q.ctx, tx, audit.Change{Actor: q.actor(), Tenant: k.Tenant, Action: "portal_session.create",
			ObjectType: "portal_session", ObjectID: k.ID, After: map[string]any{"tenant": k.Tenant, "expires_at": k.ExpiresAt}})
	})
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusCreated, out)
	return nil
}

// publicURL is where the portal's users reach this server: PublicURL when set (behind a
// proxy, the address users see), otherwise the request's own host.
func (s *Server) publicURL(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return strings.TrimRight(s.cfg.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// listPortalSessions lists the portal links that still work or were revoked before they
// expired, newest first, so that an operator can find one to end (?tenant: one tenant's).
func (s *Server) listPortalSessions(q *request) error {
	limit, err := q.limit()
	if err != nil {
		return err
	}
	f := apikeys.SessionFilter{Tenant: q.tenantParam(), Limit: limit + 1}
	var c struct {
		Created time.Time `json:"c"`
		ID      string    `json:"i"`
	}
	if ok, err := q.cursor(&c); err != nil {
		return err
	} else if ok {
		f.AfterCreated, f.AfterID = c.Created, c.ID
	}
	list, err := apikeys.ListPortalSessions(q.ctx, s.cfg.Pool, f)
	if errors.Is(err, apikeys.ErrNotFound) {
		return errBadCursor
	}
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, pageOf(list, limit, asIs, func(last apikeys.Session) *string {
		c.Created, c.ID = last.CreatedAt, last.ID
		return encodeCursor(c)
	}))
	return nil
}

// revokePortalSession ends a portal link before it expires: the next request with it is 401.
func (s *Server) revokePortalSession(q *request) error {
	id := q.r.PathValue("id")
	var out apikeys.Key
	err := pgx.BeginFunc(q.ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		out, err = apikeys.RevokePortalSessionAudited(q.ctx, tx, id, q.actor())
		return err
	})
	if errors.Is(err, apikeys.ErrNotFound) {
		return errNotFound("portal session", id)
	}
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, apikeys.SessionOf(out))
	return nil
}
