#!/bin/bash
# sim/scale.sh: the simulator's figures of docs/benchmarks.md.
#
#   sim/scale.sh fleet   [COAP MQTT DURATION]  # 100,000 CoAP + 10,000 MQTT, shipped timings, 3 min
#   sim/scale.sh restart [MQTT DURATION AT]    # 10,000 MQTT devices; the gateway restarts at AT
#   sim/scale.sh accept  [DEVICES DURATION SEED SCENARIOS]
#                        # the issue's acceptance run: 2 gateways, 1,000 devices, all churn, 40 s
#   sim/scale.sh simcost [COAP MQTT DURATION DTLS_SHARE]
#                        # the simulator's own cost: 100,000 CoAP (10 % DTLS) + 10,000 MQTT, 3 min 20 s
#   sim/scale.sh run     [COAP MQTT DURATION AT DTLS_SHARE]
#                        # the scale run (`make scale`): 100,000 CoAP (10 % DTLS) + 10,000 MQTT, freeze and
#                        # leave churn, 10 min, the gateway restarted at AT s (the MQTT devices' reconnect storm);
#                        # the CPU also per part: each process's start and its steady part, which begins
#                        # SCALE_STEADY s (90) after the start; Redis's time by script over the first steady part
#   sim/scale.sh gwcost  [CLASS N DURATION]
#                        # the gateway's cost per device of one class (coap, dtls, mqtt): memory,
#                        # CPU per message, its heap profile's top; 10,000 MQTT devices, 3 min 20 s;
#                        # GWCOST_LIMITS adds to the gateway's limits (GWCOST_LIMITS='dtls_idle_timeout: 1s')
#   sim/scale.sh rawcost [N DURATION]
#                        # gwcost coap's ceiling: the same fleet answered by a raw UDP loop (a 2.04
#                        # per datagram, nothing else), its CPU per message
#   sim/scale.sh leases  [DEVICES DURATION SEED]
#                        # devices that send every 1 s to 1 h, time scaled by 1/60: a fixed lease
#                        # that lets the slowest through, then learned leases; the detection per period
#
# One redis-server and one `fleetgate run` (Redis store, shipped timings,
# rate limits raised; `simcost` keeps the shipped per-source limits, as
# every device has its own source address in 127.0.0.0/8) on free loopback ports under a temporary directory;
# everything is stopped at the end. It prints the gateway's CPU per 1,000
# devices and RSS per device (from /proc), and simulate's report;
# `run` and `gwcost` print where Redis's time goes (rtime_end, below).
# `simcost` prints the simulator's CPU over the steady part of the run
# (from 40 s, after every device's first heartbeat, to 10 s before the
# end) and its peak RSS (at the end of that part, and of the whole
# command, sampled each second) instead, with the gateway's DTLS listener and the
# devices file simulate writes. `accept` runs two gateways instead,
# with the end-to-end tests' timings (lease 6 s, heartbeat 2 s,
# renew_every 1 s, flush and runner 100 ms), and exits with simulate's
# status.
set -euo pipefail
mode=${1:-fleet}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d /tmp/fleetgate-scale-XXXXXX)
bin=$dir/fleetgate
(cd "$root" && go build -o "$bin" ./cmd/fleetgate)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
udpport() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rport=$(port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --loglevel warning --logfile "$dir/redis.log" &
rpid=$!
gpids=()
cleanup() { for p in "${gpids[@]}"; do kill "$p" 2>/dev/null || true; done; kill "$rpid" 2>/dev/null; wait 2>/dev/null; }
trap cleanup EXIT
# gwconf NAME PRESENCE UPLINK RUNNER: writes $dir/NAME.yaml on new ports
# and sets cport, mport and aport to them.
gwconf() {
	cport=$(udpport); mport=$(port); aport=$(port)
	cat > "$dir/$1.yaml" <<EOC
gateway: { id: $1, state_dir: $dir/$1 }
presence: { $2 }
store:
  backend: redis
  redis: { addrs: ["127.0.0.1:$rport"] }
uplink: { $3 }
runner: { $4 }
listen:
  coap: { udp: "127.0.0.1:$cport" }
  mqtt: { tcp: "127.0.0.1:$mport" }
  admin: { http: "127.0.0.1:$aport" }
limits: { ${limits:-coap_requests_per_second: 1000000, mqtt_connects_per_second: 1000000, mqtt_max_clients: 200000, anonymous_max_devices: 1000000, anonymous_connects_per_second: 1000000} }
auth: { allow_anonymous: true, devices_file: "${devices_file:-}" }
log: { level: warn }
EOC
}
# startgw NAME ADMINPORT: starts the gateway of $dir/NAME.yaml, sets gpid
# and waits (at most 10 s) for it to be ready.
startgw() {
	"$bin" run -c "$dir/$1.yaml" >>"$dir/$1.log" 2>&1 &
	gpid=$!
	gpids+=("$gpid")
	for _ in $(seq 100); do curl -sf "127.0.0.1:$2/readyz" >/dev/null && return; sleep 0.1; done
	echo "gateway $1 not ready" >&2; cat "$dir/$1.log" >&2; exit 1
}
if [ "$mode" = accept ]; then
	devices=${2:-1000}; duration=${3:-40s}; seed=${4:-1}; scenarios=${5:-all}
	timing='lease: 6s, heartbeat_interval: 2s, renew_every: 1s, suspect_after: 3s, shards: 4, gateway_grace: 3s'
	gwconf accept-a "$timing" 'flush_interval: 100ms, max_batch: 1000' 'enabled: true, interval: 100ms, batch: 500, lock_ttl: 1s'
	ca=$cport ma=$mport; startgw accept-a "$aport"
	gwconf accept-b "$timing" 'flush_interval: 100ms, max_batch: 1000' 'enabled: true, interval: 100ms, batch: 500, lock_ttl: 1s'
	cb=$cport mb=$mport; startgw accept-b "$aport"
	status=0
	"$bin" simulate --coap "127.0.0.1:$ca,127.0.0.1:$cb" --mqtt "127.0.0.1:$ma,127.0.0.1:$mb" --redis "127.0.0.1:$rport" \
		--devices "$devices" --mqtt-share 0.3 --duration "$duration" --heartbeat 1s --lease 6s --renew-every 1s \
		--runner-interval 100ms --flush-interval 100ms --seed "$seed" --scenario "$scenarios" --report "$dir/report.json" \
		--progress 2>"$dir/progress.log" || status=$?
	echo "report: $dir/report.json; exit status $status"
	exit "$status"
fi
if [ "$mode" = leases ]; then
	devices=${2:-150}; duration=${3:-400s}; seed=${4:-1}
	# 1 s, 10 s, 1 min, 10 min, 1 h, scaled by 1/60; half of each period's
	# devices freeze once the learned leases are (max_lease after the start)
	periods=16.667ms,166.667ms,1s,10s,1m
	common='renew_every: 500ms, shards: 4, gateway_grace: 3s'
	fleet=(--redis "127.0.0.1:$rport" --devices "$devices" --duration "$duration" --periods "$periods" --scenario freeze
		--churn-share 0.5 --churn-after 215s --seed "$seed" --renew-every 500ms --runner-interval 100ms
		--flush-interval 100ms)
	# a fixed lease that lets the slowest devices (every 60 s ± 10 %) through
	gwconf leases-fixed "lease: 70s, heartbeat_interval: 30s, suspect_after: 35s, $common" 'flush_interval: 100ms' 'enabled: true, interval: 100ms'
	startgw leases-fixed "$aport"
	"$bin" simulate --coap "127.0.0.1:$cport" "${fleet[@]}" --prefix "fixed$seed-" --lease 70s --report "$dir/fixed.json" \
		--progress 2>"$dir/fixed.log" >"$dir/fixed.out" || true
	kill "$gpid"; wait "$gpid" 2>/dev/null || true
	# learned leases: presence.lease 3 s (the floor), max_lease 210 s
	gwconf leases-learned "lease: 3s, heartbeat_interval: 1s, suspect_after: 2s, max_lease: 210s, learn_lease: true, $common" 'flush_interval: 100ms' 'enabled: true, interval: 100ms'
	startgw leases-learned "$aport"
	"$bin" simulate --coap "127.0.0.1:$cport" "${fleet[@]}" --prefix "learned$seed-" --lease 3s --max-lease 210s --report "$dir/learned.json" \
		--progress 2>"$dir/learned.log" >"$dir/learned.out" || true
	python3 - "$dir/fixed.json" "$dir/learned.json" <<'EOP'
import json, sys
fixed, learned = (json.load(open(f)) for f in sys.argv[1:3])
print("| period (scaled) | devices | frozen | false off (fixed / learned) | fixed lease 70 s: p50 / p99 / max | learned: p50 / p99 / max |")
print("|---|---|---|---|---|---|")
for f, l in zip(fixed['periods'], learned['periods']):
    d = lambda p: "%.1f / %.1f / %.1f s" % tuple(p['detection_ms'][k] / 1000 for k in ('p50', 'p99', 'max'))
    print(f"| {f['period']} | {f['devices']} | {f['stopped']} / {l['stopped']} | {f['false_offline']} / {l['false_offline']} | {d(f)} | {d(l)} |")
for name, r in (("fixed", fixed), ("learned", learned)):
    print(name, {k: r[k] for k in ('devices','heartbeats_sent','false_offline','missed_offline','log_violations','missed_online','late_offline','pending','bound_ms')},
          "on schedule %.2f %%" % (100 * r['fleet']['heartbeats_on_time']), "unanswered", r['fleet']['coap_unanswered'])
EOP
	echo "reports: $dir/fixed.json $dir/learned.json"
	exit 0
fi
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
# Where Redis's time goes: rtime_start logs every command in the slow log
# (threshold 0) from now on and zeroes the command statistics; rtime_end
# prints the time of each script and command over the window (from the
# slow log: execution only) against Redis's CPU (which also counts
# reading and parsing the calls, replies and its timers).
rtime_start() {
	redis-cli -p "$rport" CONFIG SET slowlog-log-slower-than 0 >/dev/null
	redis-cli -p "$rport" CONFIG SET slowlog-max-len 1000000 >/dev/null
	redis-cli -p "$rport" SLOWLOG RESET >/dev/null
	redis-cli -p "$rport" CONFIG RESETSTAT >/dev/null
}
rtime_end() { # RCPU_SECONDS WALL_SECONDS
	python3 - "$rport" "$root/store/redisstore/lua" "$1" "$2" <<'EOP'
import hashlib, re, socket, sys
port, lua = int(sys.argv[1]), sys.argv[2]; rcpu, wall = float(sys.argv[3]), float(sys.argv[4])
# the slow log over RESP (its arguments are binary: no redis-cli output
# format carries them whole)
sock = socket.create_connection(("127.0.0.1", port)); f = sock.makefile("rb")
def call(*args):
	sock.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
	return reply()
def reply():
	line = f.readline()[:-2]; t, rest = line[:1], line[1:]
	if t in (b"+", b"-"): return rest
	if t == b":": return int(rest)
	if t == b"$": n = int(rest); return None if n < 0 else f.read(n + 2)[:-2]
	if t == b"*": n = int(rest); return None if n < 0 else [reply() for _ in range(n)]
	raise ValueError(line)
log = call(b"SLOWLOG", b"GET", b"-1")
call(b"CONFIG", b"SET", b"slowlog-log-slower-than", b"10000")
src = lambda *names: "".join(open(f"{lua}/{n}.lua").read() for n in names)
names = {hashlib.sha1(s.encode()).hexdigest(): n for n, s in {
	"apply.lua": src("record", "apply"), "reap.lua": src("record", "reap"), "view.lua": src("record", "view"),
	"forget.lua": src("record", "forget"), "lease.lua": src("lease"), "position.lua": src("position"),
	"publisher.lua": src("publisher")}.items()}
rows = {}
for entry in log:
	us, args = entry[2], [a.decode("latin-1") for a in entry[3]]
	cmd = args[0].lower()
	name = names.get(args[1], "script " + args[1][:8]) if cmd in ("evalsha", "evalsha_ro") else cmd
	more = re.match(r"\.\.\. \((\d+) more arguments\)", args[-1])
	r = rows.setdefault(name, [0, 0, 0])
	r[0] += 1; r[1] += us; r[2] += len(args) + (int(more.group(1)) - 1 if more else 0)
total = sum(r[1] for r in rows.values())
print(f"Redis over {wall:.0f} s: CPU {rcpu:.2f} s; commands' execution {total/1e6:.2f} s ({100*total/1e6/rcpu:.0f} % of it), the rest is reading, parsing and replying, and timers")
print(f"{'command':<16}{'calls/s':>10}{'args/call':>11}{'us/call':>10}{'share of CPU':>14}")
for name, (n, us, a) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:12]:
	print(f"{name:<16}{n/wall:>10.1f}{a/n:>11.0f}{us/n:>10.1f}{100*us/1e6/rcpu:>13.1f}%")
EOP
}
if [ "$mode" = simcost ]; then
	coap=${2:-100000}; mqtt=${3:-10000}; duration=${4:-200s}; dtls=${5:-0.1}
	devices=$((coap + mqtt))
	share=$(python3 -c "print($mqtt/$devices)")
	secs=${duration%s}
	devices_file=$dir/devices.yaml
	# the per-source limits as shipped: only the fleet-wide caps are raised
	limits='mqtt_max_clients: 200000, anonymous_max_devices: 1000000'
	gwconf scale-1 'lease: 90s' 'flush_interval: 1s' 'enabled: true'
	dport=$(udpport)
	sed -i "s|coap: { udp: \"127.0.0.1:$cport\" }|coap: { udp: \"127.0.0.1:$cport\", dtls: \"127.0.0.1:$dport\" }|" "$dir/scale-1.yaml"
	fleet=(--coap "127.0.0.1:$cport" --mqtt "127.0.0.1:$mport" --devices "$devices" --mqtt-share "$share" --dtls-share "$dtls" --prefix simcost- --seed 1)
	"$bin" simulate --write-devices "$devices_file" "${fleet[@]}"
	startgw scale-1 "$aport"
	"$bin" simulate "${fleet[@]}" --dtls "127.0.0.1:$dport" --redis "127.0.0.1:$rport" --duration "$duration" \
		--scenario freeze,leave,dual,storm --report "$dir/report.json" --progress 2>"$dir/progress.log" >"$dir/simulate.out" &
	spid=$!
	sleep 40
	t0=$(ticks "$spid"); s0=$(date +%s.%N)
	sleep $((secs - 50))
	t1=$(ticks "$spid"); s1=$(date +%s.%N)
	hwm_run=$(awk '/VmHWM/{print $2}' "/proc/$spid/status")
	# the peak of the whole command: its VmHWM each second until it ends
	# (the check after the run, bounded by --max-wait, included)
	hwm_all=$hwm_run
	for _ in $(seq 3600); do
		h=$(awk '/VmHWM/{print $2}' "/proc/$spid/status" 2>/dev/null) || break
		[ -n "$h" ] || break
		hwm_all=$h
		sleep 1
	done
	wait "$spid" || true
	python3 - "$dir/report.json" "$t0" "$t1" "$s0" "$s1" "$hz" "$hwm_run" "$hwm_all" <<'EOP'
