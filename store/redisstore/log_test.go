package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/store/redisstore"
)

// go-redis's lines come out as slog records of the gateway's handler.
func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	l := redisstore.Logger{L: slog.New(slog.NewJSONHandler(&buf, nil))}
	l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", 5, "refused")
	out := buf.String()
	for _, want := range []string{`"level":"WARN"`, `"msg":"redis: connection pool: failed to dial after 5 attempts: refused"`, `"component":"redis"`} {
		if !strings.Contains(out, want) {
			t.Fatalf("%s lacks %s", out, want)
		}
	}
}
