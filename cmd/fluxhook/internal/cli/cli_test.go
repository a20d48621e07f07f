package cli

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"postgres://root@127.0.0.1:5432/db?sslmode=disable", "postgres://root@127.0.0.1:5432/db?sslmode=disable"},
		{"postgres://app:hunter2@db.internal:5432/app", "postgres://app:xxxxx@db.internal:5432/app"},
		{"postgresql://app:p%40ss%2Fword@db/app", "postgresql://app:xxxxx@db/app"},
		{"postgres://app@db/app?sslmode=require&password=hunter2", "postgres://app@db/app?sslmode=require&password=xxxxx"},
		{"postgres://app@db/app?sslpassword=hunter2&sslmode=verify-full", "postgres://app@db/app?sslpassword=xxxxx&sslmode=verify-full"},
		{"postgres://app:hun/ter#2@db/app", "postgres://app:xxxxx@db/app"},
		{"host=db user=app password=hunter2 dbname=app", "host=db user=app password=xxxxx dbname=app"},
		{"host=db password='hun ter2' dbname=app", "host=db password=xxxxx dbname=app"},
		{"https://user:hunter2@consumer.example/hook?x=1", "https://user:xxxxx@consumer.example/hook?x=1"},
		{"https://consumer.example/hook", "https://consumer.example/hook"},
		{"", ""},
	}
	for _, tc := range cases {
		got := RedactURL(tc.in)
		if got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "hunter2") || strings.Contains(got, "ter2") {
			t.Errorf("RedactURL(%q) leaks the password: %q", tc.in, got)
		}
	}
}

func TestParseFlagsAllowsFlagsAfterArguments(t *testing.T) {
	t.Parallel()
	fs := NewFlagSet("x", io.Discard, io.Discard, "x")
	force := fs.Bool("force", false, "")
	n := fs.Int("n", 0, "")
	pos, err := ParseFlags(fs, []string{"7", "--force", "8", "-n", "3", "--", "--not-a-flag"})
	if err != nil {
		t.Fatal(err)
	}
	if !*force || *n != 3 || strings.Join(pos, " ") != "7 8 --not-a-flag" {
		t.Errorf("parsed force=%v n=%d positional=%q", *force, *n, pos)
	}
}

// TestFlagErrorsReadAsTheHelpWritesFlags: the flag package's refusals name flags with two
// dashes, as every help and example writes them, say what a value should have been instead of
// "parse error", and suggest the nearest flag for an unknown one.
func TestFlagErrorsReadAsTheHelpWritesFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--jsn"}, "unknown flag --jsn; did you mean --json?"},
		{[]string{"--xyzzy"}, "unknown flag --xyzzy"},
		{[]string{"--limit", "x"}, `--limit "x": want a whole number`},
		{[]string{"--delay", "soon"}, `--delay "soon": want a duration, such as 30s, 5m or 2h`},
		{[]string{"--json=maybe"}, `--json "maybe": want true or false`},
		{[]string{"--limit"}, "flag needs an argument: --limit"},
	} {
		fs := NewFlagSet("x", io.Discard, io.Discard, "x")
		fs.Bool("json", false, "")
		fs.Int("limit", 0, "")
		fs.Duration("delay", 0, "")
		_, err := ParseFlags(fs, tc.args)
		if err == nil || !errors.Is(err, ErrUsage) || !strings.HasSuffix(err.Error(), tc.want) {
			t.Errorf("%v: %v, want a usage error ending %q", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "xyzzy") && strings.Contains(err.Error(), "did you mean") {
			t.Errorf("%v: %v suggests a flag nothing is close to", tc.args, err)
		}
	}
}

// TestHelpGoesWhereItWasAskedFor: -h prints the help to standard output (it was asked for, and
// is piped to a pager or grep from there); a usage error prints it to standard error, away from
// output a script reads.
func TestHelpGoesWhereItWasAskedFor(t *testing.T) {
	t.Parallel()
	var stdout, stderr strings.Builder
	fs := NewFlagSet("x", &stdout, &stderr, "fluxhook x [--json]")
	fs.Bool("json", false, "print JSON")
	if _, err := ParseFlags(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if !strings.HasPrefix(stdout.String(), "usage: fluxhook x [--json]\n") || !strings.Contains(stdout.String(), "\n  --json\n      print JSON\n") || stderr.Len() != 0 {
		t.Errorf("-h: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	stdout.Reset()
	if _, err := ParseFlags(fs, []string{"--nope"}); err == nil {
		t.Fatal("--nope parsed")
	}
	if stdout.Len() != 0 || !strings.HasPrefix(stderr.String(), "usage: fluxhook x [--json]\n") || strings.Contains(stderr.String(), "provided but not defined") {
		t.Errorf("--nope: stdout %q, stderr %q; want the help alone on stderr", stdout.String(), stderr.String())
	}
}