import json, sys
r = json.load(open(sys.argv[1])); t0, t1, s0, s1, hz, hwm, hwm_all = (float(x) for x in sys.argv[2:])
cpu = (t1 - t0) / hz; wall = s1 - s0; f = r['fleet']
print(f"simulator CPU {cpu:.1f} s over {wall:.0f} s of the steady part = {100*cpu/wall:.1f} % of one core")
print(f"simulator peak RSS while playing {hwm/1024:.0f} MiB, over the whole command (the check included, sampled each second) {hwm_all/1024:.0f} MiB")
print(f"heartbeats on schedule (within 100 ms): {100*f['heartbeats_on_time']:.2f} % of {f['heartbeats']}, latest {f['heartbeat_max_late_ms']:.0f} ms")
print(f"dtls handshakes {f['dtls_handshakes']} ({f['dtls_handshake_failures']} failed); mqtt connects {f['mqtt_connects']} ({f['mqtt_connect_errors']} failed); coap unanswered {f['coap_unanswered']}, retransmits {f['coap_retransmits']}")
print({k: r[k] for k in ('devices','heartbeats_sent','false_offline','missed_offline','log_violations','missed_online','late_offline','pending','detection_ms','bound_ms')})
EOP
	tail -n 30 "$dir/simulate.out"
	echo "progress: $dir/progress.log"
	tail -n 3 "$dir/progress.log"
	exit 0
