package pipeline

import "time"

// Batch reads items from in and calls flush with up to max of them at a time, and returns
// after the final flush once in is closed.
//
// It batches "naturally": it blocks for the first item, then takes whatever else is already
// queued (up to max) and flushes at once. While flush runs (one database transaction), new
// items queue up, so under load batches grow by themselves towards max, and at low load an
// item never waits for a linger timer.
func Batch[T any](in <-chan T, max int, flush func([]T)) {
	BatchUntil(in, max, 0, nil, flush)
}

// BatchUntil is Batch that may wait up to linger after the first item for a fuller batch,
// unless complete(n) reports that the n items collected are all that is coming for now (for
// settle: every claimed row is back). Natural batches follow the rate at which items arrive,
// not the rate at which they were produced: a dispatcher that claims 70 rows at once gets
// them back over several milliseconds and would settle them in three statements; a few
// milliseconds of linger makes that one, at no cost to an idle dispatcher, whose lone row is
// complete at once. linger 0 never waits.
func BatchUntil[T any](in <-chan T, max int, linger time.Duration, complete func(n int) bool, flush func([]T)) {
	if max < 1 {
		max = 1
	}
	buf := make([]T, 0, max)
	var timer *time.Timer
	for {
		item, ok := <-in
		if !ok {
			return
		}
		buf = append(buf, item)
		open := true
		var deadline <-chan time.Time
		if linger > 0 {
			if timer == nil {
				timer = time.NewTimer(linger)
			} else {
				timer.Reset(linger)
			}
			deadline = timer.C
		}
	collect:
		for len(buf) < max {
			select {
			case item, ok := <-in:
				if !ok {
					open = false
					break collect
				}
				buf = append(buf, item)
				continue
			default:
			}
			// Nothing queued right now.
			if deadline == nil || complete != nil && complete(len(buf)) {
				break collect
			}
			select {
			case item, ok := <-in:
				if !ok {
					open = false
					break collect
				}
				buf = append(buf, item)
			case <-deadline:
				deadline = nil
				break collect
			}
		}
		if timer != nil && deadline != nil {
			timer.Stop()
		}
		flush(buf)
		clear(buf)
		buf = buf[:0]
		if !open {
			return
		}
	}
}
