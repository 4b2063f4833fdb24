package redisstore

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// Logger adapts an slog.Logger to go-redis's logging interface, so that
// go-redis's own lines (pool and reconnection notices) go through the
// gateway's log instead of raw stderr. go-redis has one process-wide
// logger: the caller installs it once at start with
// redis.SetLogger(redisstore.Logger{L: log}).
type Logger struct{ L *slog.Logger }

// Printf logs one go-redis line at warn level (go-redis logs only what
// went wrong), marked component=redis.
func (l Logger) Printf(ctx context.Context, format string, v ...any) {
	l.L.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "redis")
}

var _ interface {
	Printf(context.Context, string, ...any)
} = Logger{}

// UseLogger installs l as go-redis's process-wide logger.
func UseLogger(l *slog.Logger) { redis.SetLogger(Logger{L: l}) }
