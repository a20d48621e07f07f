package sql

import "strings"

// CanonicalUUID accepts a UUID in the 8-4-4-4-12 form that logs and the delivery id header
// print, in either case, and returns it in lower case: the form PostgreSQL prints, so that it
// compares equal to a uuid column's text. Other spellings PostgreSQL would take (braces, no
// hyphens) are refused: nothing prints them, and a bare run of digits must stay a row id. The
// stores check ids with it before a ::uuid cast, so that a malformed id is not found rather
// than a database error.
func CanonicalUUID(s string) (string, bool) {
	if len(s) != 36 {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return "", false
			}
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
		default:
			return "", false
		}
	}
	return strings.ToLower(s), true
}
