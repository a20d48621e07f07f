package dispatcher

import "time"

// SetRideWait sets rideWait and returns what restores it: a wait long enough to measure shows
// whether settles wait for claims that do not come. Only for tests that do not run in
// parallel: every dispatcher of the test binary reads it.
func SetRideWait(w time.Duration) (restore func()) {
	old := rideWait
	rideWait = w
	return func() { rideWait = old }
}
