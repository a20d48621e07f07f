package bench

import (
	"os"
	"testing"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/fluxhooktest"
)

// The smoke tests run the fluxhook binary, as a user runs the bench: the bench starts its
// consumer and dispatchers from its own executable, which a test binary is not.
func TestMain(m *testing.M) { os.Exit(fluxhooktest.Main(m)) }
