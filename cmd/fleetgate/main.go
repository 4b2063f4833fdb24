// Command fleetgate is the fleetgate edge gateway: one binary with the
// subcommands of docs/design.md §6.1. main only parses the command line and wires
// the packages together; the work is done in them.
//
// Exit codes: 0 success; 1 failure (a part that could not start or failed
// while running, an API error); 2 usage error; 78 (EX_CONFIG) the
// configuration file could not be read or is invalid, or a file it names
// (devices file, certificate, token) does not load; 65 (EX_DATAERR) the
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

// errUsage marks a command-line mistake (exit 2); its message is printed
// with the command's usage.
var errUsage = errors.New("usage")

// exitConfig is the exit code of a configuration that cannot be loaded
// (sysexits.h EX_CONFIG).
const exitConfig = 78

// exitNewerState is the exit code of a state file of a newer format
// (sysexits.h EX_DATAERR).
const exitNewerState = 65

// configError marks an error of configs.Load, or of a file the
// configuration names (exit exitConfig); its message is the loader's own.
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
		{"devices", "devices get ID | list [--state S]: read devices; add|rotate|remove ID: edit the devices file; forget ID: drop from the store", cmdDevices},
		{"gateways", "list every gateway the store has heard: last contact, lost or not", cmdGateways},
		{"events", "events tail [--since D] [--follow]: read presence events", cmdEvents},
		{"watch", "a snapshot of every device, then every change (--cursor-file to resume)", cmdWatch},
		{"simulate", "play a CoAP and MQTT fleet with churn against gateways and check the events they wrote", cmdSimulate},
		{"hash-password", "print the bcrypt hash of a password (prompted on a terminal, else read on stdin), for the devices file", cmdHashPassword},
		{"gen-cert", "write a self-signed certificate and key for the MQTT TLS listener; print its SHA-256 fingerprint", cmdGenCert},
		{"version", "print the version, commit, Go version, build date, store schema and state format", cmdVersion},
		{"completion", "print the shell completion script: completion bash|zsh", cmdCompletion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		usage(stderr)
		return 2
	case args[0] == "-h" || args[0] == "--help" || (args[0] == "help" && len(args) == 1):
		usage(stdout)
		return 0
	case args[0] == "help":
		return dispatch(ctx, append(args[1:], "--help"), stdout, stderr)
	case args[0] == "--version":
		fmt.Fprintf(stdout, "fleetgate %s\n", currentBuild().Version)
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		name := c.name
		if (name == "devices" || name == "events" || name == "completion") && len(args) > 1 && !strings.HasPrefix(args[1], "-") {
			name += " " + args[1] // the verb: "devices get"
		}
		var help *helpError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &help):
			fmt.Fprint(stdout, help.usage)
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "fleetgate %s: %v\nRun 'fleetgate %s --help' for its usage.\n", name, err, name)
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
	fmt.Fprintln(w, "\nRun 'fleetgate <command> --help' for a command's flags; 'fleetgate --version' for the version.")
	fmt.Fprintln(w, "Exit codes: 0 success, 1 failure, 2 usage error, 78 configuration error, 65 state file of a newer release.")
}

// helpError is a command's answer to --help: its usage, which dispatch
// prints on standard output.
type helpError struct{ usage string }

func (e *helpError) Error() string        { return "help requested" }
func (e *helpError) Is(target error) bool { return target == flag.ErrHelp }

// newFlags returns a flag set that reports errors instead of exiting and
// has the -c/--config flag of the commands that read the configuration.
func newFlags(name, synopsis string) (*flag.FlagSet, *string) {
	fs := newBareFlags(name, synopsis)
	cfg := new(string)
	fs.StringVar(cfg, "c", defaultConfigPath, "configuration `FILE`")
	fs.StringVar(cfg, "config", defaultConfigPath, "configuration `FILE`")
	return fs, cfg
}

// newBareFlags is newFlags without -c/--config, for the commands that
// read no configuration (which then refuse -c).
func newBareFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("fleetgate "+name, flag.ContinueOnError)
	// parse reports the errors, once; --help prints the usage.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: fleetgate %s\n", synopsis)
		if hasFlags(fs) {
			fmt.Fprintln(w, "\nflags:")
			printFlags(w, fs)
		}
	}
	return fs
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// printFlags writes the flags of fs, one entry each: "-c, --config FILE"
// (its two names as one), "--addr HOST:PORT" (a long flag with two
// dashes), each with its help and default on the next line.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "c" && fs.Lookup("config") != nil {
			return // listed with --config
		}
		arg, help := flag.UnquoteUsage(f)
		head := "--" + f.Name
		switch {
		case f.Name == "config" && fs.Lookup("c") != nil:
			head = "-c, --config"
		case len(f.Name) == 1:
			head = "-" + f.Name
		}
		if arg != "" {
			head += " " + arg
		}
		fmt.Fprintf(w, "  %s\n    \t%s", head, strings.ReplaceAll(help, "\n", "\n    \t"))
		if d := f.DefValue; d != "" && d != "false" && d != "0" {
			fmt.Fprintf(w, " (default %s)", d)
		}
		fmt.Fprintln(w)
	})
}

// usageOf is the usage fs prints for --help.
func usageOf(fs *flag.FlagSet) string {
	var b strings.Builder
	out := fs.Output()
	fs.SetOutput(&b)
	fs.Usage()
	fs.SetOutput(out)
	return b.String()
}

// parse parses args, turning flag errors into usage errors and --help
// into a *helpError. Flags may come before or after the arguments
// (`devices get dev-1 -c f.yaml`); after "--" everything is an argument.
// fs.Args() are the arguments.
func parse(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return &helpError{usage: usageOf(fs)}
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
