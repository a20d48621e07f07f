package api_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/api"
)

// TestRoutesMatchTheDocument: routes.go's table and openapi.json name the same operations, so
// that a route cannot be served without a contract nor described without being served.
func TestRoutesMatchTheDocument(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	var documented, served []string
	for path, item := range doc.Paths.Map() {
		if path == "/v1/openapi.json" { // served by New itself, outside the table
			continue
		}
		for method := range item.Operations() {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	for _, rt := range api.New(api.Config{}).Routes() {
		served = append(served, rt.Method+" "+rt.Pattern)
	}
	slices.Sort(documented)
	slices.Sort(served)
	if !slices.Equal(documented, served) {
		t.Errorf("openapi.json documents\n %s\nroutes.go serves\n %s", strings.Join(documented, "\n "), strings.Join(served, "\n "))
	}
}
