package sqltest

import "net/url"

// withDatabase returns the connection URL u pointing at database name instead.
func withDatabase(u, name string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return u
	}
	parsed.Path = "/" + name
	return parsed.String()
}
