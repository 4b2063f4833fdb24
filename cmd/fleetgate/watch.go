package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ctxsleep"
)

// redrawEvery bounds how often the terminal table is redrawn.
const redrawEvery = 200 * time.Millisecond

// tableRows is how many recently changed devices the table shows.
const tableRows = 20

// cmdWatch prints a snapshot of every device, then every change
// (/v1/snapshot then /v1/watch, docs/events.md). On a terminal it shows
// a table updated in place; piped (or with --json), JSON lines: the
// snapshot's devices (reason "snapshot"), then the events, each with
// its cursor. With --cursor-file it resumes after the cursor saved there
// (and saves each one it passes), so a restart of the gateway or of
// itself loses nothing; a cursor the gateway can no longer serve (410)
// starts over with a new snapshot.
func cmdWatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	q := newQueryFlags("watch", "watch [-c FILE] [--addr HOST:PORT] [--json] [--cursor-file FILE]")
	cursorFile := q.fs.String("cursor-file", "", "resume after the cursor saved in `FILE`, and keep it current")
	retry := q.fs.Duration("retry", 2*time.Second, "wait this long before reconnecting after the gateway went away")
	if err := q.parseNoArgs(args); err != nil {
		return err
	}
	c, err := q.client()
	if err != nil {
		return err
	}
	var out watchOutput = &jsonOutput{enc: json.NewEncoder(stdout)}
	if !*q.json && isTerminal(stdout) {
		t := newTableOutput(stdout)
		out = t
		rctx, stopRedraw := context.WithCancel(ctx)
		defer stopRedraw()
		go t.redrawLoop(rctx)
	}
	cursor := ""
	if *cursorFile != "" {
		b, err := os.ReadFile(*cursorFile)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cursor file: %w", err)
		}
		cursor = strings.TrimSpace(string(b))
	}
	save := func(string) error { return nil }
	if *cursorFile != "" {
		save = func(cur string) error { return writeFileAtomic(*cursorFile, []byte(cur+"\n")) }
	}
	// a table needs the snapshot even when resuming
	needSnapshot := cursor == "" || out.wantsSnapshot()
	for ctx.Err() == nil {
		if needSnapshot {
			snapCursor, err := c.SnapshotAll(ctx, out.device)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if final(err) {
					return explain(err)
				}
				fmt.Fprintf(stderr, "fleetgate watch: %v; retrying in %v\n", err, *retry)
				if !ctxsleep.Sleep(ctx, *retry) {
					return nil
				}
				continue
			}
			if cursor == "" {
				cursor = snapCursor
				if err := save(cursor); err != nil {
					return err
				}
			}
			if err := out.flush(); err != nil {
				return err
			}
			needSnapshot = false
		}
		lastSave := time.Time{}
		err := c.Watch(ctx, cursor, 0, func(e gateway.Envelope) error {
			cursor = e.Cursor
			if err := out.event(e); err != nil {
				return err
			}
			if time.Since(lastSave) > redrawEvery {
				lastSave = time.Now()
				return save(cursor)
			}
			return nil
		})
		if serr := save(cursor); serr != nil {
			return serr
		}
		var re *admin.ErrResync
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case errors.As(err, &re):
			fmt.Fprintf(stderr, "fleetgate watch: cursor no longer served (shard %d: %s); taking a new snapshot\n", re.Shard, re.Reason)
			cursor, needSnapshot = "", true
			out.reset()
		case final(err):
			return explain(err)
		default:
			fmt.Fprintf(stderr, "fleetgate watch: %v; reconnecting in %v\n", err, *retry)
			if !ctxsleep.Sleep(ctx, *retry) {
				return nil
			}
		}
	}
	return nil
}

// final reports whether err is a refusal of the request (a bad cursor,
// a missing or wrong token: admin.Error.Final), which asking again
// cannot mend; watch retries anything else.
func final(err error) bool {
	var ae *admin.Error
	return errors.As(err, &ae) && ae.Final()
}

// tailFollow prints the events after the cursor of /v1/events (one log
// position per shard) as they come, through /v1/watch.
func tailFollow(ctx context.Context, c *admin.Client, eventsCursor string, asJSON, color bool, stdout io.Writer) error {
	parts := strings.Split(eventsCursor, ",")
	for i, p := range parts {
		parts[i] = "@" + p // a position without incarnation: served by ID
	}
	enc := json.NewEncoder(stdout)
	err := c.Watch(ctx, "v1:"+strings.Join(parts, ","), 0, func(e gateway.Envelope) error {
		if asJSON {
			return enc.Encode(e)
		}
		_, err := fmt.Fprintln(stdout, fmtEnvelope(e, time.Local, color))
		return err
	})
	if ctx.Err() != nil {
		return nil
	}
	return explain(err)
}

