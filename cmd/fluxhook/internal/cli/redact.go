package cli

import (
	"flag"
	"net/url"
	"regexp"
	"strings"
)

// RedactedPassword replaces passwords wherever a URL is shown, the same in every command's
// output, so that an operator recognises a hidden password wherever it appears.
const RedactedPassword = "xxxxx"

// DatabaseURLFlag registers --database-url on fs, defaulting to DATABASE_URL from getenv. Its
// help names the variable, never its value, which may hold a password.
func DatabaseURLFlag(fs *flag.FlagSet, getenv func(string) string) *string {
	v := &URLValue{URL: getenv("DATABASE_URL")}
	fs.Var(v, "database-url", "PostgreSQL connection URL, such as postgres://user@localhost:5432/app")
	Document(fs, "database-url", FlagDoc{Placeholder: "URL", Env: "DATABASE_URL"})
	return &v.URL
}

// URLValue is a string flag for a connection URL whose printed form has its password
// redacted, since its default comes from an environment variable that may hold one.
type URLValue struct {
	// URL is the value as given, password and all: what the command connects with.
	URL string
}

// String is the flag's value as -h shows it: redacted.
func (v *URLValue) String() string {
	if v == nil {
		return ""
	}
	return RedactURL(v.URL)
}

// Set takes the flag's value as given.
func (v *URLValue) Set(s string) error { v.URL = s; return nil }

// passwordError hides a password that a wrapped error might spell out, while errors.Is/As
// still see the original.
type passwordError struct {
	msg string
	err error
}

func (e *passwordError) Error() string { return e.msg }
func (e *passwordError) Unwrap() error { return e.err }

// ScrubPassword returns err with every occurrence of password, and of anything that looks
// like a password in a connection string, replaced: drivers' errors may quote the connection
// string they failed on, and such errors end up on a terminal or in a CI log.
func ScrubPassword(err error, password string) error {
	msg := err.Error()
	if password != "" {
		msg = strings.ReplaceAll(msg, password, RedactedPassword)
	}
	msg = kvPassword.ReplaceAllString(msg, "${1}"+RedactedPassword)
	return &passwordError{msg: msg, err: err}
}

var (
	// kvPassword matches password=... in a keyword/value connection string, quoted or not.
	kvPassword = regexp.MustCompile(`(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)`)
	// queryPassword matches password=... in a URL's query, which pgx also accepts.
	queryPassword = regexp.MustCompile(`(?i)([?&](?:ssl)?password=)[^&#]*`)
)

// RedactURL returns u fit for logs and error messages: the password in the user info, in a
// password= or sslpassword= query parameter, or in a keyword/value connection string is
// replaced by xxxxx. It is used for database URLs and for webhook endpoint URLs alike.
// Malformed URLs are redacted on a best-effort basis that prefers masking too much.
func RedactURL(u string) string {
	scheme, rest, isURL := strings.Cut(u, "://")
	if !isURL {
		return kvPassword.ReplaceAllString(u, "${1}"+RedactedPassword)
	}
	if parsed, err := url.Parse(u); err == nil {
		if parsed.User != nil {
			if _, has := parsed.User.Password(); has {
				parsed.User = url.UserPassword(parsed.User.Username(), RedactedPassword)
			}
		}
		if parsed.RawQuery != "" {
			parsed.RawQuery = redactQuery(parsed.RawQuery)
		}
		return parsed.String()
	}
	// Unparseable, for example a password with an unescaped '/' or '#': mask everything
	// between the first ':' of the user info and the last '@'.
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		if colon := strings.Index(rest[:at], ":"); colon >= 0 {
			rest = rest[:colon+1] + RedactedPassword + rest[at:]
		}
	}
	return queryPassword.ReplaceAllString(scheme+"://"+rest, "${1}"+RedactedPassword)
}

// redactQuery masks password parameters in a raw query, keeping the other parameters exactly
// as they were written.
func redactQuery(raw string) string {
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		key, _, _ := strings.Cut(p, "=")
		if k, err := url.QueryUnescape(key); err == nil {
			key = k
		}
		if k := strings.ToLower(key); k == "password" || k == "sslpassword" {
			parts[i] = key + "=" + RedactedPassword
		}
	}
	return strings.Join(parts, "&")
}
