package main

import (
	"maps"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/stages/dispatcher"
)

// TestResponseExcerptBytes: WEBHOOK_RESPONSE_EXCERPT_BYTES reaches the dispatcher as set, 0
// included (none kept, not the default), and a value out of range is refused naming the
// variable, by the parse (not a number, negative) or by the send stage's validation (over
// the maximum), which serve reports together.
func TestResponseExcerptBytes(t *testing.T) {
	t.Parallel()
	base := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:5432/db", "WEBHOOK_URL": "https://example.com/h", "WEBHOOK_SECRET": "s"}
	for _, s := range settings {
		if _, ok := base[s.env]; !ok && s.def != "" {
			base[s.env] = s.def
		}
	}
	for raw, want := range map[string]int{"": 1024, "0": 0, "1": 1, "65536": 65536} {
		v := maps.Clone(base)
		if raw != "" {
			v["WEBHOOK_RESPONSE_EXCERPT_BYTES"] = raw
		}
		c, err := parseServeConfig(v)
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		if p := c.dispatcher.ResponseExcerptBytes; p == nil || *p != want {
			t.Errorf("%q: ResponseExcerptBytes %v, want %d", raw, p, want)
		}
		if err := c.dispatcher.WithDefaults().Validate(); err != nil {
			t.Errorf("%q: %v", raw, err)
		}
	}
	for _, raw := range []string{"-1", "1k", " ", "65537", "99999999999999999999"} {
		v := maps.Clone(base)
		v["WEBHOOK_RESPONSE_EXCERPT_BYTES"] = raw
		c, err := parseServeConfig(v)
		if err == nil {
			_, err = dispatcher.New(c.dispatcher) // the send stage checks the range
		}
		if err == nil || !strings.Contains(err.Error(), "WEBHOOK_RESPONSE_EXCERPT_BYTES") {
			t.Errorf("%q: %v, want an error naming WEBHOOK_RESPONSE_EXCERPT_BYTES", raw, err)
		}
	}
}
