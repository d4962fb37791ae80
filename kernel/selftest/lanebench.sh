#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The fourth mode of the emulated comparison (`rxlane kernel bench`): the
# project's eBPF lane (`rxlane lanes`, sync mode: bpf/lanes.c on tc clsact
# ingress of the underlay wB) on the kernel's own mechanisms (prism_mode 0,
# no rxlane kernel rules). Runs after `rxlane.sh bench` in the same guest,
# on the topology it built (init_net = host B: wB, vxB VNI 42 on brB, vhB
# -> ctB in rxl-cB), with the same measurement: 500 low + 1 high VXLAN
# packets queued at once on wB by the debugfs injector, microseconds from
# queueing to the high packet's and the last packet's receipt in rxl-cB.
#
# usage: lanebench.sh [REPS]

PATH=/usr/sbin:/usr/bin:/bin:/sbin
reps=${1:-15}
. "$(dirname "$0")/timing.sh" # field, pct, time_reps
lanes() { rxlane lanes --state-dir /tmp/lanebench "$@"; }

# inject 500 low + 1 high (198.19.0.3:7000) on wB, receiver in rxl-cB
# (the same frames as rxlane.sh's overlay_order)
overlay_order() {
	mac=$(/usr/sbin/ip netns exec rxl-cB cat /sys/class/net/ctB/address)
	rm -f /tmp/lready; mkfifo /tmp/lready
	/usr/sbin/ip netns exec rxl-cB rxlane_probe recv 7000 $(($1 + 1)) 2000 /tmp/lready >/tmp/lrecv.out &
	rpid=$!
	read -r _ </tmp/lready
	rxlane_probe inject wB $1 198.19.0.2 198.19.0.3 7000 vxlan 198.18.0.1 198.18.0.2 42 $mac
	wait $rpid
	cat /tmp/lrecv.out
}

[ "$(cat /proc/sys/net/rxlane/prism_mode 2>/dev/null || echo 0)" = 0 ] ||
	{ echo "lanebench: prism_mode is not 0"; exit 1; }
lanes add --dst 198.19.0.3/32 --proto udp --port 7000 --vni 42 >/tmp/lanes.out 2>&1 &&
	lanes enable >>/tmp/lanes.out 2>&1 ||
	{ sed 's/^/lanebench: /' /tmp/lanes.out; echo "lanebench: rxlane lanes enable failed"; exit 1; }
sed 's/^/# lanes: /' /tmp/lanes.out
# the lane must actually carry the high packet: check once before timing
r=$(overlay_order 500)
echo "# ebpf-lane check: $(echo $r)"
time_reps $reps
lanes stats >/tmp/lanes.stats 2>&1
sed 's/^/# lanes stats: /' /tmp/lanes.stats
high=$(awk '$1 == "high" { print $2; exit }' /tmp/lanes.stats)
lanes disable
rm -rf /tmp/lanebench
if [ "${high:-0}" -lt $((reps + 1)) ]; then
	echo "lanebench: the lane carried ${high:-0} high packets, expected $((reps + 1))"
	exit 1
fi
echo "bench mode=ebpf-lane reps=$(wc -l </tmp/b.high) high_us $(pct /tmp/b.high) all_us $(pct /tmp/b.all)"