// watchOutput is where fleetgate watch prints.
type watchOutput interface {
	wantsSnapshot() bool
	device(gateway.Envelope)
	event(gateway.Envelope) error
	flush() error
	reset()
}

// jsonOutput prints JSON lines.
type jsonOutput struct {
	enc *json.Encoder
	err error
}

func (o *jsonOutput) wantsSnapshot() bool { return false }

func (o *jsonOutput) device(e gateway.Envelope) {
	if o.err == nil {
		o.err = o.enc.Encode(e)
	}
}

func (o *jsonOutput) event(e gateway.Envelope) error { return o.enc.Encode(e) }
func (o *jsonOutput) flush() error                   { return o.err }
func (o *jsonOutput) reset()                         {}

// tableOutput keeps every device's state and redraws a summary and the
// most recently changed devices in place, at most every redrawEvery:
// a change that comes sooner is drawn by redrawLoop.
type tableOutput struct {
	mu      sync.Mutex
	w       io.Writer
	devices map[gateway.DeviceID]gateway.Envelope
	// lost are the gateways whose last gateway event was lost
	lost   map[string]bool
	recent []gateway.DeviceID
	events int
	drawn  time.Time
	dirty  bool // changed since drawn
}

func newTableOutput(w io.Writer) *tableOutput {
	return &tableOutput{w: w, devices: map[gateway.DeviceID]gateway.Envelope{}, lost: map[string]bool{}}
}

func (o *tableOutput) wantsSnapshot() bool { return true }

func (o *tableOutput) device(e gateway.Envelope) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.devices[e.Device] = e
	o.dirty = true
}

func (o *tableOutput) event(e gateway.Envelope) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e.Device == "" {
		// a gateway event
		o.lost[e.Gateway] = e.State == gateway.Lost
		o.events++
		o.dirty = true
		return nil
	}
	if e.Ver <= o.devices[e.Device].Ver {
		return nil // already in the snapshot
	}
	o.devices[e.Device] = e
	o.events++
	o.dirty = true
	o.recent = append(slices.DeleteFunc(o.recent, func(d gateway.DeviceID) bool { return d == e.Device }), e.Device)
	if len(o.recent) > tableRows {
		o.recent = o.recent[len(o.recent)-tableRows:]
	}
	if time.Since(o.drawn) < redrawEvery {
		return nil
	}
	return o.draw()
}

func (o *tableOutput) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	clear(o.devices)
	clear(o.lost)
	o.recent = nil
	o.dirty = true
}

func (o *tableOutput) flush() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.draw()
}

// redrawLoop draws the changes event held back (within redrawEvery of
// the last drawing) until ctx ends; a failed write ends it (the next
// event reports it).
func (o *tableOutput) redrawLoop(ctx context.Context) {
	t := time.NewTicker(redrawEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o.mu.Lock()
		var err error
		if o.dirty {
			err = o.draw()
		}
		o.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// draw writes the table; o.mu is held.
func (o *tableOutput) draw() error {
	o.drawn, o.dirty = time.Now(), false
	online, removed := 0, 0
	for _, e := range o.devices {
		switch e.State {
		case gateway.Online:
			online++
		case gateway.Removed:
			removed++ // forgotten: its row stays among the recent ones
		}
	}
	var lost []string
	for gw, l := range o.lost {
		if l {
			lost = append(lost, gw)
		}
	}
	slices.Sort(lost)
	var b strings.Builder
	b.WriteString("\x1b[H\x1b[2J") // home, clear
	fmt.Fprintf(&b, "fleetgate watch  %s  devices %d  online %d  offline %d  events %d\n",
		time.Now().Format("15:04:05"), len(o.devices)-removed, online, len(o.devices)-removed-online, o.events)
	if len(lost) > 0 {
		fmt.Fprintf(&b, "gateways lost: %s\n", strings.Join(lost, ", "))
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "%-32s %-8s %6s  %-10s %-29s %s\n", "DEVICE", "STATE", "VER", "REASON", "AT", "GATEWAY")
	for i := len(o.recent) - 1; i >= 0; i-- {
		e := o.devices[o.recent[i]]
		fmt.Fprintf(&b, "%-32s %-8s %6d  %-10s %-29s %s\n", e.Device, e.State, e.Ver, e.Reason, fmtTime(e.At, time.Local), e.Gateway)
	}
	_, err := io.WriteString(o.w, b.String())
	return err
}

// writeFileAtomic replaces path with data (a temporary file renamed).
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".cursor-*")
	if err != nil {
		return fmt.Errorf("cursor file: %w", err)
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("cursor file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("cursor file: %w", err)
	}
	return nil
}
