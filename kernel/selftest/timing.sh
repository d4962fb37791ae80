# SPDX-License-Identifier: GPL-2.0
#
# The emulated timing shared by `rxlane.sh bench` and lanebench.sh (sourced
# by both; mkinitramfs.sh installs it beside them). The sourcing script
# defines overlay_order NLOW: queue NLOW low + 1 high VXLAN packets on wB
# and print the receiver's report (t_inject_ns, t_high_ns, t_last_ns).

# field NAME: the value of NAME=N in the input
field() { sed -n "s/.*$1=\([-0-9]*\).*/\1/p"; }
# pct FILE: median, p10 and p90 of FILE's numbers
pct() { sort -n "$1" | awk '{a[NR]=$1} END {printf "median=%d p10=%d p90=%d", a[int((NR+1)/2)], a[int(NR*0.1)+1], a[int(NR*0.9+0.5)]}'; }

# time_reps REPS: REPS times 500 low + 1 high; microseconds from queueing
# to the high packet's receipt go to /tmp/b.high, to the last packet's to
# /tmp/b.all (one line a repetition that delivered the high packet)
time_reps() {
	: >/tmp/b.high; : >/tmp/b.all
	i=0
	while [ $i -lt $1 ]; do
		out=$(overlay_order 500)
		ti=$(echo "$out" | field t_inject_ns)
		th=$(echo "$out" | field t_high_ns)
		tl=$(echo "$out" | field t_last_ns)
		[ -n "$ti" ] && [ "$th" != 0 ] && { echo $(( (th - ti) / 1000 )) >>/tmp/b.high; echo $(( (tl - ti) / 1000 )) >>/tmp/b.all; }
		i=$((i + 1))
	done
}
