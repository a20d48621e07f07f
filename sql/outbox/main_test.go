package outbox_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	fluxsql "github.com/fluxora/fluxhook/sql"
	"github.com/fluxora/fluxhook/sql/sqltest"
)

// TestMain gives the package's examples a database, since an Example has no *testing.T for
// sqltest.New: one migrated database with the example's orders table, named by DATABASE_URL
// as a producer's own program would find it. It also fails the package if anything leaves a
// goroutine behind.
func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	db, drop, err := sqltest.Create(ctx)
	if err == nil {
		if _, err = fluxsql.Migrate(ctx, db.Pool); err == nil {
			_, err = db.Pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, total_cents bigint NOT NULL, state text NOT NULL)`)
		}
	}
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox tests: setting up the examples' database:", err)
		if drop != nil {
			_ = drop()
		}
		os.Exit(1)
	}
	code := 1
	if err := os.Setenv("DATABASE_URL", db.URL); err != nil {
		fmt.Fprintln(os.Stderr, "outbox tests:", err)
	} else {
		code = m.Run()
	}
	if err := drop(); err != nil {
		fmt.Fprintln(os.Stderr, "outbox tests:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "outbox tests: leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}
