# fleetgate %post: $1 is 1 on first install, 2 or more on upgrade. Every
# systemd step is skipped on a host (or chroot) without systemd.
if [ ! -d /var/lib/fleetgate ]; then
	install -d -m 0750 -o fleetgate -g fleetgate /var/lib/fleetgate
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
	if [ "$1" -eq 1 ]; then
		systemctl enable --now fleetgate.service >/dev/null 2>&1 || :
	else
		systemctl try-restart fleetgate.service fleetgate-runner.service >/dev/null 2>&1 || :
	fi
fi
exit 0
