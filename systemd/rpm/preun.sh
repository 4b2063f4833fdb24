# fleetgate %preun: $1 is 0 when the package is erased (not upgraded).
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
	systemctl disable --now fleetgate.service fleetgate-runner.service >/dev/null 2>&1 || :
fi
exit 0
