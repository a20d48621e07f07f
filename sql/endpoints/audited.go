package endpoints

import (
	"context"
	"maps"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fluxora/fluxhook/sql/audit"
)

// TxBeginner is what the audited changes open their transaction on: a pool or a connection.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// maskedHeader stands for every header value in the audit trail: a value the CLI's and the
// API's masks do not recognise as a credential may still be one.
const maskedHeader = "********"

// AuditView is the endpoint as the audit trail keeps it: no secret (Endpoint never marshals
// them), no header value, and its URL without the query string, where consumers put tokens:
// the trail is read by every admin key and by the endpoint's tenant, and kept for good.
func AuditView(e Endpoint) Endpoint {
	e.Secret, e.PreviousSecret = "", ""
	e.URL = auditURL(e.URL)
	e.Headers = maps.Clone(e.Headers)
	for k := range e.Headers {
		e.Headers[k] = maskedHeader
	}
	return e
}

// auditURL is raw's scheme, user-free host and port, and path: what tells two URLs apart for a
// reader of the trail, without the query or fragment a token may travel in.
func auditURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		// Not a URL (stored by hand): keep what comes before a query or a fragment, and nothing
		// up to the last '@' (a password holding a '/', '?' or '#' is why such a URL does not
		// parse; cut at its '?' first, part of it was kept).
		if scheme, rest, ok := strings.Cut(raw, "://"); ok {
			if i := strings.LastIndex(rest, "@"); i >= 0 {
				raw = scheme + "://" + rest[i+1:]
			}
		}
		before, _, _ := strings.Cut(raw, "?")
		before, _, _ = strings.Cut(before, "#")
		return before
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

// tenantPtr is e's tenant as the audit trail scopes it: nil for an endpoint without one.
func tenantPtr(e Endpoint) *string {
	if e.Tenant == "" && !e.EmptyTenant {
		return nil
	}
	t := e.Tenant
	return &t
}

// readForAudit reads the endpoint whatever its secrets: one that does not open with c (a key
// not given) is still recorded by its other fields.
func readForAudit(ctx context.Context, q Querier, c *Cipher, id string) (Endpoint, error) {
	e, err := Get(ctx, q, c, id)
	if err != nil && e.ID == "" {
		return e, err
	}
	return e, nil
}

// AddAudited adds n, as Add does, and records the creation by actor in the audit trail in the
// same transaction.
func AddAudited(ctx context.Context, db TxBeginner, c *Cipher, n New, actor string) (Endpoint, error) {
	var added Endpoint
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		if added, err = Add(ctx, tx, c, n); err != nil {
			return err
		}
		return audit.Record(ctx, tx, audit.Change{Actor: actor, Tenant: tenantPtr(added), Action: "endpoint.create",
			ObjectType: "endpoint", ObjectID: added.ID, After: AuditView(added)})
	})
	return added, err
}

// Audited runs change on the endpoint id in one transaction, after locking the endpoint in
// scope (not found otherwise, as for a missing one), and records the change by actor in the
// audit trail, with the endpoint before and after, in the same transaction: the trail holds
// every change that committed and none that did not. It returns the endpoint after.
//
// A change of tenant is recorded twice, once for each tenant's trail and each with that
// tenant's side alone: under the old tenant the endpoint before (and no after), under the new
// one the endpoint after (and no before). Neither tenant reads the other's view of it (its
// old description, headers, filter), nor who it went to or came from.
func Audited(ctx context.Context, db TxBeginner, c *Cipher, id string, scope Scope, actor, action string,
	change func(tx pgx.Tx) error) (Endpoint, error) {
	var after Endpoint
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := LockInScope(ctx, tx, id, scope); err != nil {
			return err
		}
		before, err := readForAudit(ctx, tx, c, id)
		if err != nil {
			return err
		}
		if err := change(tx); err != nil {
			return err
		}
		if after, err = readForAudit(ctx, tx, c, id); err != nil {
			return err
		}
		return audit.RecordAll(ctx, tx, changeEntries(actor, action, before, after))
	})
	return after, err
}

// changeEntries are the audit entries of a change of the endpoint from before to after: one,
// or one per tenant when the change moved it to another tenant (see Audited).
func changeEntries(actor, action string, before, after Endpoint) []audit.Change {
	from, to := tenantPtr(before), tenantPtr(after)
	if (from == nil) == (to == nil) && (from == nil || *from == *to) {
		return []audit.Change{{Actor: actor, Tenant: to, Action: action, ObjectType: "endpoint", ObjectID: before.ID,
			Before: AuditView(before), After: AuditView(after)}}
	}
	return []audit.Change{
		{Actor: actor, Tenant: from, Action: action, ObjectType: "endpoint", ObjectID: before.ID, Before: AuditView(before)},
		{Actor: actor, Tenant: to, Action: action, ObjectType: "endpoint", ObjectID: before.ID, After: AuditView(after)},
	}
}

// RemoveAudited removes the endpoint id in scope, as Remove does, and records the removal by
// actor in the audit trail in the same transaction.
func RemoveAudited(ctx context.Context, db TxBeginner, c *Cipher, id string, scope Scope, actor string, action PendingAction) (Removed, error) {
	var removed Removed
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := LockInScope(ctx, tx, id, scope); err != nil {
			return err
		}
		before, err := readForAudit(ctx, tx, c, id)
		if err != nil {
			return err
		}
		if removed, err = Remove(ctx, tx, id, action); err != nil {
			return err
		}
		return audit.Record(ctx, tx, audit.Change{Actor: actor, Tenant: tenantPtr(before), Action: "endpoint.delete",
			ObjectType: "endpoint", ObjectID: before.ID, Before: AuditView(before)})
	})
	return removed, err
}