fi
if [ "$mode" = run ]; then
	coap=${2:-100000}; mqtt=${3:-10000}; duration=${4:-600s}; at=${5:-300}; dtls=${6:-0.1}
	steady=${SCALE_STEADY:-90}
	devices=$((coap + mqtt))
	share=$(python3 -c "print($mqtt/$devices)")
	devices_file=$dir/devices.yaml
	limits="mqtt_max_clients: 200000, anonymous_max_devices: 1000000${GWCOST_LIMITS:+, $GWCOST_LIMITS}"
	gwconf scale-1 'lease: 90s' 'flush_interval: 1s' 'enabled: true'
	dport=$(udpport)
	sed -i "s|coap: { udp: \"127.0.0.1:$cport\" }|coap: { udp: \"127.0.0.1:$cport\", dtls: \"127.0.0.1:$dport\" }|" "$dir/scale-1.yaml"
	fleet=(--coap "127.0.0.1:$cport" --mqtt "127.0.0.1:$mport" --devices "$devices" --mqtt-share "$share" --dtls-share "$dtls" --prefix run- --seed 1)
	"$bin" simulate --write-devices "$devices_file" "${fleet[@]}"
	"$bin" check-config -c "$dir/scale-1.yaml" 2>/dev/null | grep -E '^worst-case detection ' || true
	startgw scale-1 "$aport"
	g1=$gpid
	"$bin" simulate "${fleet[@]}" --dtls "127.0.0.1:$dport" --redis "127.0.0.1:$rport" --duration "$duration" \
		--scenario freeze,leave --report "$dir/report.json" --progress 2>"$dir/progress.log" >"$dir/simulate.out" &
	spid=$!
	t0=$(ticks "$g1"); r0=$(ticks "$rpid"); s0=$(date +%s.%N)
	# the steady part before the restart starts once every device has
	# sent (the first heartbeats, DTLS handshakes and MQTT connects are
	# spread over the first heartbeat interval)
	sleep "$steady"
	tS=$(ticks "$g1"); rS=$(ticks "$rpid"); sS=$(date +%s.%N)
	rtime_start
	sleep $((at - steady))
	ta=$(ticks "$g1"); ra=$(ticks "$rpid"); sa=$(date +%s.%N); hwm1=$(awk '/VmHWM/{print $2}' "/proc/$g1/status")
	rtime_end "$(python3 -c "print(($ra - $rS) / $hz)")" "$(python3 -c "print($sa - $sS)")" >"$dir/rtime.txt"
	echo "restart at $(date -u +%T.%N | cut -c1-12)"
	kill -TERM "$g1"; wait "$g1" || true
	startgw scale-1 "$aport"
	g2=$gpid
	echo "ready at $(date -u +%T.%N | cut -c1-12)"
	tb=$(ticks "$g2"); sb=$(date +%s.%N); tC=""
	# the second process's peak, sampled each second until the fleet stops;
	# its steady part starts $steady s after it is ready (the reconnect
	# storm and the DTLS devices' new handshakes are over)
	while kill -0 "$spid" 2>/dev/null; do
		t2=$(ticks "$g2"); r1=$(ticks "$rpid"); s1=$(date +%s.%N); hwm2=$(awk '/VmHWM/{print $2}' "/proc/$g2/status")
		if [ -z "$tC" ] && python3 -c "import sys; sys.exit(0 if $s1 - $sb >= $steady else 1)"; then tC=$t2; sC=$s1; fi
		sleep 1
	done
	wait "$spid" || true
	python3 - "$dir/report.json" "$t0" "$ta" "$tb" "$t2" "$r0" "$r1" "$s0" "$s1" "$hz" "$devices" "$hwm1" "$hwm2" "$tS" "$sS" "$sa" "$sb" "${tC:-$t2}" "${sC:-$s1}" <<'EOP'
