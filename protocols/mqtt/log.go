package mqtt

import (
	"context"
	"log/slog"
)

// quiet is the handler of mochi's logger: mochi logs every start, every
// client with a short keep-alive and every refused packet at info or
// warning level, which is the front end's debug detail, so records below
// error are passed on at debug level.
type quiet struct{ h slog.Handler }

func demote(l slog.Level) slog.Level {
	if l < slog.LevelError {
		return slog.LevelDebug
	}
	return l
}

func (q quiet) Enabled(ctx context.Context, l slog.Level) bool {
	return q.h.Enabled(ctx, demote(l))
}

func (q quiet) Handle(ctx context.Context, r slog.Record) error {
	r.Level = demote(r.Level)
	return q.h.Handle(ctx, r)
}

func (q quiet) WithAttrs(as []slog.Attr) slog.Handler { return quiet{q.h.WithAttrs(as)} }

func (q quiet) WithGroup(name string) slog.Handler { return quiet{q.h.WithGroup(name)} }
