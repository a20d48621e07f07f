package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
	fluxsql "github.com/fluxora/fluxhook/sql"
)

// TestVersion: `fluxhook version` names the Go version and the schema this build needs, in
// text and JSON, exits 0 on -h and 2 on an argument.
func TestVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"version"}, &out, &errOut, func(string) string { return "" }); code != 0 {
		t.Fatalf("version exited %d: %s", code, errOut.String())
	}
	want := "schema version " + strconv.Itoa(fluxsql.LatestVersion())
	if !strings.HasPrefix(out.String(), "fluxhook ") || !strings.Contains(out.String(), runtime.Version()) || !strings.Contains(out.String(), want) {
		t.Errorf("version printed %q, want fluxhook's version, %s and %q", out.String(), runtime.Version(), want)
	}
	out.Reset()
	if code := run([]string{"version", "--json"}, &out, &errOut, func(string) string { return "" }); code != 0 {
		t.Fatalf("version --json exited %d: %s", code, errOut.String())
	}
	var v versionInfo
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v.Schema != fluxsql.LatestVersion() || v.Go != runtime.Version() || v.Version == "" {
		t.Errorf("version --json = %s (%v)", out.String(), err)
	}
	if code := run([]string{"version", "-h"}, &out, &errOut, func(string) string { return "" }); code != 0 {
		t.Errorf("version -h exited %d, want 0", code)
	}
	if code := run([]string{"version", "extra"}, &out, &errOut, func(string) string { return "" }); code != 2 {
		t.Errorf("version extra exited %d, want 2", code)
	}
}

// TestEveryCommandHelpExitsZero: `fluxhook COMMAND -h` prints the command's flags and exits 0
// for every command, as `fluxhook help` does.
func TestEveryCommandHelpExitsZero(t *testing.T) {
	for name := range commands {
		var out, errOut bytes.Buffer
		if code := run([]string{name, "-h"}, &out, &errOut, func(string) string { return "" }); code != 0 {
			t.Errorf("%s -h exited %d: %s", name, code, errOut.String())
		}
		if strings.Contains(errOut.String(), "help requested") {
			t.Errorf("%s -h reports an error: %s", name, errOut.String())
		}
	}
}

