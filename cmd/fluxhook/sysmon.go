package main

import (
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
)

// sysmonAwake is the GODEBUG setting serve runs with unless GODEBUG sets schedtrace itself:
// Go's scheduler monitor (sysmon) then never takes its deep sleep. Live traffic makes the
// dispatcher idle between events, a thousand times a second at 1,000 events/s; each time, the
// monitor went into its deep sleep, and the event's first system call woke it with a futex and
// put it back on 20 µs polls, during which it also handed the processor of a dispatcher
// blocked in a loopback write to another thread. Kept awake, it sleeps up to 10 ms a poll and
// none of that happens: the dispatcher's CPU per event fell from 305-351 µs to 221-251 at
// 1,000 events/s and from 526-552 to 376-406 at 500/s (`fluxhook bench --workload
// idle,steady,drain --baseline river`, two interleaved runs of each build, 2-CPU VM; the
// drain's did not move). The price: about 100 wake-ups a second of the
// monitor while idle (2 ms of CPU a second), and the runtime's one-line scheduler trace
// ("SCHED …") on standard error each 2^31 ms (24.8 days) of the host's uptime, which
// schedtrace cannot be told to leave out: at start on a host up longer than that (written in
// pieces, a log line written at that moment may land inside it); and a fatal error or SIGQUIT
// prints the scheduler's state before the goroutines. GODEBUG=schedtrace=0 turns it off.
const sysmonAwake = "schedtrace=2147483647"

// keepSysmonAwake re-executes serve with sysmonAwake added to GODEBUG, which the runtime reads
// only as a process starts. It returns when it does not (GODEBUG already sets schedtrace, the
// platform has no exec, or the exec failed): serve then runs as it is.
func keepSysmonAwake() {
	godebug := os.Getenv("GODEBUG")
	for _, kv := range strings.Split(godebug, ",") {
		if strings.HasPrefix(strings.TrimSpace(kv), "schedtrace=") {
			return
		}
	}
	if runtime.GOOS != "linux" {
		return
	}
	if godebug != "" {
		godebug += ","
	}
	// Replaced, not appended: a process reads the first of two GODEBUG entries.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
	env = append(env, "GODEBUG="+godebug+sysmonAwake)
	_ = syscall.Exec(selfPath(), os.Args, env)
}

// selfPath is the path to execute this very binary again: its own path when that still names
// the running file, so that the process keeps its name for ps, pgrep and killall (executed as
// /proc/self/exe it is called "exe"); else /proc/self/exe, which is this binary even when its
// file was replaced or removed since it started.
func selfPath() string {
	const self = "/proc/self/exe"
	path, err := os.Executable()
	if err != nil {
		return self
	}
	running, err1 := os.Stat(self)
	named, err2 := os.Stat(path)
	if err1 != nil || err2 != nil || !os.SameFile(running, named) {
		return self
	}
	return path
}
