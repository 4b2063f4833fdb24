// Command fleetgate is the fleetgate edge gateway: one binary with the
// subcommands of docs/design.md §6.1. main only parses the command line and wires
// the packages together; the work is done in them.
//
// Exit codes: 0 success; 1 failure (a part that could not start or failed
// while running, an API error); 2 usage error; 78 (EX_CONFIG) the
// configuration file could not be read or is invalid; 65 (EX_DATAERR) the
// state file was written by a newer release (a downgrade). systemd's unit
// lists 78 and 65 in RestartPreventExitStatus=: restarting cannot fix them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/internal/statefile"
)

// version is set by the linker (-X main.version=...).
var version = "dev"

// errUsage marks a command-line mistake (exit 2); its message is printed
// with the command's usage.
var errUsage = errors.New("usage")

// exitConfig is the exit code of a configuration that cannot be loaded
// (sysexits.h EX_CONFIG).
const exitConfig = 78

// exitNewerState is the exit code of a state file of a newer format
// (sysexits.h EX_DATAERR).
const exitNewerState = 65

// configError marks an error of configs.Load (exit exitConfig); its
// message is the loader's own.
type configError struct{ err error }

func (e configError) Error() string { return e.err.Error() }
func (e configError) Unwrap() error { return e.err }

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"run", "run the gateway (front ends, uplink, runner, admin API)", cmdRun},
		{"check-config", "validate a configuration and print it with the derived bounds", cmdCheckConfig},
		{"runner", "run only the expiry runner against the Redis store", cmdRunner},
		{"status", "show the running gateway's status", cmdStatus},
		{"devices", "devices get ID | devices list [--state S]: read devices", cmdDevices},
		{"events", "events tail [--since D] [--follow]: read presence events", cmdEvents},
		{"watch", "a snapshot of every device, then every change (--cursor-file to resume)", cmdWatch},
		{"simulate", "play a CoAP and MQTT fleet with churn against gateways and check the events they wrote", cmdSimulate},
		{"hash-password", "print the bcrypt hash of the password on stdin, for the devices file", cmdHashPassword},
		{"version", "print the version", cmdVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		name := c.name
		if (name == "devices" || name == "events") && len(args) > 1 && !strings.HasPrefix(args[1], "-") {
			name += " " + args[1] // the verb: "devices get"
		}
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "fleetgate %s: %v\n", name, err)
			return 2
		case errors.As(err, new(configError)):
			fmt.Fprintf(stderr, "fleetgate %s: %v\n", c.name, err)
			return exitConfig
		case errors.Is(err, statefile.ErrNewerFormat):
			fmt.Fprintf(stderr, "fleetgate %s: %v\n", c.name, err)
			return exitNewerState
		default:
			fmt.Fprintf(stderr, "fleetgate %s: %v\n", name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "fleetgate: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: fleetgate <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'fleetgate <command> --help' for a command's flags.")
	fmt.Fprintln(w, "Exit codes: 0 success, 1 failure, 2 usage error, 78 configuration error, 65 state file of a newer release.")
}

// newFlags returns a flag set that reports errors instead of exiting and
// has the -c/--config flag every command shares.
func newFlags(name, synopsis string, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("fleetgate "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := new(string)
	fs.StringVar(cfg, "c", defaultConfigPath, "configuration file")
	fs.StringVar(cfg, "config", defaultConfigPath, "configuration file")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: fleetgate %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs, cfg
}

// parse parses args, turning flag errors into usage errors. Flags may
// come before or after the arguments (`devices get dev-1 -c f.yaml`);
// after "--" everything is an argument. fs.Args() are the arguments.
func parse(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	// Leave the arguments in fs.Args(), parsing no flag among them.
	return fs.Parse(append([]string{"--"}, pos...))
}

func cmdVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleetgate version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := parse(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fleetgate %s\n", version)
	return nil
}

// parseAndLoad parses a command's flags (no arguments allowed) and loads
// the configuration file they name, with the FLEETGATE_ environment.
func parseAndLoad(fs *flag.FlagSet, args []string, path *string) (configs.Config, error) {
	if err := parse(fs, args); err != nil {
		return configs.Config{}, err
	}
	if err := noArgs(fs); err != nil {
		return configs.Config{}, err
	}
	cfg, err := configs.Load(*path, os.Environ())
	if err != nil {
		return cfg, configError{err}
	}
	return cfg, nil
}

func noArgs(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments: %s", errUsage, strings.Join(fs.Args(), " "))
	}
	return nil
}
