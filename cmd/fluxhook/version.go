package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"runtime/debug"

	fluxsql "github.com/fluxora/fluxhook/sql"
)

func init() {
	commands["version"] = command{summary: "Print fluxhook's version, the commit it was built from and the schema it needs (also --version)", run: runVersion}
}

// versionInfo is what `fluxhook version` prints: enough to match a running binary to a release
// or a commit, and to know which schema (`fluxhook migrate`) it expects.
type versionInfo struct {
	// Version is the module version `go install …@version` recorded, "(devel)" for a build
	// from a checkout.
	Version string `json:"version"`
	// Commit and CommitTime come from the VCS stamp of a build from a checkout (empty
	// otherwise); Modified says the checkout had uncommitted changes.
	Commit     string `json:"commit,omitempty"`
	CommitTime string `json:"commit_time,omitempty"`
	Modified   bool   `json:"modified,omitempty"`
	Go         string `json:"go"`
	Schema     int    `json:"schema"`
}

func currentVersion() versionInfo {
	v := versionInfo{Version: "(unknown)", Schema: fluxsql.LatestVersion()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Version, v.Go = info.Main.Version, info.GoVersion
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func runVersion(_ context.Context, env *environment, args []string) error {
	fs := newFlagSet("version", env, "fluxhook version [--json]")
	asJSON := fs.Bool("json", false, "print as JSON")
	if err := noArguments(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	v := currentVersion()
	if *asJSON {
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	fmt.Fprintf(env.stdout, "fluxhook %s", v.Version)
	if v.Commit != "" {
		fmt.Fprintf(env.stdout, " (commit %s", v.Commit)
		if v.Modified {
			fmt.Fprint(env.stdout, ", modified")
		}
		if v.CommitTime != "" {
			fmt.Fprintf(env.stdout, ", %s", v.CommitTime)
		}
		fmt.Fprint(env.stdout, ")")
	}
	fmt.Fprintf(env.stdout, "\n%s, schema version %d\n", v.Go, v.Schema)
	return nil
}
