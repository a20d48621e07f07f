package send

import (
	"strconv"
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
