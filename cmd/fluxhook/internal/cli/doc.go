// Package cli is the command-line plumbing that fluxhook's subcommands share with those that
// live outside package main (the benchmark, internal/bench): one definition of what a usage
// error is, so that every command exits with status 2 for one; one flag parser and one help writer, so
// that every command takes flags after its arguments and answers -h in one shape; and one redaction of
// connection strings, so that no command can print a password that another hides.
//
// It is internal to cmd/fluxhook: it has no users beyond the binary's own commands.
package cli
