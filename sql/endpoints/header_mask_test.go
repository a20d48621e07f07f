package endpoints_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/sql/endpoints"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestHeaderMaskKeepsCurrentValues: with Patch.HeaderMask, a header given the mask keeps its
// current value (sealed values included, under the name in another case too, re-sealed for
// it), the others are replaced as usual, and the mask for a header the endpoint lacks is
// refused. Without HeaderMask (the CLI), the mask is a value like any other.
func TestHeaderMaskKeepsCurrentValues(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	ctx := context.Background()
	c := newCipher(t, endpoints.GenerateKey(), "")
	const mask = "********"
	e := mustAdd(t, db, c, endpoints.New{URL: "https://hooks.example.com/a",
		Headers: map[string]string{"Authorization": "Bearer tok", "X-A": "a"}})
	update := func(h map[string]string, withMask bool) error {
		t.Helper()
		p := endpoints.Patch{Headers: &h}
		if withMask {
			p.HeaderMask = mask
		}
		_, err := endpoints.Update(ctx, db.Pool, c, e.ID, p)
		return err
	}
	if err := update(map[string]string{"Authorization": mask, "X-B": "b"}, true); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, db, c, e.ID).Headers; len(got) != 2 || got["Authorization"] != "Bearer tok" || got["X-B"] != "b" {
		t.Errorf("headers = %v; want Authorization kept, X-B added, X-A removed", got)
	}
	if err := update(map[string]string{"AUTHORIZATION": mask}, true); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, db, c, e.ID).Headers; len(got) != 1 || got["AUTHORIZATION"] != "Bearer tok" {
		t.Errorf("headers = %v; want the value kept under the new spelling of the name", got)
	}
	err := update(map[string]string{"X-Token": mask}, true)
	var inv *endpoints.InvalidError
	if !errors.As(err, &inv) || inv.Field != "headers" || !strings.Contains(err.Error(), "X-Token") {
		t.Errorf("the mask for a header the endpoint lacks: %v; want an invalid headers error naming it", err)
	}
	if err := update(map[string]string{"X-Token": mask}, false); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, db, c, e.ID).Headers; got["X-Token"] != mask {
		t.Errorf("without HeaderMask, headers = %v; want the value stored as given", got)
	}
}
