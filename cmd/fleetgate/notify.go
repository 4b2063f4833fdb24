package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/fleetgate/fleetgate/runner"
)

// The service manager protocol (sd_notify) of `fleetgate run` under
// systemd's Type=notify (systemd/fleetgate.service):
//
//   - READY=1 once the state file, the store, the listeners of every
//     front end and the admin API are up;
//   - RELOADING=1 with MONOTONIC_USEC when a SIGHUP reload begins, READY=1
//     when it is done (whether the new file was taken or refused);
//   - STOPPING=1 when shutdown begins;
//   - STATUS= a line a person can read (systemctl status);
//   - WATCHDOG=1 every half WATCHDOG_USEC, but only while no loop of the
//     gateway is stuck in one step (see gatewayProcess.stalled), so that
//     systemd restarts a gateway whose batcher, outbox writer or runner
//     hangs.
//
// `fleetgate runner` (systemd/fleetgate-runner.service) speaks the same
// protocol without the reload: READY=1 once the store answers and the
// admin API (with --metrics) listens, STOPPING=1 when shutdown begins,
// and WATCHDOG=1 only while the runner is not stuck in one cycle.
//
// Every call passes unsetEnvironment=false: true would unset NOTIFY_SOCKET
// and silently drop every later message. Without NOTIFY_SOCKET (not under
// systemd) every call is a no-op.

// sdNotify sends state to the service manager, logging a failure at debug
// level: the gateway runs the same whether or not anyone listens.
func sdNotify(log *slog.Logger, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Debug("sd_notify failed", "state", state, "err", err)
	}
}

// statusLine is the STATUS= text for systemctl status.
func (g *gatewayProcess) statusLine() string {
	st := g.up.Status()
	uplink := "up"
	if !st.Up {
		uplink = "DOWN since " + st.Since.Format(time.TimeOnly)
	}
	_, suspectAfter := g.timing()
	dev := g.table.Devices(time.Now(), suspectAfter)
	line := fmt.Sprintf("%d devices online, %d suspect; %d sessions; uplink %s; outbox %d sessions",
		dev.Online, dev.Suspect, g.table.Len(), uplink, st.OutboxSessions)
	if st.OutboxSessions > 0 {
		line += fmt.Sprintf(" (oldest %s)", st.OutboxOldest.Round(time.Second))
	}
	if r := g.refused.Load(); r != nil {
		line += "; LAST RELOAD REFUSED at " + *r
	}
	return line
}

// stalled names the first loop that has been inside one step for longer
// than limit at now, "" when every loop is waiting or making progress.
func (g *gatewayProcess) stalled(now time.Time, limit time.Duration) string {
	if loop, d := g.up.Stalled(now, limit); loop != "" {
		return fmt.Sprintf("uplink %s loop stuck in one step for %s", loop, d.Round(time.Millisecond))
	}
	if g.runner != nil {
		return runnerStalled(g.runner, now, limit)
	}
	return ""
}

// runnerStalled says how long r has been stuck in one cycle, "" when it
// has not been for longer than limit at now.
func runnerStalled(r *runner.Runner, now time.Time, limit time.Duration) string {
	if d, ok := r.Stalled(now, limit); ok {
		return fmt.Sprintf("runner stuck in one cycle for %s", d.Round(time.Millisecond))
	}
	return ""
}

// runnerStatusLine is the STATUS= text of `fleetgate runner`.
func runnerStatusLine(st runner.Status, shards int) string {
	return fmt.Sprintf("runner: %d of %d shards held; %d offline events reaped; %d of %d reap calls failed",
		len(st.Shards), shards, st.Reaped, st.ReapErrors, st.ReapCalls)
}

// newWatchdog returns the keep-alive loop for systemd's watchdog
// (WATCHDOG_USEC, set by WatchdogSec=), or nil when there is none. A loop
// busy in one step for longer than the whole watchdog interval counts as
// stalled; every step is bounded far below the shipped WatchdogSec.
func newWatchdog(log *slog.Logger, stalled func(now time.Time, limit time.Duration) string, status func() string) *watchdog {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd watchdog settings unreadable; running without keep-alives", "err", err)
		return nil
	}
	if interval <= 0 {
		return nil
	}
	log.Info("systemd watchdog on", "interval", interval)
	return &watchdog{every: interval / 2, limit: interval, stalled: stalled, status: status, log: log}
}

// watchdog sends WATCHDOG=1 (with a fresh STATUS=) every `every` while
// stalled reports nothing. While a loop is stalled it sends none, so
// systemd kills and restarts the process after WatchdogSec.
type watchdog struct {
	every   time.Duration
	limit   time.Duration
	stalled func(now time.Time, limit time.Duration) string
	status  func() string
	log     *slog.Logger
}

// run pings until ctx is done.
func (w *watchdog) run(ctx context.Context) error {
	t := time.NewTicker(w.every)
	defer t.Stop()
	was := ""
	for {
		why := w.stalled(time.Now(), w.limit)
		switch {
		case why == "":
			sdNotify(w.log, daemon.SdNotifyWatchdog+"\nSTATUS="+w.status())
			if was != "" {
				w.log.Warn("watchdog: every loop makes progress again; keep-alives resumed")
			}
		case was == "":
			w.log.Error("watchdog: keep-alives stopped; systemd restarts the process unless the loop recovers", "reason", why)
			sdNotify(w.log, "STATUS=STALLED: "+why)
		}
		was = why
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