// TestEveryCommandsHelpHasOneShape: every command's -h, subcommands and groups included, reads
// the same way: the synopsis, one sentence on what it does, the flags (a group's subcommands,
// one line each), the environment variables it obeys that are no flag's (where it has any),
// an example; and every command, subcommand and group has that help (a new one without it
// fails here). Every flag is written in one shape (flagLine), with a placeholder that says
// what its value is, and its default and environment variable only in that shape; every
// variable named is one fluxhook reads; every example runs the command it is the help of, with
// flags it has and nothing to fill in; `fluxhook help CMD` prints exactly what `fluxhook CMD
// -h` does; and what the top help says of them all holds.
func TestEveryCommandsHelpHasOneShape(t *testing.T) {
	groups := map[string][]subcommand{"dlq": dlqSubcommands, "endpoints": endpointsSubcommands, "api-keys": apiKeysSubcommands}
	names := []string{}
	for name := range commands {
		if groups[name] == nil {
			names = append(names, name)
		}
	}
	for group, subs := range groups {
		for _, sub := range subs {
			names = append(names, group+" "+sub.name)
		}
	}
	known := knownVariables()
	envFlags, plainFlags := 0, 0
	for _, name := range names {
		h, ok := commandHelp[name]
		if !ok || h.Sentence == "" || h.Example == "" {
			t.Errorf("%s has no help sentence and example in commandHelp", name)
			continue
		}
		r := runCLIEnv(t, nil, append(strings.Fields(name), "-h")...)
		if r.code != 0 || r.stderr != "" {
			t.Errorf("%s -h exited %d, stderr %q; want 0 and the help on stdout alone", name, r.code, r.stderr)
		}
		help := r.stdout
		paragraphs := 4
		if len(h.Env) > 0 {
			paragraphs = 5
		}
		checkHelpShape(t, name+" -h", help, h, paragraphs, []string{"usage: fluxhook " + name, "\nflags:\n"})
		for _, p := range strings.Split(strings.TrimSpace(help), "\n\n") {
			lines := strings.Split(p, "\n")
			switch lines[0] {
			case "flags:":
				for i := 1; i < len(lines); i += 2 {
					flagText := strings.Join(lines[i:min(i+2, len(lines))], "\n")
					m := flagLine.FindStringSubmatch(flagText)
					switch {
					case m == nil:
						t.Errorf("%s -h: flag not in the one shape:\n%s", name, flagText)
					case m[1] == "VALUE" || m[1] == "STRING":
						t.Errorf("%s -h: a flag does not say what its value is (%s):\n%s", name, m[1], flagText)
					case strings.Contains(flagText, "(default") || strings.Contains(flagText, "(env "):
						t.Errorf("%s -h: a default or variable in the prose, not in the one shape:\n%s", name, flagText)
					case m[2] != "":
						envFlags++
						if !known[m[2]] {
							t.Errorf("%s -h: %s is no variable fluxhook reads:\n%s", name, m[2], flagText)
						}
					default:
						plainFlags++
					}
				}
			case "environment:":
				for i := 1; i < len(lines); i += 2 {
					text := strings.Join(lines[i:min(i+2, len(lines))], "\n")
					if m := envLine.FindStringSubmatch(text); m == nil || !known[m[1]] {
						t.Errorf("%s -h: environment entry not in the one shape, or naming no variable fluxhook reads:\n%s", name, text)
					}
				}
			}
		}
		checkExample(t, name, h.Example, help)
		if got := runCLIEnv(t, nil, append([]string{"help"}, strings.Fields(name)...)...); got != r {
			t.Errorf("fluxhook help %s differs from fluxhook %s -h:\n%+v\n%+v", name, name, got, r)
		}
	}
	if envFlags == 0 || plainFlags == 0 {
		t.Errorf("%d flags with a variable and %d without: the top help's sentence on variables says nothing", envFlags, plainFlags)
	}
	for group, subs := range groups {
		h, ok := commandHelp[group]
		if !ok || h.Sentence == "" || h.Example == "" {
			t.Errorf("group %s has no help sentence and example in commandHelp", group)
		}
		names := make([]string, len(subs))
		for i, sub := range subs {
			names[i] = sub.name
		}
		want := []string{"usage: fluxhook " + group + " " + strings.Join(names, "|") + " ", "\ncommands (fluxhook " + group + " COMMAND -h shows its flags):\n"}
		for _, sub := range subs {
			// the subcommand's name, padded, then its own sentence, on one line
			want = append(want, "\n  "+sub.name+" ", " "+commandHelp[group+" "+sub.name].Sentence+"\n")
		}
		for _, args := range [][]string{{group, "-h"}, {group, "help"}, {"help", group}} {
			r := runCLIEnv(t, nil, args...)
			if r.code != 0 || r.stderr != "" {
				t.Errorf("%v exited %d, stderr %q", args, r.code, r.stderr)
			}
			checkHelpShape(t, strings.Join(args, " "), r.stdout, h, 4, want)
		}
		checkExample(t, group, h.Example, "")
		if r := runCLIEnv(t, nil, group); r.code != 2 || !strings.HasPrefix(r.stderr, "usage: fluxhook "+group+" ") {
			t.Errorf("%s without a subcommand: exit %d, %q; want 2 and the group's help", group, r.code, r.stderr)
		}
	}

	// The top help lists every command, and says what the walk above found true.
	top := runCLIEnv(t, nil, "-h")
	listed := regexp.MustCompile(`(?m)^  ([a-z-]+) +[A-Z]`).FindAllStringSubmatch(top.stdout, -1)
	if len(listed) != len(commands) {
		t.Errorf("the top help lists %d commands, there are %d:\n%s", len(listed), len(commands), top.stdout)
	}
	for _, m := range listed {
		if _, ok := commands[m[1]]; !ok {
			t.Errorf("the top help lists %q, which is no command", m[1])
		}
	}
	for _, claim := range []string{"`fluxhook help COMMAND` (or `fluxhook COMMAND -h`)", "falls back to an\nenvironment variable says so ([env: NAME]); the others have none."} {
		if !strings.Contains(top.stdout, claim) {
			t.Errorf("the top help lacks %q:\n%s", claim, top.stdout)
		}
	}
	if bare := runCLIEnv(t, nil); bare.code != 2 || bare.stdout != "" || bare.stderr != top.stdout {
		t.Errorf("fluxhook without a command: exit %d, stdout %q; want 2 and the top help on stderr", bare.code, bare.stdout)
	}
	if strings.Contains(strings.ToLower(top.stdout), "every flag") {
		t.Errorf("the top help claims something of every flag:\n%s", top.stdout)
	}
}

