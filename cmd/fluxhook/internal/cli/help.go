package cli

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// NewFlagSet returns a flag set for `fluxhook NAME` that returns errors instead of exiting, so
// that main can turn them into exit status 2 and tests can call a command without a process.
// Its help (see PrintHelp) goes to stdout when asked for (-h), and to stderr with a usage
// error: ParseFlags decides which, once the flag package has said why it stopped.
func NewFlagSet(name string, stdout, stderr io.Writer, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(&helpOutput{stdout: stdout, stderr: stderr, synopsis: synopsis})
	// The flag package calls Usage for -h and for a bad flag alike; ParseFlags prints the help
	// itself, where it belongs, instead.
	fs.Usage = func() {}
	return fs
}

// helpOutput is a flag set's output: it holds what the flag package writes (its own wording of
// an error, which the error returned repeats) so that nothing reaches a terminal twice.
type helpOutput struct {
	stdout, stderr io.Writer
	synopsis       string
	discarded      bytes.Buffer
}

func (o *helpOutput) Write(p []byte) (int, error) { return o.discarded.Write(p) }

// printHelp writes fs's help to stdout (help asked for) or stderr (a usage error).
func printHelp(fs *flag.FlagSet, asked bool) {
	o, ok := fs.Output().(*helpOutput)
	if !ok {
		return // not made by NewFlagSet: nothing to print the help with
	}
	o.discarded.Reset()
	w := o.stderr
	if asked {
		w = o.stdout
	}
	PrintHelp(w, fs, o.synopsis)
}

// Help is what `fluxhook NAME -h` says besides the synopsis and the flags: one sentence on what
// the command does, the environment variables it obeys that are no flag's, and an example to
// copy. Every command registers one in Helps, so that every command's help has the one shape
// PrintHelp gives it.
type Help struct {
	Sentence string
	// Env lists the variables the command reads that no flag stands for (keys, which a flag
	// would put in the shell history; the network policies serve applies too).
	Env     []EnvVar
	Example string
}

// EnvVar is an environment variable a command obeys without a flag of its own.
type EnvVar struct {
	Name  string
	Usage string
}

// Helps holds each command's Help by its name as NewFlagSet gets it ("status", "endpoints add").
var Helps = map[string]Help{}

// FlagDoc is what a flag's help says besides its usage text: the metadata every flag line is
// written from (see PrintHelp), so that every command's flags read alike.
type FlagDoc struct {
	// Placeholder names the flag's value as synopses do: in capitals (URL, N, DURATION), or
	// the choices themselves (json|console). Empty for a switch (a bool flag).
	Placeholder string
	// Default is what applies when the flag is not given, in the user's words; empty when
	// nothing does.
	Default string
	// Env is the environment variable the flag falls back to; empty when it has none.
	Env string
}

// documented is a flag's value with the FlagDoc its help line is written from.
type documented struct {
	flag.Value
	doc FlagDoc
}

