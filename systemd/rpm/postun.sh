# fleetgate %postun: $1 is 0 when the package is erased. RPM has no purge:
# the state directory /var/lib/fleetgate stays (remove it by hand).
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
exit 0
