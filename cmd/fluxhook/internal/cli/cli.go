package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// ErrUsage marks errors caused by the command line itself: the binary's main turns any error
// that wraps it into exit status 2, wherever the command that returned it lives.
var ErrUsage = errors.New("usage")

// UsageError wraps a command-line problem in ErrUsage, so that it exits with status 2.
func UsageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, strings.TrimSpace(fmt.Sprintf(format, args...)))
}

// NewFlagSet returns a flag set for `fluxhook NAME` that reports to stderr and returns errors
// instead of exiting, so that main can turn them into exit status 2 and tests can call a
// command without a process.
func NewFlagSet(name string, stderr io.Writer, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { PrintHelp(fs, synopsis) }
	return fs
}

// Help is what `fluxhook NAME -h` says besides the synopsis and the flags: one sentence on what
// the command does, and an example to copy. Every command registers one in Helps, so that every
// command's help has the one shape PrintHelp gives it.
type Help struct {
	Sentence string
	Example  string
}

// Helps holds each command's Help by its name as NewFlagSet gets it ("status", "endpoints add").
var Helps = map[string]Help{}

// PrintHelp writes fs's help: the synopsis, the command's sentence, its flags with their
// defaults (and the environment variable each falls back to), and an example.
func PrintHelp(fs *flag.FlagSet, synopsis string) {
	w := fs.Output()
	h := Helps[fs.Name()]
	fmt.Fprintf(w, "usage: %s\n", synopsis)
	if h.Sentence != "" {
		fmt.Fprintf(w, "\n%s\n", h.Sentence)
	}
	fmt.Fprintln(w, "\nflags:")
	fs.PrintDefaults()
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

// ParseFlags parses args and returns the positional arguments. Flags may follow positional
// ones (`dlq replay 7 --force`), which the flag package alone does not allow. -h returns
// flag.ErrHelp after printing the usage: callers return nil for it, since asking for help is
// not a failure. Other errors are usage errors.
func ParseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, UsageError("%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// NoArguments is ParseFlags for commands that take flags only: a stray argument is a usage
// error rather than something silently ignored.
func NoArguments(fs *flag.FlagSet, args []string) error {
	positional, err := ParseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(positional) > 0 {
		return UsageError("unexpected argument %q", positional[0])
	}
	return nil
}

// WriteJSON prints v for scripts: indented, and without encoding/json's HTML escaping, so that
// payloads and URLs read as they are stored.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
