package pipeline

// Signal is a coalescing wake-up: any number of Notify calls before the receiver looks collapse
// into one pending wake-up. A burst of NOTIFYs therefore causes one claim, not one per event.
type Signal struct {
	c chan struct{}
}

// NewSignal returns a Signal with no pending wake-up.
func NewSignal() *Signal { return &Signal{c: make(chan struct{}, 1)} }

// Notify records a wake-up without ever blocking.
func (s *Signal) Notify() {
	select {
	case s.c <- struct{}{}:
	default:
	}
}

// C is the channel to select on; a receive consumes the pending wake-up.
func (s *Signal) C() <-chan struct{} { return s.c }
