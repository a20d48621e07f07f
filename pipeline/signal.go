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

// Clear drops a pending wake-up, if any, without blocking. A receiver that is about to do
// what every wake-up so far asked for (look for work now) calls it first, so that a wake-up
// that arrived before it looked does not make it look a second time for nothing.
func (s *Signal) Clear() {
	select {
	case <-s.c:
	default:
	}
}
