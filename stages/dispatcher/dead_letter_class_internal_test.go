package dispatcher

import (
	"errors"
	"testing"
)

// TestDeadLetterClass: each reason lands in its class of dead_letters_total; an operator's
// disable reason that happens to hold the misconfiguration marker stays endpoint_disabled.
func TestDeadLetterClass(t *testing.T) {
	t.Parallel()
	id := "3f2a1b4c-0000-4000-8000-000000000001"
	for reason, want := range map[string]string{
		misconfigured(id, errors.New("url: http:// is allowed only for loopback hosts")): "endpoint_invalid",
		misconfigured(id, errors.New("endpoint "+id+": secret: does not open")):          "endpoint_invalid",
		"endpoint disabled: consumer is misconfigured: TLS certificate expired":          "endpoint_disabled",
		"endpoint " + id + " was removed":                                                "endpoint_disabled",
		"invalid row: event_type is empty or only whitespace":                            "invalid",
		"attempts exhausted: 12 of 12":                                                   "exhausted",
		"endpoint " + id + " is misconfigured":                                           "permanent",
		"status 410":                                                                     "permanent",
	} {
		if got := deadLetterClass(reason); got != want {
			t.Errorf("deadLetterClass(%q) = %s, want %s", reason, got, want)
		}
	}
}
