package redisstore_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind (an unclosed client).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
