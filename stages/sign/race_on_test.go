//go:build race

package sign_test

const raceEnabled = true