import json, sys
r = json.load(open(sys.argv[1]))
t0, ta, tb, t2, r0, r1, s0, s1, hz, n, hwm1, hwm2, tS, sS, sa, sb, tC, sC = (float(x) for x in sys.argv[2:])
wall = s1 - s0; cpu = ((ta - t0) + (t2 - tb)) / hz; rcpu = (r1 - r0) / hz
print(f"gateway CPU {cpu:.1f} s over {wall:.0f} s = {100*cpu/wall:.1f} % of a core (both processes); Redis {100*rcpu/wall:.1f} %")
pct = lambda c, w: f"{100*c/hz/w:.1f} % of a core over {w:.0f} s" if w > 0 else "-"
print(f"  first process: start and first heartbeats {pct(tS - t0, sS - s0)}; steady {pct(ta - tS, sa - sS)}")
print(f"  second process: start, reconnects and handshakes {pct(tC - tb, sC - sb)}; steady {pct(t2 - tC, s1 - sC)}")
print(f"gateway peak RSS: first process {hwm1/1024:.0f} MiB, second {hwm2/1024:.0f} MiB ({max(hwm1, hwm2)*1024/n:.0f} B per device)")
f = r['fleet']
print(f"heartbeats on schedule: {100*f['heartbeats_on_time']:.2f} %; dtls handshakes {f['dtls_handshakes']}, resumes {f.get('dtls_resumes')} ({f.get('dtls_resume_failures')} not answered); mqtt connects {f['mqtt_connects']} ({f['mqtt_connect_errors']} failed), reconnects {f.get('reconnects')}; coap unanswered {f['coap_unanswered']}")
print({k: r[k] for k in ('devices','heartbeats_sent','false_offline','missed_offline','log_violations','missed_online','late_offline','pending','detection_ms','bound_ms')})
EOP
	cat "$dir/rtime.txt"
	tail -n 40 "$dir/simulate.out"
	exit 0
