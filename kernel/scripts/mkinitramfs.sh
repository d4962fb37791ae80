#!/usr/bin/env bash
# Build the test guest's initramfs: busybox (static), the host's iproute2
# (ip, bridge, tc, nstat), bash and ethtool with the shared libraries ldd
# reports, the selftest, its probes (built static from kernel/selftest/*.c),
# a selection of the kernel's own net selftests and /dev/console.
# With RXLANE_GUEST_BIN=PATH (a static rxlane binary) also the CLI and the
# eBPF-lane bench.
#
# usage: mkinitramfs.sh OUTPUT.cpio.gz
set -euo pipefail
outfile=${1:?usage: mkinitramfs.sh OUTPUT.cpio.gz}
here=$(cd "$(dirname "$0")/.." && pwd)            # kernel/
cache=${RXLANE_KERNEL_CACHE:-/var/cache/rxlane/kernel}
src=$cache/src
die() { echo "initramfs: $*" >&2; exit 1; }

busybox=/bin/busybox
[ -x "$busybox" ] || die "busybox not found: install busybox-static (scripts/setup does)"
ldd "$busybox" >/dev/null 2>&1 && die "$busybox is not static: install busybox-static"
[ -r "$cache/rxlane_uapi.h" ] || die "$cache/rxlane_uapi.h missing: build a patched variant (on/off) first"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,etc,proc,sys,dev,tmp,run,root}
cp "$busybox" "$stage/bin/busybox"

# host_bin TOOL DEST PACKAGE: the host's TOOL at DEST in the guest, with the
# shared libraries ldd lists
host_bin() {
	p=$(PATH=/usr/sbin:/sbin:/usr/bin:/bin command -v "$1") || die "'$1' not found: install $3"
	mkdir -p "$stage$(dirname "$2")"
	cp "$p" "$stage$2"
	for lib in $(ldd "$p" | grep -o '/[^ ]*'); do
		mkdir -p "$stage$(dirname "$lib")"
		cp -L "$lib" "$stage$lib"
	done
}
# iproute2 (ahead of busybox's applets in PATH); bash, ethtool and nstat
# for the kernel's own selftests (busybox provides ping)
for t in ip bridge tc nstat; do host_bin $t /usr/sbin/$t iproute2; done
host_bin bash /bin/bash bash
host_bin ethtool /usr/sbin/ethtool ethtool

# a selection of the kernel's own net selftests from the same source tree,
# unchanged (kernel/selftest/upstream.sh runs them), their C helpers built
# static, and the XDP object veth.sh needs if clang is there
st=$src/tools/testing/selftests
mkdir -p "$stage/selftests/net" "$stage/selftests/bpf"
for f in veth.sh gro.sh setup_veth.sh setup_loopback.sh udpgso.sh in_netns.sh \
	test_vxlan_fdb_changelink.sh; do
	install -m 0755 "$st/net/$f" "$stage/selftests/net/$f"
done
for c in udpgso_bench_rx udpgso_bench_tx udpgso gro; do
	gcc -O2 -static -w -o "$stage/selftests/net/$c" "$st/net/$c.c" ||
		die "compiling the kernel's selftest helper $c failed"
done
if command -v clang >/dev/null; then
	clang -O2 -target bpf -I/usr/include/$(gcc -dumpmachine) \
		-c "$st/bpf/progs/xdp_dummy.c" -o "$stage/selftests/bpf/xdp_dummy.bpf.o" ||
		die "compiling xdp_dummy.bpf.o failed"
fi
install -m 0755 "$here/selftest/upstream.sh" "$stage/upstream.sh"

# the project's CLI (static) for the eBPF lane in bench mode
if [ -n "${RXLANE_GUEST_BIN:-}" ]; then
	ldd "$RXLANE_GUEST_BIN" >/dev/null 2>&1 && die "$RXLANE_GUEST_BIN is not static (build with CGO_ENABLED=0)"
	install -m 0755 "$RXLANE_GUEST_BIN" "$stage/usr/bin/rxlane"
	install -m 0755 "$here/selftest/lanebench.sh" "$stage/lanebench.sh"
fi

# probes (static) and the selftest
cp "$cache/rxlane_uapi.h" "$stage/rxlane_uapi.h"
for c in rxlanectl rxlane_probe; do
	gcc -O2 -Wall -static -I"$stage" -o "$stage/bin/$c" "$here/selftest/$c.c" ||
		die "compiling $c failed (needs gcc and libc6-dev)"
done
rm "$stage/rxlane_uapi.h"
install -m 0755 "$here/selftest/rxlane.sh" "$stage/rxlane.sh"
install -m 0644 "$here/selftest/timing.sh" "$stage/timing.sh" # sourced by rxlane.sh and lanebench.sh
install -m 0755 "$here/selftest/init" "$stage/init"
echo "root:x:0:0:root:/root:/bin/sh" >"$stage/etc/passwd"
echo "nobody:x:1000:1000::/tmp:/bin/sh" >>"$stage/etc/passwd"
echo "root:x:0:" >"$stage/etc/group"

# cpio via the kernel's gen_init_cpio: no root needed for /dev/console
gic=$cache/gen_init_cpio
if [ ! -x "$gic" ] || [ "$src/usr/gen_init_cpio.c" -nt "$gic" ]; then
	gcc -O2 -o "$gic" "$src/usr/gen_init_cpio.c" || die "building gen_init_cpio failed"
fi
list=$stage.list
{
	echo "nod /dev/console 0600 0 0 c 5 1"
	echo "nod /dev/null 0666 0 0 c 1 3"
	(cd "$stage" && find . -mindepth 1 | sort) | while read -r f; do
		f=${f#.}
		if [ -L "$stage$f" ]; then
			echo "slink $f $(readlink "$stage$f") 0777 0 0"
		elif [ -d "$stage$f" ]; then
			echo "dir $f 0755 0 0"
		else
			echo "file $f $stage$f $(stat -c %a "$stage$f") 0 0"
		fi
	done
} >"$list"
"$gic" "$list" | gzip -9 >"$outfile.tmp"
rm -f "$list"
mv "$outfile.tmp" "$outfile"
echo "$outfile"
