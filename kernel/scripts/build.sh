#!/usr/bin/env bash
# Build the rxlane guest kernel: Debian's linux-source-6.1 + kernel/patches
# (in kernel/patches/series order) + tinyconfig + kernel/config +
# the variant's fragments (below). The tree, the build directories and the ccache
# live in $RXLANE_KERNEL_CACHE (default /var/cache/rxlane/kernel).
#
# usage: build.sh VARIANT        VARIANT: on | off | debug | debug-off | vanilla
# prints the bzImage path on the last line of stdout.
set -euo pipefail

variant=${1:?usage: build.sh on|off|debug|debug-off|vanilla}
here=$(cd "$(dirname "$0")/.." && pwd)            # kernel/
cache=${RXLANE_KERNEL_CACHE:-/var/cache/rxlane/kernel}
tarball=${RXLANE_KERNEL_TARBALL:-/usr/src/linux-source-6.1.tar.xz}
jobs=${RXLANE_KERNEL_JOBS:-2}
# Heavy steps run under this lock (a shared 2-core box measures timing);
# RXLANE_CPU_LOCK=none when the caller already holds it (nested flock on
# the same file would wait forever).
cpulock=${RXLANE_CPU_LOCK:-/tmp/rxlane-cpu.lock}
locked() { if [ "$cpulock" = none ]; then "$@"; else flock "$cpulock" "$@"; fi; }
src=$cache/src

die() { echo "kernel build: $*" >&2; exit 1; }
log() { echo "kernel build: $*" >&2; }

case $variant in on|off|debug|debug-off|vanilla) ;; *) die "unknown variant '$variant' (want on, off, debug, debug-off or vanilla)";; esac
[ -r "$tarball" ] || die "$tarball not found: install the linux-source-6.1 package (scripts/setup does)"
for t in gcc make flex bison bc git patch ccache; do
	command -v $t >/dev/null || die "'$t' not found: run scripts/setup"
done
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9   # one build at a time per cache (the tree is shared)

# 1. pristine source as a git repository (tag rxlane-base)
stamp="$(stat -c '%s %Y' "$tarball")"
if [ ! -d "$src/.git" ] || [ "$(cat "$cache/src.stamp" 2>/dev/null)" != "$stamp" ]; then
	log "unpacking $tarball"
	rm -rf "$src" "$cache/unpack" "$cache/src.applied"
	mkdir -p "$cache/unpack"
	tar -xJf "$tarball" -C "$cache/unpack"
	mv "$cache/unpack"/linux-source-* "$src"
	rmdir "$cache/unpack"
	git -C "$src" init -q
	git -C "$src" add -f -A
	git -C "$src" -c user.name=rxlane -c user.email=rxlane@localhost commit -q -m "linux-source-6.1 ($stamp)"
	git -C "$src" tag rxlane-base
	echo "$stamp" >"$cache/src.stamp"
fi

# 2. the patch series
series=()
if [ "$variant" != vanilla ]; then
	if [ -f "$here/patches/series" ]; then
		while read -r p; do
			case $p in ''|'#'*) continue;; esac
			series+=("$here/patches/$p")
		done <"$here/patches/series"
	else
		for p in "$here"/patches/*.patch; do [ -e "$p" ] && series+=("$p"); done
	fi
fi
want=vanilla
[ ${#series[@]} -gt 0 ] && want=$(cat "${series[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$cache/src.applied" 2>/dev/null)" != "$want" ]; then
	# Apply the series to a scratch index (git apply is stricter than
	# patch -p1: no fuzz), commit it, then check that commit out: git only
	# rewrites the files that differ, so unchanged files keep their mtimes
	# and rebuilds stay incremental.
	idx=$cache/series.index
	rm -f "$cache/src.applied" "$idx"
	GIT_INDEX_FILE=$idx git -C "$src" read-tree rxlane-base
	for p in "${series[@]}"; do
		[ -r "$p" ] || die "patch $(basename "$p") listed in the series is missing"
		if ! out=$(GIT_INDEX_FILE=$idx git -C "$src" apply --cached -p1 "$p" 2>&1); then
			echo "$out" >&2
			die "patch $(basename "$p") does not apply to $(basename "$tarball") on top of the patches before it (see above)"
		fi
		log "applied $(basename "$p")"
	done
	tree=$(GIT_INDEX_FILE=$idx git -C "$src" write-tree)
	commit=$(git -C "$src" -c user.name=rxlane -c user.email=rxlane@localhost commit-tree "$tree" -p rxlane-base -m "series $want")
	rm -f "$idx"
	git -C "$src" checkout -q -f --detach "$commit"
	git -C "$src" clean -q -fdx
	echo "$want" >"$cache/src.applied"
fi
# the selftest's tools need the series' uapi header, whatever variant is built
[ -r "$src/include/uapi/linux/rxlane.h" ] && cp "$src/include/uapi/linux/rxlane.h" "$cache/rxlane_uapi.h"
true

# 3. configuration
out=$cache/build-$variant
mkdir -p "$out"
frags=("$here/config")
case $variant in
on|off)    frags+=("$here/config-$variant");;
debug)     frags+=("$here/config-on" "$here/config-checkers");;
debug-off) frags+=("$here/config-off" "$here/config-checkers");;
esac
export KBUILD_BUILD_TIMESTAMP="rxlane" KBUILD_BUILD_USER=rxlane KBUILD_BUILD_HOST=rxlane
export CCACHE_DIR="$cache/ccache" CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G} CCACHE_BASEDIR="$cache"
tmpcfg=$(mktemp -d)
trap 'rm -rf "$tmpcfg"' EXIT
make -s -C "$src" O="$tmpcfg" tinyconfig >/dev/null
"$src/scripts/kconfig/merge_config.sh" -m -O "$tmpcfg" "$tmpcfg/.config" "${frags[@]}" >/dev/null 2>&1 ||
	die "merge_config.sh failed"
make -s -C "$src" O="$tmpcfg" olddefconfig >/dev/null 2>&1
missing=()
for f in "${frags[@]}"; do
	while read -r line; do
		case $line in
		CONFIG_*=*)
			grep -qxF "$line" "$tmpcfg/.config" || missing+=("$line");;
		'# CONFIG_'*' is not set')
			opt=${line#\# }; opt=${opt%% *}
			grep -q "^$opt=" "$tmpcfg/.config" && missing+=("$line");;
		esac
	done <"$f"
done
# =n lines in a fragment read as "not set"
missing=($(printf '%s\n' "${missing[@]}" | grep -v '=n$' || true))
[ ${#missing[@]} -eq 0 ] || die "config options not honoured (missing dependency?): ${missing[*]}"
if ! cmp -s "$tmpcfg/.config" "$out/.config"; then
	cp "$tmpcfg/.config" "$out/.config"
	log "configuration changed"
fi

# 4. build (CPU-heavy: serialised with other measurements on this machine)
log "building $variant in $out (make -j$jobs, ccache in $CCACHE_DIR)"
start=$(date +%s)
if ! locked make -C "$src" O="$out" -j"$jobs" CC="ccache gcc" HOSTCC="ccache gcc" olddefconfig bzImage >"$out/build.log" 2>&1; then
	grep -E 'error|Error' "$out/build.log" | head -30 >&2 || true
	die "make failed; full log: $out/build.log"
fi
log "built $variant in $(( $(date +%s) - start ))s"
echo "$out/arch/x86/boot/bzImage"
