package pipeline

import "sync"

// Slots is the pipeline's capacity: the number of items that may be between being taken
// (claimed) and being finished (settled). Claiming only as many items as there are free slots
// is what gives the pipeline backpressure without unbounded queues: when the consumer or the
// database slows down, claiming slows down with it.
type Slots struct {
	mu    sync.Mutex
	size  int
	inUse int
	freed *Signal
}

// NewSlots returns capacity for size items, all free.
func NewSlots(size int) *Slots {
	if size < 1 {
		size = 1
	}
	return &Slots{size: size, freed: NewSignal()}
}

// Size is the total capacity.
func (s *Slots) Size() int { return s.size }

// Free is the number of items that can be taken now.
func (s *Slots) Free() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.size - s.inUse
}

// InUse is the number of items taken and not yet released.
func (s *Slots) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse
}

// Take marks n items as in flight. Callers take at most Free(); taking more is allowed (the
// capacity is a target, not a hard limit) but means the caller did not wait.
func (s *Slots) Take(n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.inUse += n
	s.mu.Unlock()
}

// Release marks n items as finished and wakes whoever waits for capacity.
func (s *Slots) Release(n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.inUse -= n
	if s.inUse < 0 {
		panic("pipeline: Slots released more than taken")
	}
	s.mu.Unlock()
	s.freed.Notify()
}

// Freed is signalled after every Release; the claiming loop selects on it while full.
func (s *Slots) Freed() <-chan struct{} { return s.freed.C() }