fi
if [ "$mode" = rawcost ]; then
	# the ceiling of gwcost coap: the same fleet answered by the CoAP
	# front end benchmark's raw UDP loop (a 2.04 per datagram, nothing
	# else), its CPU over the same steady part
	n=${2:-100000}; duration=${3:-200s}; secs=${duration%s}
	(cd "$root" && go test -c -o "$dir/coap.test" ./protocols/coap)
	# a gateway on the store, so that simulate finds its shards; no
	# device sends to it
	gwconf scale-1 'lease: 90s' 'flush_interval: 1s' 'enabled: true'
	startgw scale-1 "$aport"
	coproc RAW { FLEETGATE_COAP_BENCH_CHILD=raw exec "$dir/coap.test"; }
	rawpid=$RAW_PID; gpids+=("$rawpid")
	read -r raddr <&"${RAW[0]}"
	"$bin" simulate --coap "$raddr" --devices "$n" --mqtt-share 0 --dtls-share 0 --prefix gwcost- --seed 1 \
		--redis "127.0.0.1:$rport" --duration "$duration" --scenario none --report "$dir/report.json" \
		2>"$dir/progress.log" >"$dir/simulate.out" &
	spid=$!
	sleep 40
	t0=$(ticks "$rawpid"); s0=$(date +%s.%N)
	sleep $((secs - 50))
	t1=$(ticks "$rawpid"); s1=$(date +%s.%N)
	wait "$spid" || true
	python3 - "$dir/report.json" "$t0" "$t1" "$s0" "$s1" "$hz" "$n" <<'EOP'
