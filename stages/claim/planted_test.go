package claim_test

import (
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/claim"
)

// TestClaimIgnoresPlantedBuiltins: a pg_sequence_last_value(text) or setval(text, bigint) in a
// schema on the dispatcher's path (one whose CREATE is not revoked: public before PostgreSQL
// 15) outranks the built-in, which takes a regclass, for a quoted sequence name, and would run
// as the dispatcher on every claim. The claims, ordered and not, and the announcement call the
// built-ins by their qualified names.
func TestClaimIgnoresPlantedBuiltins(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := deadline(t)
	for _, q := range []string{
		`CREATE FUNCTION public.pg_sequence_last_value(text) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'planted pg_sequence_last_value ran'; END $$`,
		`CREATE FUNCTION public.setval(text, bigint) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'planted setval ran'; END $$`,
		`INSERT INTO webhook_outbox (event_type, payload, stream_id) VALUES ('x', '{}', 's'), ('x', '{}', NULL)`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	c := claim.New(db.Pool, "planted", time.Minute)
	if err := c.Register(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Announce(ctx, time.Second); err != nil {
		t.Errorf("announce: %v", err)
	}
	if _, err := c.Claim(ctx, 1, claim.Skip{}, true, claim.Cursor{}); err != nil {
		t.Errorf("unordered claim: %v", err)
	}
	c.SetOrdering(claim.Ordering{Active: true, Default: true, Horizon: 1 << 40})
	if _, err := c.Claim(ctx, 1, claim.Skip{}, true, claim.Cursor{}); err != nil {
		t.Errorf("ordered claim: %v", err)
	}
}
