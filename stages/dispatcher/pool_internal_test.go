package dispatcher

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPoolSizeHonoursTheURL: pool_max_conns in DATABASE_URL is honoured (it used to be
// overridden silently), one too small to claim and settle at once is refused with a message
// naming it, and without it the pool has DefaultPoolConns.
func TestPoolSizeHonoursTheURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url  string
		want int32
		err  string
	}{
		{"postgres://u@h/db", DefaultPoolConns, ""},
		{"postgres://u@h/db?pool_max_conns=9", 9, ""},
		{"host=h user=u dbname=db pool_max_conns=3", 3, ""},
		{"postgres://u@h/db?pool_max_conns=1", 0, "pool_max_conns=1 is too few"},
	} {
		cfg, err := pgxpool.ParseConfig(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		err = poolSize(cfg, tc.url)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "DATABASE_URL") {
				t.Errorf("%s: error %v, want one naming DATABASE_URL and %q", tc.url, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.url, err)
		case cfg.MaxConns != tc.want:
			t.Errorf("%s: MaxConns %d, want %d", tc.url, cfg.MaxConns, tc.want)
		}
	}
}
