package deadletters_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind (a pool not closed, a
// recovery still running).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
