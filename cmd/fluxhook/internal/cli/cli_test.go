package cli

import (
	"io"
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		{"postgres://root@127.0.0.1:5432/db?sslmode=disable", "postgres://root@127.0.0.1:5432/db?sslmode=disable"},
		{"postgres://app:hunter2@db.internal:5432/app", "postgres://app:xxxxx@db.internal:5432/app"},
		{"postgresql://app:p%40ss%2Fword@db/app", "postgresql://app:xxxxx@db/app"},
		{"postgres://app@db/app?sslmode=require&password=hunter2", "postgres://app@db/app?sslmode=require&password=xxxxx"},
		{"postgres://app@db/app?sslpassword=hunter2&sslmode=verify-full", "postgres://app@db/app?sslpassword=xxxxx&sslmode=verify-full"},
		{"postgres://app:hun/ter#2@db/app", "postgres://app:xxxxx@db/app"},
		{"host=db user=app password=hunter2 dbname=app", "host=db user=app password=xxxxx dbname=app"},
		{"host=db password='hun ter2' dbname=app", "host=db password=xxxxx dbname=app"},
		{"https://user:hunter2@consumer.example/hook?x=1", "https://user:xxxxx@consumer.example/hook?x=1"},
		{"https://consumer.example/hook", "https://consumer.example/hook"},
		{"", ""},
	}
	for _, tc := range cases {
		got := RedactURL(tc.in)
		if got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "hunter2") || strings.Contains(got, "ter2") {
			t.Errorf("RedactURL(%q) leaks the password: %q", tc.in, got)
		}
	}
}

func TestParseFlagsAllowsFlagsAfterArguments(t *testing.T) {
	t.Parallel()
	fs := NewFlagSet("x", io.Discard, io.Discard, "x")
	force := fs.Bool("force", false, "")
	n := fs.Int("n", 0, "")
	pos, err := ParseFlags(fs, []string{"7", "--force", "8", "-n", "3", "--", "--not-a-flag"})
	if err != nil {
		t.Fatal(err)
	}
	if !*force || *n != 3 || strings.Join(pos, " ") != "7 8 --not-a-flag" {
		t.Errorf("parsed force=%v n=%d positional=%q", *force, *n, pos)
	}
}
