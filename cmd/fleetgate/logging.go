package main

import (
	"io"
	"log/slog"
	"strings"

	"github.com/fleetgate/fleetgate/configs"
)

// newLogger builds the process logger from log.level and log.format (both
// validated by configs). The level is a LevelVar so SIGHUP can change it.
func newLogger(c configs.LogConfig, w io.Writer) (*slog.Logger, *slog.LevelVar) {
	lv := new(slog.LevelVar)
	setLevel(lv, c.Level)
	opts := &slog.HandlerOptions{Level: lv}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), lv
	}
	return slog.New(slog.NewTextHandler(w, opts)), lv
}

func setLevel(lv *slog.LevelVar, level string) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err == nil {
		lv.Set(l)
	}
}
