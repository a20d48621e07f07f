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

// ParseFlags parses args and returns the positional arguments. Flags may follow positional
// ones (`dlq replay 7 --force`), which the flag package alone does not allow. -h returns
// flag.ErrHelp after printing the help to standard output: callers return nil for it, since
// asking for help is not a failure. Other errors are usage errors, after the help is printed
// to standard error.
func ParseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			asked := errors.Is(err, flag.ErrHelp)
			printHelp(fs, asked)
			if asked {
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
