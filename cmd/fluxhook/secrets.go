package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// This file is how a secret reaches fluxhook without being written on its command line, where
// every local user can read it (ps, /proc/PID/cmdline) and shell history keeps it: from a file
// (--secret-file, --webhook-secret-file, WEBHOOK_SECRET_FILE) or from standard input
// (--secret -). A secret still given as an argument works, with a warning on stderr that never
// includes it.

// maxSecretInput bounds a secret file or standard input: a secret is a line, and reading a
// wrong path (a log, a device) must not fill memory.
const maxSecretInput = 64 << 10

// secretArg resolves the secret of flag --name from its two forms: literal is --name's value
// ("-" reads standard input) and file is --name-file's. Neither set returns "" (the command
// then generates one or reads its default). A literal value is used with a warning. Every
// error is a usage error (exit status 2) naming the flag.
func secretArg(env *environment, name, literal, file string) (string, error) {
	v, err := secretArgValue(env, name, literal, file)
	if err != nil && !errors.Is(err, errUsage) {
		err = usageError("%v", err)
	}
	return v, err
}

func secretArgValue(env *environment, name, literal, file string) (string, error) {
	switch {
	case literal != "" && file != "":
		return "", usageError("--%s and --%s-file both give the secret: pass only one", name, name)
	case file != "":
		return readSecretFile(file, "--"+name+"-file")
	case literal == "-":
		if env.stdin == nil {
			return "", usageError("--%s -: there is no standard input to read the secret from", name)
		}
		return readSecret(env.stdin, "--"+name+" - (standard input)")
	case literal != "":
		warnSecretArgument(env, "--"+name, "--"+name+"-file PATH or --"+name+" - (standard input)")
		return literal, nil
	}
	return "", nil
}

// warnSecretArgument tells the operator that a secret passed as an argument is exposed, and
// what to use instead. It names the flag, never the value.
func warnSecretArgument(env *environment, flagName, instead string) {
	fmt.Fprintf(env.stderr, "warning: %s puts a secret on the command line, where other local users can read it "+
		"(ps, /proc/PID/cmdline) and shell history keeps it; use %s instead\n", flagName, instead)
}

// readSecretFile reads a secret from path; what names where the path came from (a flag or an
// environment variable) for the error.
func readSecretFile(path, what string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			err = pe.Err // the path is named already
		}
		return "", fmt.Errorf("%s %s: cannot read the secret: %w", what, path, err)
	}
	defer f.Close()
	return readSecret(f, fmt.Sprintf("%s %s", what, path))
}

// readSecret reads one secret from r: its content with one trailing newline (LF or CRLF)
// removed, as `echo` and editors leave one. Empty content, more than one line and more than
// maxSecretInput bytes are errors naming what, since each means the wrong file or input.
func readSecret(r io.Reader, what string) (string, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxSecretInput+1))
	if err != nil {
		return "", fmt.Errorf("%s: cannot read the secret: %w", what, err)
	}
	if len(b) > maxSecretInput {
		return "", fmt.Errorf("%s: more than %d bytes, too long for a secret: is it the right file?", what, maxSecretInput)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	switch {
	case len(bytes.TrimSpace(b)) == 0:
		return "", fmt.Errorf("%s: empty: it must hold the secret", what)
	case bytes.ContainsAny(b, "\r\n"):
		return "", fmt.Errorf("%s: more than one line: it must hold the secret alone, on one line", what)
	}
	return string(b), nil
}

// secretSettingValue is the value of a secret setting s (serve's configuration), from, in
// order: --flag or --flag-file, then the variable or VARIABLE_FILE. Giving both forms at one
// level is an error naming them. A secret given as a flag is used with a warning; a URL
// setting is warned about only when it carries a password.
func secretSettingValue(env *environment, s setting, flagValue, flagFile string) (string, error) {
	name := flagName(s.env)
	switch {
	case flagValue != "" && flagFile != "":
		return "", fmt.Errorf("--%s and --%s-file both give %s: pass only one", name, name, s.env)
	case flagFile != "":
		return readSecretFile(flagFile, "--"+name+"-file")
	case flagValue != "":
		if !strings.HasSuffix(s.env, "_URL") || redactURL(flagValue) != flagValue {
			warnSecretArgument(env, "--"+name, "--"+name+"-file PATH or the environment ("+s.env+" or "+s.env+"_FILE)")
		}
		return flagValue, nil
	}
	return secretEnv(env, s.env)
}

// secretEnv is the secret variable name from the environment: name itself, or the content of
// the file that name_FILE points at (as container secrets are mounted). Both set is an error
// naming them; neither is "".
func secretEnv(env *environment, name string) (string, error) {
	value, file := env.getenv(name), env.getenv(name+"_FILE")
	switch {
	case value != "" && file != "":
		return "", fmt.Errorf("%s and %s are both set: unset one", name, name+"_FILE")
	case file != "":
		return readSecretFile(file, name+"_FILE")
	}
	return value, nil
}
