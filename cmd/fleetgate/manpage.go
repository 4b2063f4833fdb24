package main

import (
	"fmt"
	"strings"
)

// manPage is the manual page fleetgate(1), from the commands' help
// (docs/man/fleetgate.1; `make man` writes it, a test checks it).
func manPage(cmds []cliCommand) string {
	var b strings.Builder
	b.WriteString(`.\" Generated from fleetgate's help by 'make man'; do not edit.
.TH FLEETGATE 1 "" "fleetgate" "User Commands"
.SH NAME
fleetgate \- edge gateway for IoT device fleets: presence over CoAP, MQTT and adapter plugins
.SH SYNOPSIS
.B fleetgate
.I command
[\fIflags\fR] [\fIarguments\fR]
.br
.B fleetgate \-\-help
|
.B \-\-version
.SH DESCRIPTION
One binary: the gateway (\fBrun\fR), its expiry runner, the checks of its
configuration, and the commands that ask a running gateway's admin API.
Flags may come before or after the arguments; \fB\-\-\fR ends them.
\fBfleetgate help\fR \fIcommand\fR and \fIcommand\fR \fB\-\-help\fR print a
command's usage. The full contract is docs/design.md, the operator's guide
docs/operations.md.
.SH COMMANDS
`)
	for _, c := range cmds {
		fmt.Fprintf(&b, ".SS %s\n", roff(c.name()))
		fmt.Fprintf(&b, ".B fleetgate %s\n.PP\n%s.\n", roff(strings.SplitN(c.synopsis, "\n", 2)[0]), roff(c.summary))
		if len(c.flags) > 0 {
			b.WriteString(".PP\n")
		}
		for _, f := range c.flags {
			head := `\fB` + roff(strings.Join(f.names, ", ")) + `\fR`
			if f.arg != "" {
				head += ` \fI` + roff(f.arg) + `\fR`
			}
			fmt.Fprintf(&b, ".TP\n%s\n%s\n", head, roff(f.help))
		}
	}
	b.WriteString(`.SH EXIT STATUS
.TP
.B 0
success (also \-\-help)
.TP
.B 1
failure: a part that could not start or failed while running, an API error
.TP
.B 2
usage error: an unknown command, a bad flag or argument
.TP
.B 65
the state file was written by a newer release
.TP
.B 78
the configuration could not be read or is invalid
.SH FILES
.TP
.I /etc/fleetgate/fleetgate.yaml
the configuration (\-c, \-\-config)
.TP
.I /etc/fleetgate/devices.yaml
the devices and their secrets (auth.devices_file)
.TP
.I /var/lib/fleetgate
the state directory (gateway.state_dir)
.SH ENVIRONMENT
Every configuration key can be set as FLEETGATE_<PATH>, e.g.
FLEETGATE_PRESENCE_LEASE=60s. NO_COLOR turns colours off.
`)
	return b.String()
}

// roff escapes s for a line of roff text: backslashes, dashes, and a
// leading dot or quote.
func roff(s string) string {
	s = strings.NewReplacer(`\`, `\e`, "-", `\-`).Replace(s)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}
