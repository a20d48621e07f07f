// Command fluxhook delivers webhooks from a PostgreSQL outbox.
//
// main is deliberately thin: it picks a subcommand and hands it the arguments, the process's
// standard streams and a context cancelled by the first SIGINT/SIGTERM. Each subcommand lives
// in its own file and registers itself in commands, so the commands can be tested by calling
// run directly, without a process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime/debug"
	"slices"
	"sort"

	"github.com/fluxora/fluxhook/cmd/fluxhook/internal/cli"
)

// command is one `fluxhook NAME` subcommand.
type command struct {
	// summary is the one-line description shown by `fluxhook help`.
	summary string
	// run executes the command. ctx is cancelled by the first SIGINT/SIGTERM; commands that
	// need a second-signal behaviour (serve) install their own handling.
	run func(ctx context.Context, env *environment, args []string) error
}

// environment is what a command may touch of the process, injectable for tests.
type environment struct {
	// stdin is where `--secret -` reads a secret from; nil when there is none.
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// getenv reads configuration variables; tests pass a map.
	getenv func(string) string
	// signals delivers SIGINT/SIGTERM after the first, for commands that escalate on a
	// second signal. Nil in tests that do not send signals.
	signals <-chan os.Signal
}

// commands is filled by each subcommand's file in an init function.
var commands = map[string]command{}

// errUsage marks errors caused by the command line itself; they exit with status 2. It is
// cli's, so that the bench's usage errors exit with 2 too.
var errUsage = cli.ErrUsage

// errInvalidConfig marks a configuration serve refused before claiming anything; it exits
// with status 2 like a usage error, its message naming every bad variable.
var errInvalidConfig = errors.New("invalid configuration")

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		keepSysmonAwake()
		if os.Getenv("GOGC") == "" {
			debug.SetGCPercent(serveGCPercent)
		}
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// serveGCPercent is serve's garbage-collection target unless GOGC is set: the heap may grow to
// five times what is live before a collection, instead of Go's default twice. The dispatcher
// allocates per delivery (requests, headers, outcomes) but keeps little: collections were
// about a tenth of its CPU in the fanout bench. At 400 its CPU per delivery fell from 72-77 to
// 63-65 µs and its peak RSS rose from 30 to 44-47 MB (`GOGC=100` against `GOGC=400 fluxhook
// bench --workload fanout --fanout-events 4000`, three runs each, interleaved). GOGC=100
// restores Go's default where memory is tighter than CPU.
const serveGCPercent = 400

// run is main without the process: it returns the exit status. Standard input is the
// process's, read only by `--secret -`.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return runWithStdin(args, os.Stdin, stdout, stderr, getenv)
}

// runWithStdin is run with standard input given, so that tests can pipe a secret in.
func runWithStdin(args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) > 1 && args[0] == "help" {
		// `fluxhook help serve` is `fluxhook serve -h`, groups' subcommands included
		// (`fluxhook help dlq list`), so that the two can never differ.
		args = append(args[1:len(args):len(args)], "-h")
	}
	if len(args) == 0 {
		usage(stderr) // a usage error, as a group without its subcommand is
		return 2
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "-v" {
		args = append([]string{"version"}, args[1:]...)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "fluxhook: unknown command %q%s\n\n", args[0], didYouMean("fluxhook", args[0], slices.Collect(maps.Keys(commands))))
		usage(stderr)
		return 2
	}
	ctx, signals, stop := notifyContext()
	defer stop()
	env := &environment{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv, signals: signals}
	if err := cmd.run(ctx, env, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // the command printed its flags: asking for help is not a failure
		}
		fmt.Fprintf(stderr, "fluxhook %s: %v\n", args[0], err)
		if errors.Is(err, errUsage) || errors.Is(err, errInvalidConfig) {
			return 2
		}
		return 1
	}
	return 0
}

// usage is the top help. What it says of every command's help is checked by the test that
// walks them (TestEveryCommandsHelpHasOneShape).
func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: fluxhook COMMAND [flags]\n\nDeliver webhooks from a PostgreSQL outbox: signed, retried, and dead-lettered when they cannot be delivered.\n\ncommands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-10s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w, "\nRun `fluxhook help COMMAND` (or `fluxhook COMMAND -h`) for a command's flags. A flag that falls back to an\nenvironment variable says so ([env: NAME]); the others have none.")
}

// usageError wraps a command-line problem so that it exits with status 2.
var usageError = cli.UsageError

// didYouMean is what an unknown command or subcommand name is answered with besides the
// refusal: "; did you mean `PREFIX NAME`?" for the nearest of candidates (cli.Nearest), or ""
// when none is close. One function for every level, so that `fluxhook serv` and `fluxhook dlq
// lst` are answered alike.
func didYouMean(prefix, name string, candidates []string) string {
	near := cli.Nearest(name, candidates)
	if near == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean `%s %s`?", prefix, near)
}
