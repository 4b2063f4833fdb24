package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
)

// The renderers turn the admin API's answers into what a person reads.
// They are pure: the time (now) and the time zone (loc) are given, so the
// golden-file tests pin their output.

// statusOrder is the order of the status summary's first lines; other
// keys follow sorted.
var statusOrder = []string{"gateway", "epoch", "version", "started_at", "store", "shards", "sessions"}

// renderStatus prints /v1/status (decoded with UseNumber): scalars as
// "key  value" lines, nested objects as indented sections, times as
// times with their age, "_ns" fields as durations, lists of objects as
// one block each.
func renderStatus(w io.Writer, st map[string]any, now time.Time, loc *time.Location) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	writeObject(tw, "", st, statusOrder, now, loc)
	return tw.Flush()
}

func writeObject(tw io.Writer, indent string, m map[string]any, order []string, now time.Time, loc *time.Location) {
	keys := orderedKeys(m, order)
	var nested []string
	for _, k := range keys {
		switch v := m[k].(type) {
		case map[string]any:
			nested = append(nested, k)
		case []any:
			if len(v) > 0 && !allScalars(v) {
				nested = append(nested, k)
				continue
			}
			fmt.Fprintf(tw, "%s%s\t%s\n", indent, label(k), fmtValue(k, v, now, loc))
		default:
			fmt.Fprintf(tw, "%s%s\t%s\n", indent, label(k), fmtValue(k, v, now, loc))
		}
	}
	for _, k := range nested {
		switch v := m[k].(type) {
		case map[string]any:
			fmt.Fprintf(tw, "%s%s\n", indent, label(k))
			writeObject(tw, indent+"  ", v, nil, now, loc)
		case []any:
			for i, e := range v {
				fmt.Fprintf(tw, "%s%s[%d]\n", indent, label(k), i)
				if o, ok := e.(map[string]any); ok {
					writeObject(tw, indent+"  ", o, []string{"name", "id"}, now, loc)
				} else {
					fmt.Fprintf(tw, "%s  %s\n", indent, fmtValue("", e, now, loc))
				}
			}
		}
	}
}

// orderedKeys is order's keys present in m, then the others sorted.
func orderedKeys(m map[string]any, order []string) []string {
	var out []string
	for _, k := range order {
		if _, ok := m[k]; ok {
			out = append(out, k)
		}
	}
	for _, k := range sortedKeys(m) {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

func allScalars(v []any) bool {
	for _, e := range v {
		switch e.(type) {
		case map[string]any, []any:
			return false
		}
	}
	return true
}

// label is the key as shown: "_ns" fields show as durations, so the unit
// suffix goes.
func label(k string) string { return strings.TrimSuffix(k, "_ns") }

// fmtValue renders one JSON value (numbers as json.Number).
func fmtValue(key string, v any, now time.Time, loc *time.Location) string {
	switch v := v.(type) {
	case nil:
		return "-"
	case json.Number:
		if strings.HasSuffix(key, "_ns") {
			ns, err := v.Int64()
			if err != nil {
				return v.String()
			}
			d := time.Duration(ns)
			if strings.Contains(key, "age") {
				if d <= 0 {
					return "-"
				}
				return fmtAge(d) + " ago"
			}
			return d.String()
		}
		return fmtNumber(v)
	case float64:
		return fmtNumber(json.Number(strconv.FormatFloat(v, 'f', -1, 64)))
	case string:
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return fmtTimeAgo(t, now, loc)
		}
		if v == "" {
			return "-"
		}
		return v
	case bool:
		return strconv.FormatBool(v)
	case []any:
		if len(v) == 0 {
			return "none"
		}
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = fmtValue("", e, now, loc)
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprint(v)
}

// fmtNumber prints an integer as an integer, whatever its size, and
// other numbers as they came.
func fmtNumber(n json.Number) string {
	if i, err := n.Int64(); err == nil {
		return strconv.FormatInt(i, 10)
	}
	if f, err := n.Float64(); err == nil && f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10)
	}
	return n.String()
}

// fmtAge rounds an age to what a person reads: ms under a second, whole
// seconds under an hour, whole minutes above ("2h", "1h4m", "2m", "3s").
func fmtAge(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		d = d.Round(time.Second)
	default:
		d = d.Round(time.Minute)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// fmtTimeAgo is t in loc with how long ago (or in how long) it is.
func fmtTimeAgo(t, now time.Time, loc *time.Location) string {
	if t.IsZero() {
		return "-"
	}
	s := fmtTime(t, loc)
	switch d := now.Sub(t); {
	case d >= 0:
		return s + " (" + fmtAge(d) + " ago)"
	default:
		return s + " (in " + fmtAge(-d) + ")"
	}
}

func fmtTime(t time.Time, loc *time.Location) string {
	if t.IsZero() {
		return "-"
	}
	return t.In(loc).Format("2006-01-02T15:04:05.000Z07:00")
}

// renderDevice prints one device.
func renderDevice(w io.Writer, d admin.Device, now time.Time, loc *time.Location) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "device\t%s\n", d.Device)
	fmt.Fprintf(tw, "state\t%s since %s\n", d.State, fmtTimeAgo(d.Since, now, loc))
	fmt.Fprintf(tw, "ver\t%d\n", d.Ver)
	fmt.Fprintf(tw, "deadline\t%s\n", fmtTimeAgo(d.Deadline, now, loc))
	fmt.Fprintf(tw, "last gateway\t%s\n", orDash(d.Gateway))
	fmt.Fprintf(tw, "last session\t%s\n", orDash(string(d.Session)))
	if len(d.Sessions) == 0 {
		fmt.Fprintf(tw, "sessions\tnone\n")
	}
	for _, s := range d.Sessions {
		fmt.Fprintf(tw, "session %s\tgateway %s, epoch %d, deadline %s\n", s.ID, s.Gateway, s.Epoch, fmtTimeAgo(s.Deadline, now, loc))
	}
	if r := d.LastRefusal; r != nil {
		fmt.Fprintf(tw, "last refused\t%s\n", fmtRefusal(*r, now, loc))
	}
	return tw.Flush()
}

