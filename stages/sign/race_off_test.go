//go:build !race

package sign_test

// raceEnabled tells allocation tests to stand down: under the race detector sync.Pool drops
// items on purpose, so allocation counts mean nothing.
const raceEnabled = false
