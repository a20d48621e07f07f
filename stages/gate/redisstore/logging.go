package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// RouteLogs sends the Redis client library's own log lines (a failed dial while Redis is down,
// a connection pool's troubles) through log instead of the plain text it writes to stderr by
// default, so that with LOG_FORMAT=json every line of the process is JSON and goes through
// the logger's sampling: one fixed message, the library's text in a field. The setting is
// process-wide, as the library's logger is.
func RouteLogs(log *zap.Logger) {
	redis.SetLogger(zapLogging{log: log.WithOptions(zap.AddCallerSkip(2))})
}

// zapLogging adapts a zap.Logger to go-redis's logging interface.
type zapLogging struct{ log *zap.Logger }

// Printf implements go-redis's Logging: the library logs only trouble, hence warn.
func (z zapLogging) Printf(_ context.Context, format string, v ...any) {
	z.log.Warn("redis client", zap.String("detail", fmt.Sprintf(format, v...)))
}
