package adapter

import (
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// levelTrace is hclog's trace level in slog terms (below debug).
const levelTrace = slog.LevelDebug - 4

// slogLogger is an hclog.Logger that writes into a *slog.Logger: it
// carries go-plugin's own messages and the adapter's log lines (which
// go-plugin parses from the adapter's stderr) into the gateway's log,
// under the adapter's name. Named is kept as the "plugin" attribute.
type slogLogger struct {
	l     *slog.Logger
	name  string
	args  []any
	level *slog.LevelVar
}

var _ hclog.Logger = (*slogLogger)(nil)

func newSlogLogger(l *slog.Logger) *slogLogger {
	lv := new(slog.LevelVar)
	lv.Set(levelTrace)
	return &slogLogger{l: l, level: lv}
}

func toSlog(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return levelTrace
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

func (s *slogLogger) Log(level hclog.Level, msg string, args ...any) {
	lv := toSlog(level)
	if lv < s.level.Level() {
		return
	}
	s.l.Log(context.Background(), lv, msg, args...)
}

func (s *slogLogger) Trace(msg string, args ...any) { s.Log(hclog.Trace, msg, args...) }
func (s *slogLogger) Debug(msg string, args ...any) { s.Log(hclog.Debug, msg, args...) }
func (s *slogLogger) Info(msg string, args ...any)  { s.Log(hclog.Info, msg, args...) }
func (s *slogLogger) Warn(msg string, args ...any)  { s.Log(hclog.Warn, msg, args...) }
func (s *slogLogger) Error(msg string, args ...any) { s.Log(hclog.Error, msg, args...) }

func (s *slogLogger) enabled(l slog.Level) bool {
	return l >= s.level.Level() && s.l.Enabled(context.Background(), l)
}

func (s *slogLogger) IsTrace() bool { return s.enabled(levelTrace) }
func (s *slogLogger) IsDebug() bool { return s.enabled(slog.LevelDebug) }
func (s *slogLogger) IsInfo() bool  { return s.enabled(slog.LevelInfo) }
func (s *slogLogger) IsWarn() bool  { return s.enabled(slog.LevelWarn) }
func (s *slogLogger) IsError() bool { return s.enabled(slog.LevelError) }

func (s *slogLogger) ImpliedArgs() []any { return s.args }

func (s *slogLogger) With(args ...any) hclog.Logger {
	c := *s
	c.l = s.l.With(args...)
	c.args = append(append([]any(nil), s.args...), args...)
	return &c
}

func (s *slogLogger) Name() string { return s.name }

func (s *slogLogger) Named(name string) hclog.Logger {
	if s.name != "" {
		name = s.name + "." + name
	}
	return s.ResetNamed(name)
}

func (s *slogLogger) ResetNamed(name string) hclog.Logger {
	c := *s
	c.name = name
	c.l = s.l.With("plugin", name)
	return &c
}

func (s *slogLogger) SetLevel(level hclog.Level) { s.level.Set(toSlog(level)) }

func (s *slogLogger) GetLevel() hclog.Level {
	switch l := s.level.Level(); {
	case l <= levelTrace:
		return hclog.Trace
	case l <= slog.LevelDebug:
		return hclog.Debug
	case l <= slog.LevelInfo:
		return hclog.Info
	case l <= slog.LevelWarn:
		return hclog.Warn
	default:
		return hclog.Error
	}
}

func (s *slogLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(s.StandardWriter(opts), "", 0)
}

func (s *slogLogger) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		s.Info(string(p))
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// lineLogger is an io.Writer that logs each complete line at level: it
// takes what an adapter writes to os.Stdout and os.Stderr after the
// handshake, which go-plugin forwards over its stdio stream.
type lineLogger struct {
	l     *slog.Logger
	level slog.Level
	msg   string
	mu    sync.Mutex
	buf   []byte
}

func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.l.Log(context.Background(), w.level, w.msg, "text", string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 4096 { // a line without end: log what there is
		w.l.Log(context.Background(), w.level, w.msg, "text", string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}
