package send

import (
	"bytes"
	"testing"
	"unicode/utf8"
)

// FuzzExcerptOf: whatever a consumer answers, the excerpt is text PostgreSQL stores (valid
// UTF-8, no NUL) within the limit, and a short answer that is already such text is kept as it is.
func FuzzExcerptOf(f *testing.F) {
	for _, seed := range []string{"", "ok", "ééé", "a\xff\xfeb\x00c", "\xffa\xffb", "\xe2\x82", "日本語のテキスト"} {
		f.Add([]byte(seed), 5)
	}
	f.Fuzz(func(t *testing.T, body []byte, limit int) {
		if limit < 1 || limit > 64 {
			t.Skip()
		}
		head := body[:min(len(body), limit)] // what Send reads
		got := excerptOf(head, limit)
		if !utf8.ValidString(got) || bytes.IndexByte([]byte(got), 0) >= 0 || len(got) > limit {
			t.Fatalf("excerptOf(%q, %d) = %q: want valid UTF-8 without NUL, at most %d bytes", head, limit, got, limit)
		}
		if len(body) < limit && utf8.Valid(body) && bytes.IndexByte(body, 0) < 0 && got != string(body) {
			t.Fatalf("excerptOf(%q, %d) = %q: a short, valid answer must be kept as it is", body, limit, got)
		}
	})
}
