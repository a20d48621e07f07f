package dispatcher

import (
	"errors"
	"strings"
	"testing"
)

// TestPoolerHint: PgBouncer's refusal of fluxhook's startup parameter is explained as a
// pooler in the way; other connection errors are left as they are.
func TestPoolerHint(t *testing.T) {
	refused := errors.New(`connecting to the database: failed to connect: server error (FATAL: unsupported startup parameter: fluxhook.dispatcher (SQLSTATE 08P01))`)
	if got := poolerHint(refused).Error(); !strings.Contains(got, "pool_mode = transaction") || !strings.Contains(got, "unsupported startup parameter") {
		t.Errorf("poolerHint(refusal) = %q, want the original error and the pooler explanation", got)
	}
	other := errors.New("connecting to the database: connection refused")
	if got := poolerHint(other); got != other {
		t.Errorf("poolerHint(%v) = %v, want it unchanged", other, got)
	}
	if poolerHint(nil) != nil {
		t.Error("poolerHint(nil) is not nil")
	}
}
