package pipeline

// Batch reads items from in and calls flush with up to max of them at a time, and returns
// after the final flush once in is closed.
//
// It batches "naturally": it blocks for the first item, then takes whatever else is already
// queued (up to max) and flushes at once. While flush runs (one database transaction), new
// items queue up, so under load batches grow by themselves towards max, and at low load an
// item never waits for a linger timer. That is why there is no time-based flush: a timer would
// only add latency when traffic is light and change nothing when it is heavy.
func Batch[T any](in <-chan T, max int, flush func([]T)) {
	if max < 1 {
		max = 1
	}
	buf := make([]T, 0, max)
	for {
		item, ok := <-in
		if !ok {
			return
		}
		buf = append(buf, item)
		open := true
	collect:
		for len(buf) < max {
			select {
			case item, ok := <-in:
				if !ok {
					open = false
					break collect
				}
				buf = append(buf, item)
			default:
				break collect
			}
		}
		flush(buf)
		clear(buf)
		buf = buf[:0]
		if !open {
			return
		}
	}
}

// Workers runs n goroutines that call fn for every item from in until in is closed, then
// closes the returned channel. A fixed pool, not a goroutine per item.
func Workers[T any](n int, in <-chan T, fn func(T)) <-chan struct{} {
	if n < 1 {
		n = 1
	}
	done := make(chan struct{})
	remaining := make(chan struct{}, n)
	for range n {
		go func() {
			defer func() {
				remaining <- struct{}{}
			}()
			for item := range in {
				fn(item)
			}
		}()
	}
	go func() {
		for range n {
			<-remaining
		}
		close(done)
	}()
	return done
}
