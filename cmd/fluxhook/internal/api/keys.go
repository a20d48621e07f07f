package api

import (
	"errors"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/apikeys"
	"github.com/fluxora/fluxhook/sql/audit"
)

// keyWithSecret is a new key as the API answers it: the only time the key is shown.
type keyWithSecret struct {
	apikeys.Key
	Secret string `json:"key"`
}

func (s *Server) listKeys(q *request) error {
	keys, err := apikeys.List(q.ctx, s.cfg.Pool)
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, page[apikeys.Key]{Data: keys})
	return nil
}

func (s *Server) createKey(q *request) error {
	var in struct {
		Tenant      nullable[string] `json:"tenant"`
		Description string           `json:"description"`
	}
	if err := q.decode(&in); err != nil {
		return err
	}
	// An admin key is asked for by name (null), never made of an absent tenant: a client that
	// drops an unset field (omitempty, JavaScript's undefined) would hand its customer a key to
	// every tenant. The CLI asks for --tenant or --admin likewise.
	if !in.Tenant.Set {
		return errInvalid("tenant", "tenant: required: the tenant the key sees, or null for an admin key (every tenant, and the keys)")
	}
	n := apikeys.New{Tenant: in.Tenant.Value, Description: in.Description, CreatedBy: q.actor()}
	if err := n.Validate(); err != nil {
		field, _, _ := strings.Cut(err.Error(), ":")
		return errInvalid(field, "%v", err)
	}
	var out keyWithSecret
	err := pgx.BeginFunc(q.ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		k, token, err := apikeys.Add(q.ctx, tx, n)
		if err != nil {
			return err
		}
		out = keyWithSecret{Key: k, Secret: token}
		return audit.Record(q.ctx, tx, audit.Change{Actor: q.actor(), Tenant: k.Tenant, Action: "api_key.create",
			ObjectType: "api_key", ObjectID: k.ID, After: k})
	})
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusCreated, out)
	return nil
}

// revokeKey ends a key and the portal sessions it made (apikeys.RevokeAudited).
func (s *Server) revokeKey(q *request) error {
	id := q.r.PathValue("id")
	var out apikeys.Key
	err := pgx.BeginFunc(q.ctx, s.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		out, _, err = apikeys.RevokeAudited(q.ctx, tx, id, q.actor())
		return err
	})
	if errors.Is(err, apikeys.ErrNotFound) {
		return errNotFound("API key", id)
	}
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, out)
	return nil
}

func (s *Server) listAudit(q *request) error {
	limit, err := q.limit()
	if err != nil {
		return err
	}
	f := audit.Filter{Tenant: q.scope(), ObjectType: q.r.URL.Query().Get("object_type"),
		ObjectID: q.r.URL.Query().Get("object_id"), Limit: limit + 1}
	if t := q.tenantParam(); t != nil && q.scope() == nil {
		f.Tenant = t
	}
	var c struct {
		Before int64 `json:"b"`
	}
	if _, err := q.cursor(&c); err != nil {
		return err
	}
	f.Before = c.Before
	entries, err := audit.List(q.ctx, s.cfg.Pool, f)
	if err != nil {
		return err
	}
	writeJSON(q.w, http.StatusOK, pageOf(entries, limit, asIs, func(last audit.Entry) *string {
		c.Before = last.ID
		return encodeCursor(c)
	}))
	return nil
}