import json, sys
r = json.load(open(sys.argv[1])); t0, t1, s0, s1, hz, n = (float(x) for x in sys.argv[2:8])
cpu = (t1 - t0) / hz; wall = s1 - s0; msgs = n * wall / 30
print(f"raw UDP loop, {n:.0f} CoAP devices, heartbeat 30 s: ~{msgs/wall:.0f} messages/s over the {wall:.0f} s steady part")
print(f"raw loop CPU {100*cpu/wall:.1f} % of a core = {1e6*cpu/msgs:.1f} us per message")
f = r['fleet']
print(f"heartbeats on schedule: {100*f['heartbeats_on_time']:.2f} %; coap unanswered {f['coap_unanswered']}")
EOP
	exit 0
fi

if [ "$mode" = gwcost ]; then
	class=${2:-mqtt}; n=${3:-10000}; duration=${4:-200s}
	secs=${duration%s}
	case $class in
	coap) shares=(--mqtt-share 0 --dtls-share 0) ;;
	dtls) shares=(--mqtt-share 0 --dtls-share 1) ;;
	mqtt) shares=(--mqtt-share 1 --dtls-share 0) ;;
	*) echo "gwcost: class coap, dtls or mqtt, got $class" >&2; exit 2 ;;
	esac
	devices_file=$dir/devices.yaml
	limits="mqtt_max_clients: 200000, anonymous_max_devices: 1000000${GWCOST_LIMITS:+, $GWCOST_LIMITS}"
	gwconf scale-1 'lease: 90s' 'flush_interval: 1s' 'enabled: true'
	dport=$(udpport)
	sed -i -e "s|coap: { udp: \"127.0.0.1:$cport\" }|coap: { udp: \"127.0.0.1:$cport\", dtls: \"127.0.0.1:$dport\" }|" \
		-e "s|admin: { http: \"127.0.0.1:$aport\" }|admin: { http: \"127.0.0.1:$aport\", pprof: true }|" "$dir/scale-1.yaml"
	fleet=(--coap "127.0.0.1:$cport" --mqtt "127.0.0.1:$mport" --devices "$n" "${shares[@]}" --prefix gwcost- --seed 1)
	if [ "$class" = dtls ]; then "$bin" simulate --write-devices "$devices_file" "${fleet[@]}"; else echo "devices: []" >"$devices_file"; fi
	startgw scale-1 "$aport"
	sleep 5
	hwm0=$(awk '/VmHWM/{print $2}' "/proc/$gpid/status"); rss0=$(awk '/VmRSS/{print $2}' "/proc/$gpid/status")
	"$bin" simulate "${fleet[@]}" --dtls "127.0.0.1:$dport" --redis "127.0.0.1:$rport" --duration "$duration" \
		--scenario none --report "$dir/report.json" --progress 2>"$dir/progress.log" >"$dir/simulate.out" &
	spid=$!
	sleep 40
	t0=$(ticks "$gpid"); r0=$(ticks "$rpid"); s0=$(date +%s.%N)
	rtime_start
	# a CPU profile of 20 s in the middle of the steady part
	sleep $(((secs - 50) / 2 - 10))
	curl -sf "127.0.0.1:$aport/debug/pprof/profile?seconds=20" -o "$dir/cpu.pb.gz"
	sleep $(((secs - 50) - (secs - 50) / 2 - 10))
	t1=$(ticks "$gpid"); r1=$(ticks "$rpid"); s1=$(date +%s.%N)
	rtime_end "$(python3 -c "print(($r1 - $r0) / $hz)")" "$(python3 -c "print($s1 - $s0)")" >"$dir/rtime.txt"
	hwm1=$(awk '/VmHWM/{print $2}' "/proc/$gpid/status"); rss1=$(awk '/VmRSS/{print $2}' "/proc/$gpid/status")
	curl -sf "127.0.0.1:$aport/debug/pprof/heap" -o "$dir/heap.pb.gz"
	curl -sf "127.0.0.1:$aport/debug/pprof/goroutine?debug=1" -o "$dir/goroutines.txt"
	goroutines=$(head -1 "$dir/goroutines.txt" | awk '{print $NF}')
	curl -sf "127.0.0.1:$aport/metrics" -o "$dir/metrics.txt"
	wait "$spid" || true
	python3 - "$dir/report.json" "$t0" "$t1" "$r0" "$r1" "$s0" "$s1" "$hz" "$n" "$hwm0" "$hwm1" "$rss0" "$rss1" "$goroutines" "$class" <<'EOP'
