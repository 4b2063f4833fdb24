package redisstore

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// Dial's store owns the client it dialled (the standalone server is
// found by INFO cluster): it writes through it, and Close closes it.
func TestDialOwnsItsClient(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	s, err := Dial(ctx, DialConfig{Addrs: []string{srv.Addr}, Options: Options{Prefix: uniquePrefix(), Shards: 1}})
	if err != nil {
		t.Fatal(err)
	}
	b := batch("gw-a", 1, write("dev-1", "s", gateway.Connect, 0))
	if _, err := s.Apply(ctx, 0, b); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := s.Apply(ctx, 0, b); err == nil {
		t.Fatal("apply after Close succeeded: the client is still open")
	}
}

// With Background, a Redis that does not answer at start (stopped with
// SIGSTOP) costs one FirstAttempt: the store answers
// gateway.ErrUnavailable until its background retry opens it once Redis
// answers; a shard count that does not match the store's goes to OnFatal
// then, and is final without Background.
func TestDialInTheBackground(t *testing.T) {
	srv := redistest.Start(t)
	ctx := t.Context()
	prefix := uniquePrefix()
	first, err := Dial(ctx, DialConfig{Addrs: []string{srv.Addr}, Options: Options{Prefix: prefix, Shards: 2}})
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	srv.Signal(syscall.SIGSTOP)
	resumed := false
	defer func() {
		if !resumed {
			srv.Signal(syscall.SIGCONT)
		}
	}()

	cfg := DialConfig{Addrs: []string{srv.Addr}, Options: Options{Prefix: prefix, Shards: 2},
		Background: true, FirstAttempt: 200 * time.Millisecond, RetryMax: 200 * time.Millisecond}
	start := time.Now()
	s, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("background dial: %v", err)
	}
	defer s.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("background dial took %v with Redis down", took)
	}
	b := batch("gw-a", 1, write("dev-1", "s", gateway.Connect, 0))
	if _, err := s.Apply(ctx, 0, b); !errors.Is(err, gateway.ErrUnavailable) {
		t.Fatalf("apply before Redis is up: %v, want ErrUnavailable", err)
	}
	fatal := make(chan error, 1)
	mismatched := cfg
	mismatched.Options.Shards = 4
	mismatched.OnFatal = func(err error) { fatal <- err }
	other, err := Dial(ctx, mismatched)
	if err != nil {
		t.Fatalf("background dial, 4 shards: %v", err)
	}
	defer other.Close()

	srv.Signal(syscall.SIGCONT)
	resumed = true
	waitFor(t, 10*time.Second, "the background open", func() bool {
		_, err := s.Apply(ctx, 0, b)
		return err == nil
	})
	select {
	case err := <-fatal:
		if !errors.Is(err, gateway.ErrShardMismatch) {
			t.Fatalf("OnFatal: %v, want ErrShardMismatch", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the 4-shard store did not report the mismatch")
	}
	mismatched.Background = false
	if _, err := Dial(ctx, mismatched); !errors.Is(err, gateway.ErrShardMismatch) {
		t.Fatalf("dial, 4 shards: %v, want ErrShardMismatch", err)
	}
}