// IsBoolFlag keeps a documented switch a switch for the flag package (--json, not --json=true).
func (d *documented) IsBoolFlag() bool {
	b, ok := d.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Document sets what fs's flag name shows in -h where it cannot be derived from the flag (see
// docOf): the environment variable it falls back to, a default that is no literal value, a
// placeholder that says more than the value's type. A name fs does not define is a programming
// error, and panics.
func Document(fs *flag.FlagSet, name string, doc FlagDoc) {
	f := fs.Lookup(name)
	if f == nil {
		panic("cli.Document: flag --" + name + " is not defined")
	}
	if d, ok := f.Value.(*documented); ok {
		f.Value = d.Value
	}
	f.Value = &documented{Value: f.Value, doc: doc}
}

// docOf is f's FlagDoc and usage text. A flag without Document's metadata gets it from its
// definition: a word in back quotes in the usage is the placeholder (as for the flag
// package), or else the value's type (N, DURATION, NUMBER); the default is the flag's own
// unless it is the type's zero value. A string flag with neither gets VALUE, which the help
// test refuses: every such flag must say what its value is.
func docOf(f *flag.Flag) (FlagDoc, string) {
	kind, usage := flag.UnquoteUsage(f)
	if d, ok := f.Value.(*documented); ok {
		return d.doc, usage
	}
	var doc FlagDoc
	switch {
	case strings.Contains(f.Usage, "`"):
		doc.Placeholder = strings.ToUpper(kind)
	case kind == "int" || kind == "uint":
		doc.Placeholder = "N"
	case kind == "duration":
		doc.Placeholder = "DURATION"
	case kind == "float":
		doc.Placeholder = "NUMBER"
	case kind != "":
		doc.Placeholder = "VALUE"
	}
	switch def := f.DefValue; {
	case def == "" || def == "0" || def == "false" || def == "0s":
	case kind == "duration":
		if d, err := time.ParseDuration(def); err == nil {
			def = ShortDuration(d)
		}
		doc.Default = def
	default:
		doc.Default = def
	}
	return doc, usage
}

// ShortDuration writes d as a person would type it: 24h rather than Go's 24h0m0s.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// WriteFlag writes one flag's help, the one shape of every flag of every command: the flag
// with its placeholder on one line, then what it does, its default and its environment
// variable, each only when it has one:
//
//	--webhook-batch-size N
//	    most rows per claim [default: 100] [env: WEBHOOK_BATCH_SIZE]
func WriteFlag(w io.Writer, name, usage string, doc FlagDoc) {
	line := "  --" + name
	if doc.Placeholder != "" {
		line += " " + doc.Placeholder
	}
	fmt.Fprintf(w, "%s\n      %s", line, usage)
	if doc.Default != "" {
		fmt.Fprintf(w, " [default: %s]", doc.Default)
	}
	if doc.Env != "" {
		fmt.Fprintf(w, " [env: %s]", doc.Env)
	}
	fmt.Fprintln(w)
}

// PrintHelp writes fs's help to w: the synopsis, the command's sentence, its flags (each
// written by WriteFlag), the environment variables it obeys besides, and an example.
func PrintHelp(w io.Writer, fs *flag.FlagSet, synopsis string) {
	h := Helps[fs.Name()]
	fmt.Fprintf(w, "usage: %s\n", synopsis)
	if h.Sentence != "" {
		fmt.Fprintf(w, "\n%s\n", h.Sentence)
	}
	fmt.Fprintln(w, "\nflags:")
	fs.VisitAll(func(f *flag.Flag) {
		doc, usage := docOf(f)
		WriteFlag(w, f.Name, usage, doc)
	})
	if len(h.Env) > 0 {
		fmt.Fprintln(w, "\nenvironment:")
		for _, v := range h.Env {
			fmt.Fprintf(w, "  %s\n      %s\n", v.Name, v.Usage)
		}
	}
	if h.Example != "" {
		fmt.Fprintf(w, "\nexample:\n  %s\n", h.Example)
	}
}

// PrintGroupHelp writes the help of a command that only groups subcommands (`fluxhook dlq -h`)
// in the shape PrintHelp gives every other command, so that a newcomer reads one kind of page:
// a synopsis naming the subcommands (args is what follows them, such as "[ID] [flags]"), the
// group's sentence, each subcommand on one line with its own sentence where a command lists
// its flags, and an example. The sentences come from Helps, as for the subcommands' own pages.
func PrintGroupHelp(w io.Writer, group, args string, subcommands []string) {
	h := Helps[group]
	fmt.Fprintf(w, "usage: fluxhook %s %s %s\n", group, strings.Join(subcommands, "|"), args)
	if h.Sentence != "" {
		fmt.Fprintf(w, "\n%s\n", h.Sentence)
	}
	width := 0
	for _, sub := range subcommands {
		width = max(width, len(sub))
	}
	fmt.Fprintf(w, "\ncommands (fluxhook %s COMMAND -h shows its flags):\n", group)
	for _, sub := range subcommands {
		fmt.Fprintf(w, "  %-*s  %s\n", width, sub, Helps[group+" "+sub].Sentence)
	}
	if h.Example != "" {
		fmt.Fprintf(w, "\nexample:\n  %s\n", h.Example)
	}
}
