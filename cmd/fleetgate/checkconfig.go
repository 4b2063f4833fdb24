package main

import (
	"context"
	"fmt"
	"io"
)

func cmdCheckConfig(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs, path := newFlags("check-config", "check-config [-c FILE]")
	cfg, err := parseAndLoad(fs, args, path)
	if err != nil {
		return err
	}
	if err := checkFiles(cfg); err != nil {
		return err
	}
	for _, w := range securityWarnings(cfg) {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	out, err := cfg.Redacted().YAML()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "# effective configuration of %s (defaults, file, FLEETGATE_ environment)\n", *path)
	stdout.Write(out)
	fmt.Fprintf(stdout, "\n# derived bounds\n%s", cfg.Bounds())
	return nil
}
