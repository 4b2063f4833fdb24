package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/runner"
)

// cmdRunner runs only the expiry runner, against the Redis store (the
// embedded store lives in a gateway's locked state file, whose own runner
// does the work). Several runner processes share the shards.
func cmdRunner(ctx context.Context, args []string, _, stderr io.Writer) (err error) {
	fs, path := newFlags("runner", "runner [-c FILE] [--owner NAME]", stderr)
	owner := fs.String("owner", "", "lock owner name (default: <gateway.id>/runner/<pid>)")
	cfg, err := parseAndLoad(fs, args, path)
	if err != nil {
		return err
	}
	if cfg.Store.Backend != configs.BackendRedis {
		return fmt.Errorf("store.backend is %q: the runner command works on the redis store only (with the embedded store, `fleetgate run` runs the runner itself)", cfg.Store.Backend)
	}
	log, _ := newLogger(cfg.Log, stderr)
	if *owner == "" {
		*owner = fmt.Sprintf("%s/runner/%d", cfg.Gateway.ID, os.Getpid())
	}
	log = log.With("gateway", cfg.Gateway.ID, "owner", *owner)
	store, err := openStore(ctx, cfg, nil, log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, store.Close()) }()
	r := runner.New(store, runner.Options{
		Owner: *owner, Interval: cfg.Runner.Interval.Std(), Batch: cfg.Runner.Batch,
		LockTTL: cfg.Runner.LockTTL.Std(), Clock: gateway.SystemClock{}, Logger: log,
	})
	return r.Run(ctx)
}
