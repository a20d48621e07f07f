// Package fluxhooktest builds the fluxhook binary for the tests that run it as a child process,
// as a user or an init system would: signals, exit statuses and children of its own cannot be
// tested in-process. Package main's tests and the bench's (internal/bench) both need it, and
// a build costs seconds, so each test binary builds it once, into a directory its TestMain
// owns:
//
//	func TestMain(m *testing.M) { os.Exit(fluxhooktest.Main(m)) }
package fluxhooktest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
)

// command is what gets built: the package path works from any directory of the module, so a
// test needs not know where it sits relative to cmd/fluxhook.
const command = "github.com/fluxora/fluxhook/cmd/fluxhook"

// binDir holds the binaries built for this test run; Main creates and removes it.
var binDir string

// build is one flavour of the binary, built at most once per test run.
type build struct {
	once sync.Once
	bin  string
	err  error
}

var raced, plain build

// Main runs the tests with a directory for the builds and removes it afterwards, returning
// the exit status for os.Exit: without it the binaries would be left in the temporary
// directory after every run.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fluxhook-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "creating a directory for the fluxhook binary:", err)
		return 1
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	return code
}

// Binary builds the fluxhook binary once per test run and returns its path. It is built with
// -race when the tests run with it, so that races in the child are reported too.
func Binary(t testing.TB) string {
	t.Helper()
	if RaceEnabled() {
		return raced.get(t, "fluxhook", "-race")
	}
	return plain.get(t, "fluxhook")
}

// BinaryNoRace is Binary built without the race detector, for a case whose size the race
// detector would make too slow for CI (it slows a dispatcher several times over). Without
// -race it is the same binary as Binary.
func BinaryNoRace(t testing.TB) string {
	t.Helper()
	if RaceEnabled() {
		return plain.get(t, "fluxhook-norace")
	}
	return Binary(t)
}

func (b *build) get(t testing.TB, name string, flags ...string) string {
	t.Helper()
	b.once.Do(func() {
		if binDir == "" {
			b.err = fmt.Errorf("fluxhooktest: no directory for the binary: call fluxhooktest.Main from TestMain")
			return
		}
		bin := filepath.Join(binDir, name)
		args := append(append([]string{"build"}, flags...), "-o", bin, command)
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
			return
		}
		b.bin = bin
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

// RaceEnabled reports whether this test binary was built with -race: a race-enabled child
// needs GORACE=atexit_sleep_ms=0 not to sleep a second before exiting, and a large case may
// want a plain build.
func RaceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