// flagLine is the one shape of a flag in every command's help (cli.WriteFlag): the flag and
// its value's placeholder (capitals, or the choices; none for a switch), then what it does,
// with its default and its environment variable at the end in brackets, each only where it
// has one. The description holds no bracket, so that nothing else can look like either.
var flagLine = regexp.MustCompile(`^  --[a-z0-9]+(?:-[a-z0-9]+)*(?: ([A-Z][A-Z0-9_:=]*|[a-z0-9-]+(?:\|[a-z0-9-]+)+))?\n` +
	`      [^\s\[][^\[\n]*?(?: \[default: [^\]\n]+\])?(?: \[env: ([A-Z][A-Z0-9_]*)\])?$`)

// envLine is the shape of a variable in a help's environment paragraph.
var envLine = regexp.MustCompile(`^  ([A-Z][A-Z0-9_]*)\n      [^\s\[].*$`)

// knownVariables are the variables fluxhook reads: serve's settings, and the _FILE of each
// secret one. A help naming another has a typo, or names one nothing reads.
func knownVariables() map[string]bool {
	known := map[string]bool{}
	for _, s := range settings {
		known[s.env] = true
		if s.secret {
			known[s.env+"_FILE"] = true
		}
	}
	return known
}

// checkExample fails the test unless example, the help of command name, runs that command (or,
// for a group, one of its subcommands) with nothing to fill in, and every flag it passes is one
// that help lists ("" for a group: the subcommand's own help is read).
func checkExample(t *testing.T, name, example, help string) {
	t.Helper()
	if strings.ContainsAny(example, "…<>") && !strings.Contains(example, " > ") {
		t.Errorf("%s: the example has something to fill in: %s", name, example)
	}
	words := strings.Fields(example)
	at := slices.Index(words, "fluxhook")
	if at < 0 || at+1 >= len(words) {
		t.Errorf("%s: the example runs no fluxhook command: %s", name, example)
		return
	}
	cmd := words[at+1]
	rest := words[at+2:]
	if _, group := commandHelp[cmd+" "+firstOf(rest)]; group {
		cmd += " " + rest[0]
		rest = rest[1:]
	}
	if cmd != name && !strings.HasPrefix(cmd, name+" ") {
		t.Errorf("%s: the example runs fluxhook %s instead: %s", name, cmd, example)
		return
	}
	if help == "" || cmd != name {
		help = runCLIEnv(t, nil, append(strings.Fields(cmd), "-h")...).stdout
	}
	for _, w := range rest {
		if w == "|" || w == ">" || w == "&&" || w == ";" {
			break
		}
		if flagName, ok := strings.CutPrefix(w, "--"); ok {
			flagName, _, _ = strings.Cut(flagName, "=")
			if !regexp.MustCompile(`\n  --` + regexp.QuoteMeta(flagName) + `[ \n]`).MatchString(help) {
				t.Errorf("%s: the example passes --%s, which fluxhook %s does not have: %s", name, flagName, cmd, example)
			}
		}
	}
}

func firstOf(words []string) string {
	if len(words) == 0 {
		return ""
	}
	return words[0]
}

