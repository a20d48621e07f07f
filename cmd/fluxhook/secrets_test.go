package main

import (
	"bytes"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluxora/fluxhook/sql/sqltest"
	"github.com/fluxora/fluxhook/stages/delivery"
)

// runEndpointsCLIWithStdin is runEndpointsCLI with stdin piped in, for `--secret -`.
func runEndpointsCLIWithStdin(t *testing.T, db *sqltest.DB, stdin string, args ...string) cliResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return db.URL
		}
		return ""
	}
	code := runWithStdin(append([]string{"endpoints"}, args...), strings.NewReader(stdin), &stdout, &stderr, getenv)
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// writeSecretFile writes content to a new file in a test directory and returns its path.
func writeSecretFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const secretWarning = "puts a secret on the command line"

// TestEndpointsSecretFromFileOrStdin: the endpoints commands take a secret from a file
// (--secret-file) or standard input (--secret -) with one trailing newline removed, so that it
// never appears in the process list; a secret given as an argument still works, with a
// warning that does not repeat it. A secret given is never printed back (only one fluxhook
// generated is). Bad input is refused with the flag and the problem named.
func TestEndpointsSecretFromFileOrStdin(t *testing.T) {
	t.Parallel()
	db := sqltest.NewMigrated(t)

	file := writeSecretFile(t, "secret", "fluxora-secret-from-a-file\n")
	r := runEndpointsCLI(t, db, nil, "add", "--json", "--url", "https://a.example/", "--secret-file", file)
	e := decodeEndpoint(t, r)
	if e.Secret != "" || storedSecret(t, db, "", e.ID) != "fluxora-secret-from-a-file" || strings.Contains(r.stderr, secretWarning) {
		t.Errorf("add --secret-file: printed %q, stored %q, stderr %q; want the file's line stored, not printed, and no warning",
			e.Secret, storedSecret(t, db, "", e.ID), r.stderr)
	}
	// Nor in the text output: the operator has the secret they gave, and a terminal's
	// scrollback or a CI log is no place for it.
	r = runEndpointsCLI(t, db, nil, "add", "--url", "https://a2.example/", "--secret-file", file)
	if r.code != 0 || strings.Contains(r.stdout, "fluxora-secret-from-a-file") || !strings.Contains(r.stdout, "the secret you gave") {
		t.Errorf("add --secret-file: exit %d, printed\n%s", r.code, r.stdout)
	}

	r = runEndpointsCLIWithStdin(t, db, "fluxora-secret-from-stdin\r\n", "add", "--json", "--url", "https://b.example/", "--secret", "-")
	if e := decodeEndpoint(t, r); e.Secret != "" || storedSecret(t, db, "", e.ID) != "fluxora-secret-from-stdin" || strings.Contains(r.stderr, secretWarning) {
		t.Errorf("add --secret -: printed %q, stderr %q; want the input's line stored, not printed, and no warning", e.Secret, r.stderr)
	}

	const literal = "fluxora-secret-as-an-argument"
	r = runEndpointsCLI(t, db, nil, "add", "--json", "--url", "https://c.example/", "--secret", literal)
	if e := decodeEndpoint(t, r); e.Secret != "" || storedSecret(t, db, "", e.ID) != literal {
		t.Errorf("add --secret S: printed %q; want %q stored, not printed", e.Secret, literal)
	}
	if !strings.Contains(r.stderr, "warning: --secret "+secretWarning) || !strings.Contains(r.stderr, "--secret-file") ||
		strings.Contains(r.stderr, literal) {
		t.Errorf("add --secret S: stderr %q; want a warning naming --secret and --secret-file, without the secret", r.stderr)
	}

	r = runEndpointsCLIWithStdin(t, db, "rotated-from-stdin\n", "rotate-secret", e.ID, "--secret", "-", "--json")
	if got := decodeEndpoint(t, r); got.Secret != "" || storedSecret(t, db, "", e.ID) != "rotated-from-stdin" {
		t.Errorf("rotate-secret --secret -: printed %q, stored %q", got.Secret, storedSecret(t, db, "", e.ID))
	}
	standard := writeSecretFile(t, "whsec", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
	r = runEndpointsCLI(t, db, nil, "update", e.ID, "--scheme", "standard", "--secret-file", standard, "--json")
	if got := decodeEndpoint(t, r); got.Secret != "" || storedSecret(t, db, "", e.ID) != "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" || got.Scheme != "standard" {
		t.Errorf("update --scheme standard --secret-file: %+v", got)
	}

	missing := filepath.Join(t.TempDir(), "nope")
	for _, tc := range []struct {
		stdin string
		args  []string
		want  []string
	}{
		{"", []string{"add", "--url", "https://d.example/", "--secret", "x", "--secret-file", file}, []string{"--secret and --secret-file", "only one"}},
		{"", []string{"add", "--url", "https://d.example/", "--secret-file", missing}, []string{"--secret-file " + missing, "no such file"}},
		{"", []string{"add", "--url", "https://d.example/", "--secret-file", writeSecretFile(t, "empty", "\n")}, []string{"--secret-file", "empty"}},
		{"", []string{"add", "--url", "https://d.example/", "--secret-file", writeSecretFile(t, "two", "a\nb\n")}, []string{"more than one line"}},
		{"", []string{"add", "--url", "https://d.example/", "--secret", "-"}, []string{"--secret - (standard input)", "empty"}},
		{"", []string{"rotate-secret", e.ID, "--secret-file", missing}, []string{"--secret-file " + missing}},
		{"", []string{"update", e.ID, "--secret-file", file}, []string{"only with --scheme"}},
	} {
		r := runEndpointsCLIWithStdin(t, db, tc.stdin, tc.args...)
		for _, w := range tc.want {
			if r.code != 2 || !strings.Contains(r.stderr, w) {
				t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, w)
			}
		}
		if strings.Contains(r.stderr, "fluxora-secret-from-a-file") {
			t.Errorf("%v: stderr %q shows the file's secret", tc.args, r.stderr)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM webhook_endpoints`); n != 4 {
		t.Errorf("%d endpoints, want the 4 added (no refused add went through)", n)
	}
}

// TestSecretSettingsFromFiles: every secret setting of serve can come from --NAME-file or
// NAME_FILE, keeping it out of the process list and the environment; as a flag it works with
// a warning (a URL only when it carries a password); two sources at one level are refused.
func TestSecretSettingsFromFiles(t *testing.T) {
	t.Parallel()
	load := func(vars map[string]string, args ...string) (map[string]string, string, error) {
		var stderr bytes.Buffer
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		env := &environment{stdout: io.Discard, stderr: &stderr, getenv: func(k string) string { return vars[k] }}
		v, err := loadSettings(fs, args, env)
		return v, stderr.String(), err
	}
	secretFile := writeSecretFile(t, "webhook-secret", "secret-from-a-file\n")
	keyFile := writeSecretFile(t, "key", "a2V5LWZyb20tYS1maWxlLXRoaXJ0eS10d28tYnl0ZXM=\n")

	v, stderr, err := load(map[string]string{"WEBHOOK_ENCRYPTION_KEY_FILE": keyFile, "WEBHOOK_SECRET": "from-the-environment"},
		"--webhook-secret-file", secretFile)
	if err != nil || v["WEBHOOK_SECRET"] != "secret-from-a-file" || v["WEBHOOK_ENCRYPTION_KEY"] != "a2V5LWZyb20tYS1maWxlLXRoaXJ0eS10d28tYnl0ZXM=" || stderr != "" {
		t.Errorf("from files: %v, secret %q, key %q, stderr %q; want both files' lines (the flag before the environment), no warning",
			err, v["WEBHOOK_SECRET"], v["WEBHOOK_ENCRYPTION_KEY"], stderr)
	}

	v, stderr, err = load(nil, "--webhook-secret", "secret-as-an-argument", "--database-url", "postgres://app@db/app")
	if err != nil || v["WEBHOOK_SECRET"] != "secret-as-an-argument" {
		t.Fatalf("--webhook-secret S: %v, %q", err, v["WEBHOOK_SECRET"])
	}
	if !strings.Contains(stderr, "warning: --webhook-secret "+secretWarning) || !strings.Contains(stderr, "--webhook-secret-file") ||
		strings.Contains(stderr, "secret-as-an-argument") || strings.Contains(stderr, "--database-url") {
		t.Errorf("--webhook-secret S, --database-url without a password: stderr %q; want one warning, for --webhook-secret, without the secret", stderr)
	}
	_, stderr, _ = load(nil, "--database-url", "postgres://app:hunter2@db/app")
	if !strings.Contains(stderr, "warning: --database-url "+secretWarning) || strings.Contains(stderr, "hunter2") {
		t.Errorf("--database-url with a password: stderr %q; want a warning without the password", stderr)
	}

	missing := filepath.Join(t.TempDir(), "nope")
	for _, tc := range []struct {
		vars map[string]string
		args []string
		want []string
	}{
		{nil, []string{"--webhook-secret", "x", "--webhook-secret-file", secretFile}, []string{"--webhook-secret and --webhook-secret-file", "WEBHOOK_SECRET"}},
		{map[string]string{"WEBHOOK_SECRET": "x", "WEBHOOK_SECRET_FILE": secretFile}, nil, []string{"WEBHOOK_SECRET and WEBHOOK_SECRET_FILE are both set"}},
		{map[string]string{"WEBHOOK_ENCRYPTION_KEY_FILE": missing}, nil, []string{"WEBHOOK_ENCRYPTION_KEY_FILE " + missing, "no such file"}},
		{nil, []string{"--webhook-secret-previous-file", writeSecretFile(t, "blank", "  \n")}, []string{"--webhook-secret-previous-file", "empty"}},
	} {
		_, stderr, err := load(tc.vars, tc.args...)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v %v: %v; want an error with %q", tc.vars, tc.args, err, w)
			}
		}
		if strings.Contains(stderr+err.Error(), "secret-from-a-file") {
			t.Errorf("%v %v: the file's secret was shown", tc.vars, tc.args)
		}
	}

	// serve refuses before connecting to anything, with exit status 2.
	var out, errOut bytes.Buffer
	code := run([]string{"serve", "--webhook-secret-file", missing}, &out, &errOut, func(string) string { return "" })
	if code != 2 || !strings.Contains(errOut.String(), "--webhook-secret-file "+missing) {
		t.Errorf("serve --webhook-secret-file MISSING: exit %d, %q; want 2 naming the flag and the path", code, errOut.String())
	}
}

// TestReceiveSecretFromFile: `fluxhook receive` verifies with the secret of --secret-file
// (and not with the file's bytes including the newline); both secrets on standard input at
// once is refused.
func TestReceiveSecretFromFile(t *testing.T) {
	t.Parallel()
	file := writeSecretFile(t, "secret", "receive-file-secret\n")
	addr, _ := startReceive(t, "--secret-file", file)
	del := func(id string) *delivery.Delivery {
		return &delivery.Delivery{DeliveryID: id, EventType: "order.created", Attempt: 1, Payload: []byte(`{}`)}
	}
	if status, _ := postSigned(t, addr, "receive-file-secret", del("44444444-4444-4444-8444-444444444444")); status != http.StatusNoContent {
		t.Errorf("signed with the file's secret: %d, want 204", status)
	}
	if status, _ := postSigned(t, addr, "receive-file-secret\n", del("55555555-5555-4555-8555-555555555555")); status != http.StatusUnauthorized {
		t.Errorf("signed with the file's bytes, newline included: %d, want 401", status)
	}
	var out, errOut bytes.Buffer
	if code := runWithStdin([]string{"receive", "--secret", "-", "--previous-secret", "-"}, strings.NewReader("a\n"), &out, &errOut,
		func(string) string { return "" }); code != 2 || !strings.Contains(errOut.String(), "both read standard input") {
		t.Errorf("receive --secret - --previous-secret -: exit %d, %q; want 2 saying both read standard input", code, errOut.String())
	}
}