import json, sys
r = json.load(open(sys.argv[1])); t0, t1, r0, r1, s0, s1, hz, n, hwm0, hwm1, rss0, rss1, g = (float(x) for x in sys.argv[2:15])
cpu = (t1 - t0) / hz; rcpu = (r1 - r0) / hz; wall = s1 - s0; msgs = n * wall / 30
print(f"class {sys.argv[15]}, {n:.0f} devices, heartbeat 30 s: ~{msgs/wall:.0f} messages/s over the {wall:.0f} s steady part")
print(f"gateway: VmHWM {hwm0/1024:.0f} -> {hwm1/1024:.0f} MiB = {(hwm1-hwm0)*1024/n:.0f} B per device; VmRSS {rss0/1024:.0f} -> {rss1/1024:.0f} MiB = {(rss1-rss0)*1024/n:.0f} B per device; {g:.0f} goroutines")
print(f"gateway CPU {100*cpu/wall:.1f} % of a core = {1e6*cpu/msgs:.1f} us per message; Redis CPU {100*rcpu/wall:.1f} % = {1e6*rcpu/msgs:.1f} us per message")
f = r['fleet']
print(f"heartbeats on schedule: {100*f['heartbeats_on_time']:.2f} %; dtls handshakes {f['dtls_handshakes']} ({f['dtls_handshake_failures']} failed); mqtt connects {f['mqtt_connects']} ({f['mqtt_connect_errors']} failed); coap unanswered {f['coap_unanswered']}")
print({k: r[k] for k in ('devices','heartbeats_sent','false_offline','missed_offline','log_violations')})
EOP
	cat "$dir/rtime.txt"
	go tool pprof -top -sample_index=inuse_space -nodecount=25 "$bin" "$dir/heap.pb.gz" 2>/dev/null | sed -n '1,32p'
	go tool pprof -top -cum -nodecount=40 "$bin" "$dir/cpu.pb.gz" 2>/dev/null | sed -n '1,48p'
	echo "profiles: $dir/heap.pb.gz $dir/cpu.pb.gz"
	exit 0
