package apikeys

import (
	"context"

	"github.com/fluxora/fluxhook/sql/audit"
)

// RevokeAudited revokes the key id and every live portal session it made, in q (the caller's
// transaction), and records each revocation by actor in the audit trail. A portal link is a
// bearer credential in a browser's history: revoking the key that handed it out, because the
// key leaked or its holder left, must end the link too. It returns the key after and the
// sessions it ended; ErrNotFound for an id that is not a key's.
func RevokeAudited(ctx context.Context, q Querier, id, actor string) (Key, []Key, error) {
	before, err := Get(ctx, q, id)
	if err != nil {
		return Key{}, nil, err
	}
	after, err := Revoke(ctx, q, id)
	if err != nil {
		return Key{}, nil, err
	}
	ended, err := revokeSessionsMadeBy(ctx, q, after)
	if err != nil {
		return Key{}, nil, err
	}
	changes := []audit.Change{{Actor: actor, Tenant: after.Tenant, Action: "api_key.revoke", ObjectType: "api_key",
		ObjectID: after.ID, Before: before, After: after}}
	for _, s := range ended {
		changes = append(changes, sessionRevocation(actor, s))
	}
	return after, ended, audit.RecordAll(ctx, q, changes)
}

// RevokePortalSessionAudited revokes the portal session id in q (the caller's transaction) and
// records the revocation by actor in the audit trail, as RevokeAudited records a key's;
// ErrNotFound for an id that is not a session's.
func RevokePortalSessionAudited(ctx context.Context, q Querier, id, actor string) (Key, error) {
	before, err := get(ctx, q, id, "portal")
	if err != nil {
		return Key{}, err
	}
	after, err := RevokePortalSession(ctx, q, id)
	if err != nil {
		return Key{}, err
	}
	return after, audit.Record(ctx, q, audit.Change{Actor: actor, Tenant: after.Tenant, Action: "portal_session.revoke",
		ObjectType: "portal_session", ObjectID: after.ID, Before: SessionOf(before), After: SessionOf(after)})
}

// sessionRevocation is the audit entry of the portal session s's revocation by actor: the
// session as lists show it, before (unrevoked) and after.
func sessionRevocation(actor string, s Key) audit.Change {
	before := s
	before.RevokedAt = nil
	return audit.Change{Actor: actor, Tenant: s.Tenant, Action: "portal_session.revoke", ObjectType: "portal_session",
		ObjectID: s.ID, Before: SessionOf(before), After: SessionOf(s)}
}