// checkHelpShape fails the test unless help, what the command line name printed, is n
// paragraphs (synopsis, sentence, flags or subcommands, the environment where there is one,
// example) holding h's sentence and example and every string in want.
func checkHelpShape(t *testing.T, name, help string, h cli.Help, n int, want []string) {
	t.Helper()
	if got := len(strings.Split(strings.TrimSpace(help), "\n\n")); got != n {
		t.Errorf("%s has %d paragraphs, want %d (synopsis, sentence, flags, environment if any, example):\n%s", name, got, n, help)
	}
	for _, part := range append(want, "\n"+h.Sentence+"\n", "\nexample:\n  "+h.Example+"\n") {
		if !strings.Contains(help, part) {
			t.Errorf("%s lacks %q:\n%s", name, part, help)
		}
	}
}

// TestDurationsInDays: WEBHOOK_RETENTION and WEBHOOK_ENDPOINT_DISABLE_AFTER take whole days as
// `dlq --since` does, and Go durations as before.
func TestDurationsInDays(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:5432/db", "WEBHOOK_URL": "https://example.com/h", "WEBHOOK_SECRET": "s"}
	for _, s := range settings {
		if _, ok := base[s.env]; !ok && s.def != "" {
			base[s.env] = s.def
		}
	}
	for _, tc := range []struct {
		retention, disable string
		want, wantDisable  time.Duration
	}{
		{"7d", "5d", 7 * 24 * time.Hour, 5 * 24 * time.Hour},
		{"36h", "90m", 36 * time.Hour, 90 * time.Minute},
	} {
		v := maps.Clone(base)
		v["WEBHOOK_RETENTION"], v["WEBHOOK_ENDPOINT_DISABLE_AFTER"] = tc.retention, tc.disable
		c, err := parseServeConfig(v)
		if err != nil {
			t.Fatalf("%s, %s: %v", tc.retention, tc.disable, err)
		}
		if c.dispatcher.Retention != tc.want || c.dispatcher.EndpointDisableAfter != tc.wantDisable {
			t.Errorf("%s, %s: retention %s, disable after %s", tc.retention, tc.disable, c.dispatcher.Retention, c.dispatcher.EndpointDisableAfter)
		}
	}
	v := maps.Clone(base)
	v["WEBHOOK_RETENTION"] = "0d"
	if _, err := parseServeConfig(v); err == nil || !strings.Contains(err.Error(), "WEBHOOK_RETENTION") {
		t.Errorf("WEBHOOK_RETENTION=0d: %v, want an error naming it", err)
	}
}

// TestInvalidConfigMessage: serve's refusal of a configuration names each bad variable once,
// is not dressed as a command-line usage error, and exits 2.
func TestInvalidConfigMessage(t *testing.T) {
	vars := map[string]string{"DATABASE_URL": "postgres://u@127.0.0.1:1/db", "WEBHOOK_URL": "https://example.com/h",
		"WEBHOOK_SECRET": "s", "WEBHOOK_SIGNATURE_SCHEME": "bogus"}
	var out, errOut bytes.Buffer
	if code := run([]string{"serve"}, &out, &errOut, func(k string) string { return vars[k] }); code != 2 {
		t.Fatalf("serve exited %d, want 2: %s", code, errOut.String())
	}
	msg := errOut.String()
	if !strings.HasPrefix(msg, "fluxhook serve: invalid configuration:\n") || strings.Contains(msg, "usage:") {
		t.Errorf("message %q: want it to start with the refusal, without usage:", msg)
	}
	if n := strings.Count(msg, "WEBHOOK_SIGNATURE_SCHEME"); n != 1 {
		t.Errorf("WEBHOOK_SIGNATURE_SCHEME named %d times, want once:\n%s", n, msg)
	}
}

// TestServeHelpNamesKinds: serve -h names each flag's kind of value (not "string" for all) and
// its default and environment variable the way every command does.
func TestServeHelpNamesKinds(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"serve", "-h"}, &out, &errOut, func(string) string { return "" }); code != 0 {
		t.Fatalf("serve -h exited %d", code)
	}
	help := errOut.String() + out.String()
	for _, want := range []string{"--webhook-batch-size N\n", "--webhook-timeout-ms MILLISECONDS\n", "--database-url URL\n",
		"--webhook-retention DURATION\n", "--log-format json|console\n", " [default: 100] [env: WEBHOOK_BATCH_SIZE]\n"} {
		if !strings.Contains(help, want) {
			t.Errorf("serve -h lacks %q", want)
		}
	}
	for _, bad := range []string{" string\n", "[$", "(default", "(env ", " choice\n"} {
		if strings.Contains(help, bad) {
			t.Errorf("serve -h contains %q:\n%s", bad, help)
		}
	}
}

