package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestServeKeepsSysmonAwake: serve runs with GODEBUG's schedtrace set (sysmonAwake), added to
// what GODEBUG already says, unless GODEBUG sets schedtrace itself: the operator's value holds.
func TestServeKeepsSysmonAwake(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)
	hook := newHookConsumer(t, nil)
	for given, want := range map[string]string{
		"":                            sysmonAwake,
		"http2client=0":               "http2client=0," + sysmonAwake,
		"schedtrace=0":                "schedtrace=0",
		"madvdontneed=1,schedtrace=0": "madvdontneed=1,schedtrace=0",
	} {
		env := serveEnv(db.URL, hook.URL())
		if given != "" {
			env["GODEBUG"] = given
		}
		p := startServe(t, "serve GODEBUG="+given, env)
		p.waitLog(15*time.Second, `"msg":"dispatcher started"`)
		environ, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/environ")
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, kv := range strings.Split(string(environ), "\x00") {
			if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
				if got != "" {
					t.Errorf("GODEBUG=%q: serve's environment has GODEBUG twice", given)
				}
				got = v
			}
		}
		if got != want {
			t.Errorf("GODEBUG=%q: serve runs with GODEBUG=%q, want %q", given, got, want)
		}
		// Executed again by its own path, it keeps its name (ps, pgrep, killall).
		if comm, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/comm"); err != nil || strings.TrimSpace(string(comm)) == "exe" {
			t.Errorf("GODEBUG=%q: serve's process name is %q (%v)", given, comm, err)
		}
		p.stopCleanly()
	}
}
