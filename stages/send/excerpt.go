package send

import (
	"bytes"
	"strings"
	"unicode/utf8"
)

// excerptOf returns b, the start of a response body read up to limit bytes, as text that
// PostgreSQL stores in any UTF-8 database: invalid UTF-8 replaced by U+FFFD (one per run of
// invalid bytes, as strings.ToValidUTF8 does), NUL removed (text refuses it), at most limit
// bytes. A body that filled b may have been cut inside a character: the incomplete character
// at its end is dropped rather than replaced, since it is not the consumer's error. A body
// that is already valid text, the common case, costs one allocation: the string.
func excerptOf(b []byte, limit int) string {
	if len(b) >= limit {
		b = b[:limit]
		// Drop a character the limit cut: look back at most utf8.UTFMax-1 bytes for the
		// start of the last character.
		for i := len(b) - 1; i >= 0 && i >= len(b)-(utf8.UTFMax-1); i-- {
			if utf8.RuneStart(b[i]) {
				if !utf8.FullRune(b[i:]) {
					b = b[:i]
				}
				break
			}
		}
	}
	if utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 {
		return string(b)
	}
	s := strings.ReplaceAll(strings.ToValidUTF8(string(b), "\uFFFD"), "\x00", "")
	if len(s) <= limit {
		return s
	}
	// Each replacement character is 3 bytes where the byte it replaced was 1: cut at the last
	// character boundary within the limit.
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