// TestCommandLineMistakes: one rule for exit codes (2: usage or configuration; 1: the operation
// failed), and help for the usual slips: a missing DATABASE_URL reads the same for every
// command and exits 2, a mistyped URL scheme is named with the right one, --version works, and
// a mistyped command gets a suggestion.
func TestCommandLineMistakes(t *testing.T) {
	t.Parallel()
	const missing = "DATABASE_URL: is required: a PostgreSQL URL such as postgres://user@localhost:5432/app; set it, or pass --database-url"
	for _, cmd := range [][]string{{"serve"}, {"api", "--api-addr", "127.0.0.1:0"}, {"migrate"}, {"status"}, {"enqueue", "--event-type", "t"}, {"dlq", "list"}, {"endpoints", "list"}, {"api-keys", "list"}} {
		r := runCLIEnv(t, nil, cmd...)
		if r.code != 2 || !strings.Contains(r.stderr, missing) {
			t.Errorf("%v without DATABASE_URL: exit %d, %q; want 2 and %q", cmd, r.code, r.stderr, missing)
		}
	}
	r := runCLIEnv(t, map[string]string{"DATABASE_URL": "postgress://root@127.0.0.1/app"}, "status")
	if r.code != 2 || !strings.Contains(r.stderr, `scheme "postgress"`) || !strings.Contains(r.stderr, "postgres://") {
		t.Errorf("a mistyped scheme: exit %d, %q; want 2 naming the scheme and postgres://", r.code, r.stderr)
	}
	if r := runCLIEnv(t, nil, "--version"); r.code != 0 || !strings.Contains(r.stdout, "schema version") {
		t.Errorf("--version: exit %d, %q", r.code, r.stdout)
	}
	for typo, want := range map[string]string{"serv": "fluxhook serve", "stauts": "fluxhook status", "endpoint": "fluxhook endpoints"} {
		if r := runCLIEnv(t, nil, typo); r.code != 2 || !strings.Contains(r.stderr, "did you mean `"+want+"`") {
			t.Errorf("%s: exit %d, %q; want 2 and a suggestion of %s", typo, r.code, r.stderr, want)
		}
	}
	if r := runCLIEnv(t, nil, "xyzzy"); r.code != 2 || strings.Contains(r.stderr, "did you mean") {
		t.Errorf("xyzzy: exit %d, %q; want 2 and no suggestion", r.code, r.stderr)
	}
}

// TestSubcommandTyposGetASuggestion: a mistyped subcommand is answered as a mistyped command
// is, by the same suggestion (didYouMean), with exit status 2; one nothing is close to gets
// none.
func TestSubcommandTyposGetASuggestion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ args, want string }{
		{"dlq lst", "fluxhook dlq list"},
		{"dlq replya", "fluxhook dlq replay"},
		{"endpoints ad", "fluxhook endpoints add"},
		{"endpoints rotate", "fluxhook endpoints rotate-secret"},
		{"api-keys lsit", "fluxhook api-keys list"},
		{"help stauts", "fluxhook status"},
	} {
		r := runCLIEnv(t, nil, strings.Fields(tc.args)...)
		if r.code != 2 || !strings.Contains(r.stderr, "did you mean `"+tc.want+"`?") {
			t.Errorf("fluxhook %s: exit %d, %q; want 2 and a suggestion of %s", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if r := runCLIEnv(t, nil, "dlq", "xyzzy"); r.code != 2 || strings.Contains(r.stderr, "did you mean") {
		t.Errorf("dlq xyzzy: exit %d, %q; want 2 and no suggestion", r.code, r.stderr)
	}
}
