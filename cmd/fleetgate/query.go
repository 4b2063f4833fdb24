package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/configs"
)

const defaultConfigPath = configs.DefaultPath

// queryFlags are the flags of the commands that ask the admin API.
type queryFlags struct {
	fs     *flag.FlagSet
	config *string
	addr   *string
	json   *bool
}

func newQueryFlags(name, synopsis string, stderr io.Writer) queryFlags {
	fs, cfg := newFlags(name, synopsis, stderr)
	return queryFlags{
		fs:     fs,
		config: cfg,
		addr:   fs.String("addr", "", "admin API address (default: listen.admin.http of the configuration)"),
		json:   fs.Bool("json", false, "print JSON instead of a table"),
	}
}

// client finds the admin API: --addr, else the configuration's
// listen.admin.http. It never opens the gateway's state file.
func (q queryFlags) client() (*admin.Client, error) {
	if *q.addr != "" {
		return admin.NewClient(*q.addr), nil
	}
	cfg, err := configs.Load(*q.config, os.Environ())
	if err != nil {
		return nil, err
	}
	if cfg.Listen.Admin.HTTP == "" {
		return nil, fmt.Errorf("listen.admin.http is empty in %s: the admin API is off; pass --addr", *q.config)
	}
	return admin.NewClient(cfg.Listen.Admin.HTTP), nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	q := newQueryFlags("status", "status [-c FILE] [--addr HOST:PORT] [--json]", stderr)
	if err := parse(q.fs, args); err != nil {
		return err
	}
	if err := noArgs(q.fs); err != nil {
		return err
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	var st map[string]any
	if err := c.Status(ctx, &st); err != nil {
		return err
	}
	if *q.json {
		return printJSON(stdout, st)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	for _, k := range []string{"gateway", "epoch", "version", "started_at", "store", "shards", "sessions"} {
		fmt.Fprintf(tw, "%s\t%v\n", k, st[k])
	}
	for _, k := range []string{"uplink", "runner", "bounds"} {
		if m, ok := st[k].(map[string]any); ok {
			for _, kk := range sortedKeys(m) {
				fmt.Fprintf(tw, "%s.%s\t%v\n", k, kk, m[kk])
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printAdapters(stdout, st["adapters"])
}

func cmdDevices(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "get" && args[0] != "list") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(stderr, "usage: fleetgate devices get ID | fleetgate devices list [--state online|suspect|offline]")
			return flag.ErrHelp
		}
		return fmt.Errorf("%w: want 'devices get ID' or 'devices list'", errUsage)
	}
	if args[0] == "get" {
		return devicesGet(ctx, args[1:], stdout, stderr)
	}
	return devicesList(ctx, args[1:], stdout, stderr)
}

func devicesGet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	q := newQueryFlags("devices get", "devices get [-c FILE] [--addr HOST:PORT] [--json] ID", stderr)
	if err := parse(q.fs, args); err != nil {
		return err
	}
	if q.fs.NArg() != 1 {
		return fmt.Errorf("%w: want exactly one device ID", errUsage)
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	raw, err := c.Device(ctx, q.fs.Arg(0))
	if err != nil {
		return err
	}
	var d admin.Device
	if err := json.Unmarshal(raw, &d); err != nil {
		return err
	}
	if *q.json {
		return printJSON(stdout, d)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "device\t%s\nstate\t%s\nver\t%d\nsince\t%s\n", d.Device, d.State, d.Ver, fmtTime(d.Since))
	fmt.Fprintf(tw, "deadline\t%s\nlast gateway\t%s\nlast session\t%s\n", fmtTime(d.Deadline), d.Gateway, d.Session)
	for _, s := range d.Sessions {
		fmt.Fprintf(tw, "session\t%s\tgw %s\tepoch %d\tdeadline %s\n", s.ID, s.Gateway, s.Epoch, fmtTime(s.Deadline))
	}
	return tw.Flush()
}

func devicesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	q := newQueryFlags("devices list", "devices list [-c FILE] [--addr HOST:PORT] [--json] [--state S] [--limit N]", stderr)
	state := q.fs.String("state", "", "only devices in this state: online, suspect or offline")
	limit := q.fs.Int("limit", 1000, "print at most this many devices")
	if err := parse(q.fs, args); err != nil {
		return err
	}
	if err := noArgs(q.fs); err != nil {
		return err
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	var all []admin.Device
	cursor := ""
	for page := 0; page < 100000 && len(all) < *limit; page++ {
		p, err := c.Devices(ctx, *state, cursor, min(1000, *limit-len(all)))
		if err != nil {
			return err
		}
		all = append(all, p.Devices...)
		if cursor = p.Next; cursor == "" {
			break
		}
	}
	if len(all) > *limit {
		all = all[:*limit]
	}
	if *q.json {
		return printJSON(stdout, all)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tSTATE\tVER\tSESSIONS\tDEADLINE\tSINCE")
	for _, d := range all {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", d.Device, d.State, d.Ver, len(d.Sessions), fmtTime(d.Deadline), fmtTime(d.Since))
	}
	return tw.Flush()
}

func cmdEvents(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "tail" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(stderr, "usage: fleetgate events tail [--since 10m] [--follow] [--json]")
			return flag.ErrHelp
		}
		return fmt.Errorf("%w: want 'events tail'", errUsage)
	}
	q := newQueryFlags("events tail", "events tail [-c FILE] [--addr HOST:PORT] [--json] [--since D] [--follow]", stderr)
	since := q.fs.Duration("since", 10*time.Minute, "start with the events of this long ago")
	follow := q.fs.Bool("follow", false, "keep printing new events until interrupted")
	poll := q.fs.Duration("poll", time.Second, "with --follow, how often to ask for new events")
	if err := parse(q.fs, args[1:]); err != nil {
		return err
	}
	if err := noArgs(q.fs); err != nil {
		return err
	}
	if *poll <= 0 {
		return fmt.Errorf("%w: --poll must be > 0", errUsage)
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	cursor := ""
	for {
		p, err := c.Events(ctx, cursor, *since, 1000)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		cursor = p.Cursor
		for _, e := range p.Events {
			if *q.json {
				if err := enc.Encode(e); err != nil {
					return err
				}
				continue
			}
			line := fmt.Sprintf("%s  %-7s %-s ver=%d reason=%s gw=%s session=%s", fmtTime(e.At), e.State, e.Device, e.Ver, e.Reason, e.Gateway, e.Session)
			if !e.Deadline.IsZero() {
				line += fmt.Sprintf(" lag=%s", e.At.Sub(e.Deadline))
			}
			fmt.Fprintln(stdout, line)
		}
		if len(p.Events) == 1000 {
			continue
		}
		if !*follow {
			return nil
		}
		t := time.NewTimer(*poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02T15:04:05.000Z07:00")
}
