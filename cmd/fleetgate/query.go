package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/mattn/go-isatty"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/configs"
	"github.com/fleetgate/fleetgate/gateway"
)

const defaultConfigPath = configs.DefaultPath

// queryFlags are the flags of the commands that ask the admin API.
type queryFlags struct {
	fs        *flag.FlagSet
	config    *string
	addr      *string
	tokenFile *string
	json      *bool
}

func newQueryFlags(name, synopsis string) queryFlags {
	fs, cfg := newFlags(name, synopsis)
	return queryFlags{
		fs:        fs,
		config:    cfg,
		addr:      fs.String("addr", "", "admin API address (default: listen.admin.http of the configuration, else "+configs.Default().Listen.Admin.HTTP+")"),
		tokenFile: fs.String("token-file", "", "`FILE` holding the admin API's bearer token (default: listen.admin.token_file of the configuration)"),
		json:      fs.Bool("json", false, "print the API's JSON instead of a summary"),
	}
}

// set reports whether one of the named flags was given.
func (q queryFlags) set(names ...string) bool {
	found := false
	q.fs.Visit(func(f *flag.Flag) {
		for _, n := range names {
			found = found || f.Name == n
		}
	})
	return found
}

// parseNoArgs parses args, which must hold flags only.
func (q queryFlags) parseNoArgs(args []string) error {
	if err := parse(q.fs, args); err != nil {
		return err
	}
	return noArgs(q.fs)
}

// parseOneID parses args, which must hold flags and one device ID.
func (q queryFlags) parseOneID(args []string) error {
	if err := parse(q.fs, args); err != nil {
		return err
	}
	if q.fs.NArg() != 1 {
		return fmt.Errorf("%w: want exactly one device ID", errUsage)
	}
	return nil
}

// client finds the admin API: --addr; else listen.admin.http of the
// configuration named with -c, or of the default file when it exists;
// else the default admin address. It never opens the gateway's state
// file.
func (q queryFlags) client() (*admin.Client, error) {
	l, err := q.adminListen()
	if err != nil {
		return nil, err
	}
	return adminClient(l)
}

// adminAddr is the admin address client uses.
func (q queryFlags) adminAddr() (string, error) {
	l, err := q.adminListen()
	return l.HTTP, err
}

// adminListen is listen.admin of the configuration client finds (its
// token and TLS too; without a configuration file, the defaults and the
// FLEETGATE_LISTEN_ADMIN_ variables), with the address of --addr and the
// token of --token-file when given.
func (q queryFlags) adminListen() (configs.AdminListen, error) {
	cfg, err := configs.Load(*q.config, os.Environ())
	var l configs.AdminListen
	switch {
	case err == nil:
		l = cfg.Listen.Admin
		if l.HTTP == "" && *q.addr == "" {
			return l, fmt.Errorf("listen.admin.http is empty in %s: the admin API is off; pass --addr", *q.config)
		}
	case !q.set("c", "config") && errors.Is(err, fs.ErrNotExist):
		if cfg, err = configs.Parse("the environment", nil, os.Environ()); err != nil {
			return l, err
		}
		l = cfg.Listen.Admin
	case *q.addr == "" && errors.Is(err, fs.ErrPermission):
		return l, fmt.Errorf("%w: the admin API's address and token are in it; run with sudo (or as a member of the gateway's group), or pass --addr HOST:PORT (and --token-file FILE)", err)
	case *q.addr == "":
		return l, fmt.Errorf("%w (or pass --addr HOST:PORT)", err)
	}
	if *q.addr != "" {
		l.HTTP = *q.addr
	}
	if *q.tokenFile != "" {
		l.TokenFile = *q.tokenFile
	}
	return l, nil
}

