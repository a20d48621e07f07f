package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// errPooler explains what a pooler in transaction or statement mode breaks: the settings
// fluxhook sets when a pool connection opens (SessionParams) hold for the session, and the
// statements are prepared per session; LISTEN needs a session for the dispatcher's life.
const errPooler = "DATABASE_URL's connections do not keep session state, as through a pooler in " +
	"transaction or statement mode (PgBouncer's pool_mode = transaction): fluxhook's pool needs " +
	"session-level settings and prepared statements. Connect directly, or through a session-mode " +
	"pool; DATABASE_LISTEN_URL can give the listener its own direct connection"

// checkSession verifies that the pool's connections carry the session settings SessionParams
// asked for, and names a pooler as the likely cause when they do not (or when connecting
// failed the way PgBouncer refuses unknown startup parameters).
func checkSession(ctx context.Context, pool *pgxpool.Pool) error {
	var setting string
	err := pool.QueryRow(ctx, `SELECT coalesce(current_setting('fluxhook.dispatcher', true), '')`).Scan(&setting)
	if err != nil {
		return poolerHint(fmt.Errorf("connecting to the database: %w", err))
	}
	if setting != "on" {
		return fmt.Errorf("%s (the session setting fluxhook.dispatcher is %q, want \"on\")", errPooler, setting)
	}
	return nil
}

// poolerHint adds the pooler explanation to err when err is PgBouncer's refusal of a startup
// parameter (it refuses those it does not know unless told to ignore them).
func poolerHint(err error) error {
	if err != nil && strings.Contains(err.Error(), "unsupported startup parameter") {
		return errors.Join(err, errors.New(errPooler))
	}
	return err
}
