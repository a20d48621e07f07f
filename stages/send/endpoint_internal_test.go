package send

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// The cache holds one entry per distinct endpoint_url, which rows control; it must not grow
// without bound.
func TestEndpointCacheIsBounded(t *testing.T) {
	t.Parallel()
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for i := range maxCachedEndpoints + 50 {
		raw := "https://example.com/hook/" + strconv.Itoa(i)
		ep, err := s.Endpoint(raw)
		if err != nil {
			t.Fatal(err)
		}
		if ep.URL != raw {
			t.Fatalf("Endpoint(%q).URL = %q", raw, ep.URL)
		}
		if n := len(s.endpoints); n > maxCachedEndpoints {
			t.Fatalf("endpoint cache holds %d entries, want at most %d", n, maxCachedEndpoints)
		}
	}
	again, err := s.Endpoint("https://example.com/hook/" + strconv.Itoa(maxCachedEndpoints+49))
	if err != nil || again != s.endpoints["https://example.com/hook/"+strconv.Itoa(maxCachedEndpoints+49)] {
		t.Errorf("an endpoint cached after the reset is not shared: %v", err)
	}
}

// A host url.Parse accepts but no connection could be made to is refused when the URL is
// validated, not retried for the schedule's days; names, IP literals and internationalized
// names pass.
func TestHostNames(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"https://a.example,b.example/hook", "https://a%20b.example/", "https://exa$mple.com/",
		"https://a\u00a0b.example/", "https://a\u3000b.example/", "https://example.com\uff0fx/", "https://a%ffb.example/"} {
		if err := ValidateURL(raw); !errors.Is(err, ErrInvalidURL) || !strings.Contains(err.Error(), "host") {
			t.Errorf("ValidateURL(%q) = %v, want an invalid URL error about its host", raw, err)
		}
	}
	for _, raw := range []string{"https://hooks.example.com/a", "https://my_service:8443/", "https://[2001:db8::1]/", "https://[fe80::1%25eth0]:8443/",
		"https://example.com./", "https://xn--bcher-kva.example/", "https://bücher.example/x?y=1", "https://例え。jp/", "http://localhost:8080/"} {
		if err := ValidateURL(raw); err != nil {
			t.Errorf("ValidateURL(%q) = %v, want it accepted", raw, err)
		}
	}
}