// fmtRefusal says when, over what, why and from where a device was
// refused: "2025-03-01 12:00:00 (5s ago) over mqtt: bad_credentials
// (wrong password) from 127.0.0.1:40000".
func fmtRefusal(r gateway.Refusal, now time.Time, loc *time.Location) string {
	s := fmt.Sprintf("%s over %s: %s", fmtTimeAgo(r.At, now, loc), r.Protocol, r.Reason)
	if r.Detail != "" {
		s += " (" + r.Detail + ")"
	}
	if r.Remote != "" {
		s += " from " + r.Remote
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// renderDeviceList prints one page of devices, then the counts per state
// of the page and how to get the next one.
func renderDeviceList(w io.Writer, p admin.DevicePage, next string, now time.Time, loc *time.Location) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tSTATE\tVER\tSESSIONS\tDEADLINE\tSINCE")
	counts := map[gateway.State]int{}
	for _, d := range p.Devices {
		counts[d.State]++
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", d.Device, d.State, d.Ver, len(d.Sessions), fmtRelative(d.Deadline, now), fmtRelative(d.Since, now))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	noun := "devices"
	if len(p.Devices) == 1 {
		noun = "device"
	}
	fmt.Fprintf(w, "%d %s: %d online, %d suspect, %d offline\n", len(p.Devices), noun, counts[gateway.Online], counts[gateway.Suspect], counts[gateway.Offline])
	if p.Next != "" {
		fmt.Fprintf(w, "more: %s --cursor %s\n", next, p.Next)
	}
	return nil
}

// renderGateways prints /v1/gateways: one line per gateway, the sessions
// the store holds of it, its last contact as an age on the store's clock
// (l.Now), and the totals.
func renderGateways(w io.Writer, l admin.GatewayList) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GATEWAY	STATE	EPOCH	SESSIONS	LAST CONTACT")
	lost := 0
	for _, g := range l.Gateways {
		state := "heard"
		switch {
		case g.Lost:
			state = "lost"
			lost++
		case g.Behind:
			state = "heard, behind"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", g.ID, state, g.Epoch, g.Sessions, fmtRelative(g.Contact, l.Now))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	noun := "gateways"
	if len(l.Gateways) == 1 {
		noun = "gateway"
	}
	fmt.Fprintf(w, "%d %s: %d lost\n", len(l.Gateways), noun, lost)
	return nil
}

// fmtRelative is a time as "3s ago" or "in 87s" ("-" when zero).
func fmtRelative(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	if d := now.Sub(t); d >= 0 {
		return fmtAge(d) + " ago"
	} else {
		return "in " + fmtAge(-d)
	}
}

// ANSI colours of the states on a terminal.
const (
	ansiGreen  = "\x1b[32m"
	ansiRed    = "\x1b[31m"
	ansiYellow = "\x1b[33m"
	ansiReset  = "\x1b[0m"
)

// fmtEvent is one line of events tail; color paints the state.
func fmtEvent(e gateway.Event, loc *time.Location, color bool) string {
	return fmtEnvelope(gateway.EnvelopeOf(e), loc, color)
}

// fmtEnvelope is fmtEvent of an event as the watch API sends it.
func fmtEnvelope(e gateway.Envelope, loc *time.Location, color bool) string {
	if e.Device == "" {
		// a gateway event
		state := fmt.Sprintf("%-7s", e.State)
		if color && e.State == gateway.Lost {
			state = ansiRed + state + ansiReset
		}
		return fmt.Sprintf("%s  %s gateway %s ver=%d contact=%s", fmtTime(e.At, loc), state, e.Gateway, e.Ver, fmtTime(e.Contact, loc))
	}
	state := fmt.Sprintf("%-7s", e.State)
	if color {
		c := ansiYellow
		switch e.State {
		case gateway.Online:
			c = ansiGreen
		case gateway.Offline:
			c = ansiRed
		}
		state = c + state + ansiReset
	}
	line := fmt.Sprintf("%s  %s %s ver=%d reason=%s gw=%s session=%s", fmtTime(e.At, loc), state, e.Device, e.Ver, e.Reason, e.Gateway, e.Session)
	if !e.Deadline.IsZero() {
		line += fmt.Sprintf(" lag=%s", e.At.Sub(e.Deadline))
	}
	return line
}
