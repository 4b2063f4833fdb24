# fleetgate %post: $1 is 1 on first install, 2 or more on upgrade. On
# first install the service is enabled and started unless a listen
# address is taken (then it says so); a failed start or restart is
# reported on the terminal and in the journal (journalctl -t
# fleetgate-postinst). Every systemd step is skipped on a host (or
# chroot) without systemd.
say() {
	echo "fleetgate: $*" >&2
	logger -t fleetgate-postinst -- "$*" 2>/dev/null || :
}
failed() {
	say "fleetgate.service did not $1; the package is installed. Its last lines:"
	journalctl -u fleetgate.service -n 8 --no-pager -o cat >&2 2>/dev/null || :
	say "fix the cause, then: systemctl start fleetgate (systemctl status fleetgate, journalctl -u fleetgate)"
}
if [ ! -d /var/lib/fleetgate ]; then
	install -d -m 0750 -o fleetgate -g fleetgate /var/lib/fleetgate
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
	if [ "$1" -eq 1 ]; then
		systemctl enable fleetgate.service >/dev/null 2>&1 || :
		if ! busy=$(fleetgate check-config --quiet --ports -c /etc/fleetgate/fleetgate.yaml 2>&1 >/dev/null); then
			say "fleetgate.service not started: ${busy#fleetgate check-config: }"
			say "edit /etc/fleetgate/fleetgate.yaml, then: systemctl start fleetgate"
		elif systemctl start fleetgate.service >/dev/null 2>&1; then
			say "started; next steps: /usr/share/doc/fleetgate/operations.md, A site's first day"
		else
			failed start
		fi
	elif ! systemctl try-restart fleetgate.service fleetgate-runner.service >/dev/null 2>&1; then
		failed restart
	fi
fi
exit 0
