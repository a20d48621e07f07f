package portal

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// assetNames lists the embedded files, as paths under /portal/.
func assetNames(t *testing.T) []string {
	t.Helper()
	var names []string
	err := fs.WalkDir(assets, "assets", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, strings.TrimPrefix(path, "assets/"))
		}
		return err
	})
	if err != nil || len(names) == 0 {
		t.Fatalf("no embedded assets (%v)", err)
	}
	return names
}

// TestHandlerServesEveryAssetWithItsPolicy: each file of the page, and the page itself, comes
// with the policy that forbids inline script and style and other origins, and with framing
// refused unless origins are allowed, in which case only they may frame it.
func TestHandlerServesEveryAssetWithItsPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		opts      Options
		ancestors string
		xfo       string
	}{
		{"no frame ancestors", Options{}, "frame-ancestors 'none'", "DENY"},
		{"frame ancestors", Options{FrameAncestors: []string{"https://app.example.com", "'self'"}}, "frame-ancestors https://app.example.com 'self'", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(Handler(tc.opts))
			defer srv.Close()
			for _, name := range append(assetNames(t), "") {
				resp, err := http.Get(srv.URL + "/portal/" + name)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || len(body) == 0 {
					t.Errorf("/portal/%s: %d, %d bytes", name, resp.StatusCode, len(body))
				}
				h := resp.Header
				csp := h.Get("Content-Security-Policy")
				for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'",
					"base-uri 'none'", "form-action 'none'", tc.ancestors} {
					if !strings.Contains(csp, want) {
						t.Errorf("/portal/%s: CSP %q lacks %q", name, csp, want)
					}
				}
				if strings.Contains(csp, "unsafe") {
					t.Errorf("/portal/%s: CSP %q allows something unsafe", name, csp)
				}
				if got := h.Get("X-Frame-Options"); got != tc.xfo {
					t.Errorf("/portal/%s: X-Frame-Options %q, want %q", name, got, tc.xfo)
				}
				if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "no-referrer" {
					t.Errorf("/portal/%s: headers %v", name, h)
				}
			}
		})
	}
}

// TestAssetsNeedNothingThePolicyForbids: the page has no inline script, style or event
// handler, which the browser would refuse; the script builds the page from text and never
// evaluates code; nothing is loaded from another origin.
func TestAssetsNeedNothingThePolicyForbids(t *testing.T) {
	t.Parallel()
	read := func(name string) string {
		b, err := fs.ReadFile(assets, "assets/"+name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, name := range assetNames(t) {
		text := read(name)
		checks := map[string]*regexp.Regexp{}
		switch {
		case strings.HasSuffix(name, ".html"):
			checks["an address of another origin"] = regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`)
			checks["a style element"] = regexp.MustCompile(`(?i)<style`)
			checks["a style attribute"] = regexp.MustCompile(`(?i)\sstyle\s*=`)
			checks["an event handler attribute"] = regexp.MustCompile(`(?i)\son[a-z]+\s*=`)
			checks["a javascript: URL"] = regexp.MustCompile(`(?i)javascript:`)
			for _, m := range regexp.MustCompile(`(?is)<script([^>]*)>(.*?)</script>`).FindAllStringSubmatch(text, -1) {
				if !strings.Contains(m[1], "src=") || strings.TrimSpace(m[2]) != "" {
					t.Errorf("%s has an inline script: %q", name, m[0])
				}
			}
		case strings.HasSuffix(name, ".css"):
			checks["an address of another origin"] = regexp.MustCompile(`(?i)url\(\s*["']?(https?:)?//|@import`)
		case strings.HasSuffix(name, ".js"):
			checks["an address of another origin"] = regexp.MustCompile(`(?i)(fetch|URL)\(\s*["'\x60](https?:)?//`)
			checks["HTML built from strings"] = regexp.MustCompile(`\.(innerHTML|outerHTML)\b|insertAdjacentHTML|document\.write`)
			checks["code built from strings"] = regexp.MustCompile(`\beval\(|new Function\(|setTimeout\(\s*["'\x60]|setInterval\(\s*["'\x60]`)
			checks["a style attribute"] = regexp.MustCompile(`setAttribute\(\s*["']style["']`)
		}
		for what, re := range checks {
			for _, m := range re.FindAllString(text, -1) {
				t.Errorf("%s has %s: %q", name, what, m)
			}
		}
	}
}
