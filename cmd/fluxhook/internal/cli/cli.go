package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
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
			return nil, flagError(fs, err)
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

// flagError is the flag package's refusal in the words of fluxhook's help, which writes flags
// with two dashes: "-bogus" reads as a different flag from the --bogus typed, and an unknown
// flag gets the nearest one suggested, as an unknown command does.
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		msg = "unknown flag --" + name
		if near := Nearest(name, names); near != "" {
			msg += "; did you mean --" + near + "?"
		}
		return UsageError("%s", msg)
	}
	if m := parseError.FindStringSubmatch(msg); m != nil {
		// The flag package says only "parse error" of a number or a duration it cannot read.
		want := "a value of the right kind"
		if f := fs.Lookup(m[2]); f != nil {
			switch doc, _ := docOf(f); doc.Placeholder {
			case "N":
				want = "a whole number"
			case "NUMBER":
				want = "a number, such as 0.5"
			case "DURATION":
				want = "a duration, such as 30s, 5m or 2h"
			case "":
				want = "true or false"
			}
		}
		return UsageError("--%s %q: want %s", m[2], m[1], want)
	}
	return UsageError("%s", singleDashFlag.ReplaceAllString(msg, "$1--$2"))
}

// parseError is the flag package's refusal of a value its own types cannot parse.
var parseError = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([a-z0-9-]+): parse error$`)

// singleDashFlag is a flag as the flag package names it in its errors: "-name".
var singleDashFlag = regexp.MustCompile(`(^|[\s:])-([a-z][a-z0-9-]*)`)
