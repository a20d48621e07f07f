package sql_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every stage is a service
// that must stop completely.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
