package status

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind (a pool or a Redis client
// not closed).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