fi
gwconf scale-1 'lease: 90s' 'flush_interval: 1s' 'enabled: true'
startgw scale-1 "$aport"
case $mode in
fleet)
	coap=${2:-100000}; mqtt=${3:-10000}; duration=${4:-3m}
	devices=$((coap + mqtt))
	share=$(python3 -c "print($mqtt/$devices)")
	t0=$(ticks "$gpid"); s0=$(date +%s.%N)
	"$bin" simulate --coap "127.0.0.1:$cport" --mqtt "127.0.0.1:$mport" --redis "127.0.0.1:$rport" \
		--devices "$devices" --mqtt-share "$share" --duration "$duration" --sockets 64 \
		--scenario freeze,leave,dual,storm --report "$dir/report.json" --progress 2>"$dir/progress.log" || true
	t1=$(ticks "$gpid"); s1=$(date +%s.%N)
	rss=$(awk '/VmHWM/{print $2}' "/proc/$gpid/status")
	python3 - "$dir/report.json" "$t0" "$t1" "$s0" "$s1" "$hz" "$devices" "$rss" <<'EOP'
import json, sys
r = json.load(open(sys.argv[1])); t0, t1, s0, s1, hz, n, rss = (float(x) for x in sys.argv[2:])
cpu = (t1 - t0) / hz; wall = s1 - s0
print(f"gateway CPU {cpu:.1f} s over {wall:.0f} s = {100*cpu/wall:.1f} % of a core; per 1,000 devices {100*cpu/wall/(n/1000):.3f} % of a core")
print(f"gateway peak RSS {rss/1024:.0f} MiB = {rss*1024/n:.0f} B per device")
print(f"Redis: {r['store_calls_per_heartbeat']:.3f} commands and {r['store_cpu_us_per_heartbeat']:.2f} µs CPU per device message")
print({k: r[k] for k in ('devices','heartbeats_sent','false_offline','missed_offline','log_violations','missed_online','late_offline','pending','detection_ms','bound_ms')})
print(r['fleet'])
EOP
	;;
restart)
	mqtt=${2:-10000}; duration=${3:-3m}; at=${4:-100}
	"$bin" simulate --mqtt "127.0.0.1:$mport" --redis "127.0.0.1:$rport" --devices "$mqtt" --mqtt-share 1 \
		--duration "$duration" --scenario none --report "$dir/report.json" --progress 2>"$dir/progress.log" &
	spid=$!
	sleep "$at"
	echo "restart at $(date -u +%T.%N | cut -c1-12)"
	kill -TERM "$gpid"; wait "$gpid" || true
	startgw scale-1 "$aport"
	echo "ready at $(date -u +%T.%N | cut -c1-12)"
	wait "$spid" || true
	python3 - "$dir/report.json" <<'EOP'
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r[k] for k in ('devices','heartbeats_sent','false_offline','missed_offline','log_violations','missed_online','detection_ms')})
print(r['fleet'])
EOP
	;;
esac
echo "progress: $dir/progress.log"
tail -n 3 "$dir/progress.log"
