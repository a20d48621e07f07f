// Package portal is the web page a tenant's people use to manage their endpoints and see their
// deliveries, built on the management API and served by the same process under /portal/.
//
// The page is static (embedded in the binary, no build step, no CDN) and talks to the API with
// the portal session's token, which arrives in the link's fragment (#session=fhp_...): a
// fragment is never sent to a server nor put in a Referer, so the token stays out of access
// logs and other sites. The page keeps it in sessionStorage and sends it as a bearer token;
// no cookie is ever set, so another site cannot make the browser act for the tenant (no CSRF
// surface). Framing is allowed only to the origins PORTAL_FRAME_ANCESTORS names, and the
// Content-Security-Policy allows scripts and styles from the page's own origin only, none
// inline.
package portal

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// Options configure the portal's headers.
type Options struct {
	// FrameAncestors are the origins allowed to show the portal in a frame (CSP
	// frame-ancestors), e.g. https://app.example.com; empty allows none.
	FrameAncestors []string
}

// Handler serves the portal's files under /portal/.
func Handler(o Options) http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err)
	}
	files := http.StripPrefix("/portal/", http.FileServer(http.FS(sub)))
	ancestors := "'none'"
	if len(o.FrameAncestors) > 0 {
		ancestors = strings.Join(o.FrameAncestors, " ")
	}
	csp := "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
		"font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors " + ancestors
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if len(o.FrameAncestors) == 0 {
			h.Set("X-Frame-Options", "DENY") // for browsers without frame-ancestors
		}
		files.ServeHTTP(w, r)
	})
}
