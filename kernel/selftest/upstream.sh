#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The kernel's own net selftests in the rxlane guest (TAP, one line per
# script). The scripts and their helpers come unchanged from
# tools/testing/selftests/net of the very source tree the guest kernel was
# built from (kernel/scripts/mkinitramfs.sh copies them to /selftests);
# each runs with bash in the initial namespace as upstream's runner would,
# and passes when it exits 0. Run by `rxlane kernel test` for every
# variant: the series compiled out and compiled in (but off) must both
# pass them unchanged.
#
# Chosen because they exercise the paths the series hooks (veth, VXLAN,
# GRO, the backlog) and fit the guest; see docs/kernel.md for the ones
# left out and why.

PATH=/usr/sbin:/usr/bin:/bin:/sbin
export PATH
n=0
fails=0
echo "TAP version 13"
echo "# kernel $(uname -r), CONFIG_NET_RXLANE=$([ -e /proc/sys/net/rxlane ] && echo y || echo n), $(grep -c ^processor /proc/cpuinfo) CPUs"

# known failures: "script:reason" for scripts that also fail with the
# series compiled out (vanilla behaviour of this kernel in this guest);
# reported as TODO, which TAP does not count as a failure
known=""

# run SCRIPT [ARGS]: one TAP line; the script's output as diagnostics
run() {
	s=$1; shift
	n=$((n + 1))
	if [ "$s" = veth.sh ] && [ ! -f /selftests/bpf/xdp_dummy.bpf.o ]; then
		echo "ok $n - net/$s # SKIP xdp_dummy.bpf.o not built (clang was not installed when the initramfs was made)"
		return
	fi
	t0=$(date +%s)
	(cd /selftests/net && timeout 300 bash ./$s "$@") >/tmp/upstream.log 2>&1
	rc=$?
	sed 's/^/# /' /tmp/upstream.log
	[ -f /selftests/net/log.txt ] && { sed 's/^/# log.txt: /' /selftests/net/log.txt; rm -f /selftests/net/log.txt; }
	desc="net/$s${1:+ $*} (exit $rc, $(( $(date +%s) - t0 ))s)"
	reason=$(echo "$known" | tr ' ' '\n' | sed -n "s/^$s:\(.*\)/\1/p" | tr _ ' ')
	if [ $rc = 0 ]; then
		echo "ok $n - $desc"
	elif [ -n "$reason" ]; then
		echo "not ok $n - $desc # TODO $reason"
	else
		fails=$((fails + 1))
		echo "not ok $n - $desc"
	fi
}

run test_vxlan_fdb_changelink.sh
run veth.sh
run udpgso.sh
run gro.sh

echo "1..$n"
exit $((fails > 0))
