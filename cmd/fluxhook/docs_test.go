package main

// Tests of the documentation (README.md and docs/*.md): the README keeps its size and its two
// set-up commands first, every relative link leads to a file of the repository (and an
// #anchor to a heading of it), the configuration table names every setting serve reads, no
// document points outside the repository, and the signature-verification examples of
// docs/wire-format.md verify the shared test vectors (Node and Python, when installed) or
// compile (Go).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// readmeLimit is the README's size budget in bytes.
const readmeLimit = 15000

// readmeStart is how the README must begin: the title, then the two set-up commands.
const readmeStart = "# fluxhook\n\n```sh\n" +
	"go run ./cmd/fluxhook demo\n" +
	"go run github.com/go-task/task/v3/cmd/task@v3.54.0 test\n" +
	"```\n"

// repoRoot is the repository's top directory, from this package's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from the test's directory: %v", err)
	}
	return root
}

// markdownDocs returns README.md and docs/*.md, relative to root.
func markdownDocs(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

func readDoc(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReadmeSizeAndSetupCommands(t *testing.T) {
	root := repoRoot(t)
	readme := readDoc(t, root, "README.md")
	if n := len(readme); n >= readmeLimit {
		t.Errorf("README.md is %d bytes; keep it under %d (move detail into docs/)", n, readmeLimit)
	}
	if !strings.HasPrefix(readme, readmeStart) {
		t.Errorf("README.md must start with the title and the two set-up commands:\n%s", readmeStart)
	}
}

// codeBlock matches a fenced code block: its info string and its body.
var codeBlock = regexp.MustCompile("(?ms)^```([^\n`]*)\n(.*?)^```[ \t]*$")

// withoutCode blanks fenced code blocks and inline code spans, so that what looks like a
// link inside an example is not taken for one.
func withoutCode(md string) string {
	md = codeBlock.ReplaceAllString(md, "")
	return regexp.MustCompile("`[^`\n]*`").ReplaceAllString(md, "")
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an optional title.
	inlineLink = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	// referenceLink matches a link reference definition: [label]: target
	referenceLink = regexp.MustCompile(`(?m)^\s{0,3}\[[^\]]+\]:\s+(\S+)`)
	heading       = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
)

// links returns the link targets of a Markdown document, code excluded.
func links(md string) []string {
	text := withoutCode(md)
	var out []string
	for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	for _, m := range referenceLink.FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// anchors returns the anchors GitHub gives a document's headings: lower case, punctuation
// dropped, spaces turned into hyphens, a repeated heading numbered -1, -2, ...
func anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(codeBlock.ReplaceAllString(md, ""), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

func TestDocsLinksResolve(t *testing.T) {
	root := repoRoot(t)
	for _, doc := range markdownDocs(t, root) {
		md := readDoc(t, root, doc)
		for _, target := range links(md) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := doc // a bare #anchor points into the document itself
			if path != "" {
				file = filepath.ToSlash(filepath.Join(filepath.Dir(doc), filepath.FromSlash(path)))
				if file == ".." || strings.HasPrefix(file, "../") || filepath.IsAbs(path) {
					t.Errorf("%s: link %q leaves the repository", doc, target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(file))); err != nil {
					t.Errorf("%s: link %q: no such file in the repository (%s)", doc, target, file)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			if !anchors(readDoc(t, root, file))[anchor] {
				t.Errorf("%s: link %q: %s has no heading with the anchor #%s", doc, target, file, anchor)
			}
		}
	}
}

func TestDocsAnchorsAreGitHubs(t *testing.T) {
	md := "# Guarantees and failure modes\n## The gate: circuit breaker and retry rate limit\n" +
		"```\n# not a heading\n```\n## `fluxhook status`\n## Retention\n## Retention\n"
	got := anchors(md)
	for _, want := range []string{"guarantees-and-failure-modes", "the-gate-circuit-breaker-and-retry-rate-limit",
		"fluxhook-status", "retention", "retention-1"} {
		if !got[want] {
			t.Errorf("anchors lack %q: %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a line in a code block was taken for a heading")
	}
}

// TestReadmeConfigurationNamesEverySetting: the README's configuration table is the one list
// of serve's variables; a setting added to the code and not to the table fails here.
func TestReadmeConfigurationNamesEverySetting(t *testing.T) {
	readme := readDoc(t, repoRoot(t), "README.md")
	for _, s := range settings {
		if !strings.Contains(readme, "| `"+s.env+"` |") {
			t.Errorf("README.md's configuration table has no row for %s", s.env)
		}
	}
}

// TestDocsStayInTheRepository: the documents describe this repository and what its code does
// today; they name no file outside it and no development diary.
func TestDocsStayInTheRepository(t *testing.T) {
	root := repoRoot(t)
	forbidden := regexp.MustCompile(`DESIGN\.md|REFERENCE\.md|\.\./shared|(?i:\bsessions? \d)`)
	for _, doc := range markdownDocs(t, root) {
		for i, line := range strings.Split(readDoc(t, root, doc), "\n") {
			if m := forbidden.FindString(line); m != "" {
				t.Errorf("%s:%d mentions %q", doc, i+1, m)
			}
		}
	}
}

// docPageLimit is a page's size budget: a page a user reads for a task, about 20 KB.
const docPageLimit = 20 << 10

// TestDocsArePagesAUserReads: every page of docs/ stays within its budget, and no document
// names a test, a benchmark function or a test file (tests are how the code is checked, not
// what a user reads: a page says what the user runs instead, `go test ./stages/sign/` or
// `fluxhook bench`; git and the commit messages keep which test pinned what), and the
// benchmark figures name no schema version (they describe the schema that ships).
func TestDocsArePagesAUserReads(t *testing.T) {
	root := repoRoot(t)
	forbidden := []struct {
		re   *regexp.Regexp
		what string
	}{
		{regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*\b`), "the test"},
		{regexp.MustCompile(`\bBenchmark[A-Z][A-Za-z0-9]*\b`), "the benchmark function"},
		{regexp.MustCompile(`[A-Za-z0-9_]*_test\.go\b`), "the test file"},
	}
	schema := regexp.MustCompile(`(?i)\bschemas? (v(ersion)? ?)?\d+`)
	for _, doc := range markdownDocs(t, root) {
		md := readDoc(t, root, doc)
		if n := len(md); strings.HasPrefix(doc, "docs/") && n > docPageLimit {
			t.Errorf("%s is %d bytes; keep each page under %d (split it by task)", doc, n, docPageLimit)
		}
		for i, line := range strings.Split(md, "\n") {
			for _, f := range forbidden {
				if m := f.re.FindString(line); m != "" {
					t.Errorf("%s:%d names %s %s", doc, i+1, f.what, m)
				}
			}
			if m := schema.FindString(line); m != "" && doc == "docs/benchmarks.md" {
				t.Errorf("%s:%d names a schema version (%q): the figures are the shipped schema's", doc, i+1, m)
			}
		}
	}
}

// snippets returns the bodies of the fenced code blocks of md whose info string is lang.
func snippets(md, lang string) []string {
	var out []string
	for _, m := range codeBlock.FindAllStringSubmatch(md, -1) {
		if strings.TrimSpace(m[1]) == lang {
			out = append(out, m[2])
		}
	}
	return out
}

// nodeVectorCheck runs the Node example against testdata/signatures.json: every vector
// verifies, a changed body, a wrong secret and a stale timestamp do not.
const nodeVectorCheck = `
const vectors = JSON.parse(require("node:fs").readFileSync(process.argv[2], "utf8"));
let n = 0;
const expect = (got, want, what) => {
  if (got !== want) throw new Error(what + ": got " + got + ", want " + want);
  n++;
};
for (const v of vectors.fluxora) {
  const h = {"x-fluxora-delivery-id": "evt_1", "x-fluxora-timestamp": v.timestamp, "x-fluxora-signature": v.signature};
  const ts = Number(v.timestamp);
  expect(verifyFluxora(h, Buffer.from(v.body), [v.secret], ts), true, v.name);
  expect(verifyFluxora(h, Buffer.from(v.body), ["wrong", v.secret], ts), true, v.name + " (second secret)");
  expect(verifyFluxora(h, Buffer.from(v.body + " "), [v.secret], ts), false, v.name + " (changed body)");
  expect(verifyFluxora(h, Buffer.from(v.body), ["wrong"], ts), false, v.name + " (wrong secret)");
  expect(verifyFluxora(h, Buffer.from(v.body), [v.secret], ts + 301), false, v.name + " (stale)");
}
for (const v of vectors.standard) {
  const h = {"webhook-id": v.id, "webhook-timestamp": v.timestamp, "webhook-signature": v.signature};
  const ts = Number(v.timestamp);
  expect(verifyStandard(h, Buffer.from(v.body), v.secret, ts), true, v.name);
  if (v.previous_secret) expect(verifyStandard(h, Buffer.from(v.body), v.previous_secret, ts), true, v.name + " (previous)");
  expect(verifyStandard(h, Buffer.from(v.body + " "), v.secret, ts), false, v.name + " (changed body)");
  expect(verifyStandard(h, Buffer.from(v.body), "whsec_d3Jvbmc=", ts), false, v.name + " (wrong secret)");
  expect(verifyStandard(h, Buffer.from(v.body), v.secret, ts - 301), false, v.name + " (stale)");
}
console.log("checked " + n);
`

// pythonVectorCheck is nodeVectorCheck for the Python example.
const pythonVectorCheck = `
import json, sys
vectors = json.load(open(sys.argv[1]))
n = 0
def expect(got, want, what):
    global n
    if got is not want:
        raise SystemExit(f"{what}: got {got}, want {want}")
    n += 1
for v in vectors["fluxora"]:
    h = {"x-fluxora-delivery-id": "evt_1", "x-fluxora-timestamp": v["timestamp"], "x-fluxora-signature": v["signature"]}
    ts, body = int(v["timestamp"]), v["body"].encode()
    expect(verify_fluxora(h, body, [v["secret"]], ts), True, v["name"])
    expect(verify_fluxora(h, body, ["wrong", v["secret"]], ts), True, v["name"] + " (second secret)")
    expect(verify_fluxora(h, body + b" ", [v["secret"]], ts), False, v["name"] + " (changed body)")
    expect(verify_fluxora(h, body, ["wrong"], ts), False, v["name"] + " (wrong secret)")
    expect(verify_fluxora(h, body, [v["secret"]], ts + 301), False, v["name"] + " (stale)")
for v in vectors["standard"]:
    h = {"webhook-id": v["id"], "webhook-timestamp": v["timestamp"], "webhook-signature": v["signature"]}
    ts, body = int(v["timestamp"]), v["body"].encode()
    expect(verify_standard(h, body, v["secret"], ts), True, v["name"])
    if v.get("previous_secret"):
        expect(verify_standard(h, body, v["previous_secret"], ts), True, v["name"] + " (previous)")
    expect(verify_standard(h, body + b" ", v["secret"], ts), False, v["name"] + " (changed body)")
    expect(verify_standard(h, body, "whsec_d3Jvbmc=", ts), False, v["name"] + " (wrong secret)")
    expect(verify_standard(h, body, v["secret"], ts - 301), False, v["name"] + " (stale)")
print(f"checked {n}")
`

// TestDocsWireFormatExamplesVerifyTheVectors runs docs/wire-format.md's Node and Python examples
// against testdata/signatures.json (each skipped when its interpreter is not installed) and
// compiles its Go examples, so that the examples people copy are the ones that work.
func TestDocsWireFormatExamplesVerifyTheVectors(t *testing.T) {
	root := repoRoot(t)
	md := readDoc(t, root, "docs/wire-format.md")
	vectors := filepath.Join(root, "testdata", "signatures.json")
	var parsed map[string]json.RawMessage
	if b, err := os.ReadFile(vectors); err != nil || json.Unmarshal(b, &parsed) != nil {
		t.Fatalf("reading %s: %v", vectors, err)
	}

	run := func(t *testing.T, interpreter, ext, code string) {
		path, err := exec.LookPath(interpreter)
		if err != nil {
			t.Skipf("%s is not installed", interpreter)
		}
		file := filepath.Join(t.TempDir(), "check"+ext)
		if err := os.WriteFile(file, []byte(code), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(path, file, vectors).CombinedOutput()
		if err != nil {
			t.Fatalf("%s example against the vectors: %v\n%s", interpreter, err, out)
		}
		if !bytes.HasPrefix(out, []byte("checked ")) {
			t.Fatalf("%s example printed %q", interpreter, out)
		}
	}
	t.Run("node", func(t *testing.T) {
		js := snippets(md, "js")
		if len(js) == 0 {
			t.Fatal("docs/wire-format.md has no js example")
		}
		run(t, "node", ".js", strings.Join(js, "\n")+nodeVectorCheck)
	})
	t.Run("python", func(t *testing.T) {
		py := snippets(md, "python")
		if len(py) == 0 {
			t.Fatal("docs/wire-format.md has no python example")
		}
		run(t, "python3", ".py", strings.Join(py, "\n")+pythonVectorCheck)
	})
	t.Run("go", func(t *testing.T) {
		programs := slices.DeleteFunc(snippets(md, "go"), func(s string) bool { return !strings.HasPrefix(s, "package main") })
		if len(programs) == 0 {
			t.Fatal("docs/wire-format.md has no complete Go example (package main)")
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			t.Skip("go is not on PATH")
		}
		for i, src := range programs {
			// Inside the module, so that the example compiles against this checkout; a
			// directory starting with "." is ignored by ./... patterns.
			dir, err := os.MkdirTemp(root, ".docs-example-")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(dir)
			file := filepath.Join(dir, "main.go")
			if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(goTool, "vet", file)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("Go example %d of docs/wire-format.md does not build: %v\n%s", i+1, err, out)
			}
		}
	})
}
