# fleetgate %pre: the system user exists before the files owned by its
# group (/etc/fleetgate) are installed.
SYSUSER='u fleetgate - "fleetgate gateway" /var/lib/fleetgate /usr/sbin/nologin'
if ! getent passwd fleetgate >/dev/null 2>&1; then
	if command -v systemd-sysusers >/dev/null 2>&1; then
		echo "$SYSUSER" | systemd-sysusers --replace=/usr/lib/sysusers.d/fleetgate.conf -
	else
		getent group fleetgate >/dev/null 2>&1 || groupadd --system fleetgate
		useradd --system --gid fleetgate --home-dir /var/lib/fleetgate --no-create-home \
			--shell /sbin/nologin --comment "fleetgate gateway" fleetgate
	fi
fi
exit 0