// explain turns "nothing answers" into where the command looked and
// what to do, and a refused token into where the token comes from.
func explain(err error) error {
	var ue *admin.UnreachableError
	if errors.As(err, &ue) {
		return fmt.Errorf("no gateway answers at %s; is 'fleetgate run' running? (use --addr or -c)", ue.Addr)
	}
	var ae *admin.Error
	switch {
	case !errors.As(err, &ae) || ae.Code != http.StatusUnauthorized:
		return err
	case ae.Token:
		return fmt.Errorf("the admin API refused the bearer token (401: %s): give the token of the gateway's listen.admin.token_file (--token-file FILE or -c)", ae.Message)
	default:
		return fmt.Errorf("the admin API wants a bearer token (401: %s): give it with --token-file FILE, or -c a configuration whose listen.admin.token_file holds it (or FLEETGATE_LISTEN_ADMIN_TOKEN_FILE)", ae.Message)
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	q := newQueryFlags("status", "status [-c FILE] [--addr HOST:PORT] [--json]")
	if err := q.parseNoArgs(args); err != nil {
		return err
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.Status(ctx, &raw); err != nil {
		return explain(err)
	}
	if *q.json {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return err
		}
		buf.WriteByte('\n')
		_, err := stdout.Write(buf.Bytes())
		return err
	}
	var st map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&st); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return renderStatus(stdout, st, time.Now(), time.Local)
}

func cmdGateways(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	q := newQueryFlags("gateways", "gateways [-c FILE] [--addr HOST:PORT] [--json]")
	if err := q.parseNoArgs(args); err != nil {
		return err
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	l, err := c.Gateways(ctx)
	if err != nil {
		return explain(err)
	}
	if *q.json {
		return printJSON(stdout, l)
	}
	return renderGateways(stdout, l)
}

func cmdDevices(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "get":
			return devicesGet(ctx, args[1:], stdout, stderr)
		case "list":
			return devicesList(ctx, args[1:], stdout, stderr)
		case "add":
			return devicesEdit(ctx, auth.Add, args[1:], stdout, stderr)
		case "rotate":
			return devicesEdit(ctx, auth.Rotate, args[1:], stdout, stderr)
		case "remove":
			return devicesEdit(ctx, auth.Remove, args[1:], stdout, stderr)
		case "forget":
			return devicesForget(ctx, args[1:], stdout, stderr)
		case "-h", "--help":
			return &helpError{usage: "usage: fleetgate devices get [flags] ID | fleetgate devices list [flags] | fleetgate devices add|rotate|remove|forget [flags] ID\n\n" +
				"  get ID      a device's presence and sessions\n" +
				"  list        devices by state\n" +
				"  add ID      add a device to the devices file and reload the gateway\n" +
				"  rotate ID   give a device new secrets and reload (its sessions end)\n" +
				"  remove ID   remove a device from the devices file and reload (its sessions end)\n" +
				"  forget ID   remove a device from the presence store (its last event: removed)\n" +
				"\nRun 'fleetgate devices VERB --help' for a verb's flags.\n"}
		}
	}
	return fmt.Errorf("%w: want 'devices get ID', 'devices list', or 'devices add|rotate|remove|forget ID'", errUsage)
}

func devicesGet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	q := newQueryFlags("devices get", "devices get [-c FILE] [--addr HOST:PORT] [--json] ID")
	if err := q.parseOneID(args); err != nil {
		return err
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	raw, err := c.Device(ctx, q.fs.Arg(0))
	if ae, ok := errors.AsType[*admin.Error](err); ok && ae.LastRefusal != nil {
		// Never seen, but refused: why is the answer.
		return fmt.Errorf("%s; last refused %s", ae.Message, fmtRefusal(*ae.LastRefusal, time.Now(), time.Local))
	}
	if err != nil {
		return explain(err)
	}
	var d admin.Device
	if err := json.Unmarshal(raw, &d); err != nil {
		return err
	}
	if *q.json {
		return printJSON(stdout, d)
	}
	return renderDevice(stdout, d, time.Now(), time.Local)
}

func devicesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	q := newQueryFlags("devices list", "devices list [-c FILE] [--addr HOST:PORT] [--json] [--state S] [--order id|changed] [--prefix P] [--protocol P] [--limit N] [--cursor C | --all]")
	state := q.fs.String("state", "", "only devices in this `STATE`: online, suspect or offline")
	order := q.fs.String("order", "", "by `ORDER`: id (by device ID, the default) or changed (by last change, newest first)")
	prefix := q.fs.String("prefix", "", "only devices whose ID starts with `P` (by ID)")
	protocol := q.fs.String("protocol", "", "only devices whose last session is of `PROTOCOL`: coap, mqtt or an adapter's name")
	limit := q.fs.Int("limit", 100, "devices per page (1 to 1000)")
	cursor := q.fs.String("cursor", "", "start at this page (printed at the end of the previous one)")
	all := q.fs.Bool("all", false, "every page, with the counts per state of the whole fleet")
	if err := q.parseNoArgs(args); err != nil {
		return err
	}
	if *limit < 1 || *limit > 1000 {
		return fmt.Errorf("%w: --limit %d: want 1 to 1000", errUsage, *limit)
	}
	switch gateway.State(*state) {
	case "", gateway.Online, gateway.Suspect, gateway.Offline:
	default:
		return fmt.Errorf("%w: --state %q: want online, suspect or offline", errUsage, *state)
	}
	switch gateway.ListOrder(*order) {
	case "", gateway.OrderID, gateway.OrderChanged:
	default:
		return fmt.Errorf("%w: --order %q: want id or changed", errUsage, *order)
	}
	if *prefix != "" && gateway.ListOrder(*order) == gateway.OrderChanged {
		return fmt.Errorf("%w: --prefix lists by ID, not with --order changed", errUsage)
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	dq := admin.DeviceQuery{State: *state, Order: *order, Prefix: *prefix, Protocol: *protocol, Cursor: *cursor, Limit: *limit}
	p, err := c.Devices(ctx, dq)
	if err != nil {
		return explain(err)
	}
	for page := 0; *all && p.Next != "" && page < maxPages; page++ {
		dq.Cursor, dq.Limit = p.Next, 1000
		more, err := c.Devices(ctx, dq)
		if err != nil {
			return explain(err)
		}
		p.Devices, p.Next = append(p.Devices, more.Devices...), more.Next
	}
	if *q.json {
		return printJSON(stdout, p)
	}
	next := "fleetgate devices list"
	if *q.addr != "" {
		next += " --addr " + *q.addr
	} else if q.set("c", "config") {
		next += " -c " + *q.config
	}
	for _, f := range []struct{ name, v string }{{"state", *state}, {"order", *order}, {"prefix", *prefix}, {"protocol", *protocol}} {
		if f.v != "" {
			next += " --" + f.name + " " + f.v
		}
	}
	if q.set("limit") {
		next += " --limit " + strconv.Itoa(*limit)
	}
	return renderDeviceList(stdout, p, next, time.Now(), time.Local)
}

// maxPages bounds devices list --all (1,000 devices a page).
const maxPages = 100_000

func cmdEvents(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "tail" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return &helpError{usage: "usage: fleetgate events tail [flags]\n\nRun 'fleetgate events tail --help' for its flags.\n"}
		}
		return fmt.Errorf("%w: want 'events tail'", errUsage)
	}
	q := newQueryFlags("events tail", "events tail [-c FILE] [--addr HOST:PORT] [--json] [--since D] [--follow]")
	since := q.fs.Duration("since", 10*time.Minute, "start with the events of this long ago")
	follow := q.fs.Bool("follow", false, "keep printing new events until interrupted")
	if err := q.parseNoArgs(args[1:]); err != nil {
		return err
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	color := colorTerminal(stdout)
	enc := json.NewEncoder(stdout)
	cursor := ""
	for {
		p, err := c.Events(ctx, cursor, *since, 1000)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return explain(err)
		}
		cursor = p.Cursor
		for _, e := range p.Events {
			if *q.json {
				if err := enc.Encode(gateway.EnvelopeOf(e)); err != nil {
					return err
				}
				continue
			}
			if _, err := fmt.Fprintln(stdout, fmtEvent(e, time.Local, color)); err != nil {
				return err
			}
		}
		if len(p.Events) == 1000 {
			continue
		}
		if !*follow {
			return nil
		}
		return tailFollow(ctx, c, cursor, *q.json, color, stdout)
	}
}

// colorTerminal reports whether w is a terminal that takes colours: not
// when piped or redirected, nor with NO_COLOR set (no-color.org).
func colorTerminal(w io.Writer) bool {
	return isTerminal(w) && os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
}

// isTerminal reports whether w is a terminal (a table updated in place,
// a progress line; JSON lines or plain lines when piped).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd())
}
