package dispatcher

import "testing"

// TestCacheRoutesUnlessSure: events are routed whenever the cache holds an endpoint or cannot
// be sure it holds every one (a load that failed or is behind the version a claim saw);
// only an empty cache confirmed at the current version lets them go to WEBHOOK_URL unrouted.
func TestCacheRoutesUnlessSure(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name               string
		version, loaded    int64
		confirmed, holding bool
		want               bool
	}{
		{"empty, confirmed at the current version", 4, 4, true, false, false},
		{"empty, never loaded at version 0", 0, 0, true, false, false},
		{"empty, its load for a new version failed", 5, 4, true, false, true},
		{"empty, loaded but not confirmed", 5, 5, false, false, true},
		{"holding an endpoint", 4, 4, true, true, true},
	} {
		var cache endpointCache
		cache.version.Store(c.version)
		cache.loaded, cache.confirmed = c.loaded, c.confirmed
		if c.holding {
			cache.byID = map[string]*managed{"e": {}}
		}
		if got := cache.any(); got != c.want {
			t.Errorf("%s: any() = %v, want %v", c.name, got, c.want)
		}
	}
}
