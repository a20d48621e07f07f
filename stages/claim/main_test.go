package claim_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every stage is a service
// that must stop completely.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deadline returns the context a test's statements run under: a claim that blocks (a lock it
// should have skipped) fails the test within seconds instead of hanging to the package
// timeout.
func deadline(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
