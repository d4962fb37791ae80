#!/usr/bin/env bash
# Boot a bzImage + initramfs under QEMU with software emulation (TCG, no
# KVM) and several vCPUs, console on stdio.
#
# usage: run-qemu.sh BZIMAGE INITRAMFS MODE [EXTRA_CMDLINE]   MODE: test | shell
# log_buf_len: the guest greps the whole ring buffer for checker reports
# after its suite (a debug kernel logs a lot; nothing may scroll out)
set -euo pipefail
kernel=${1:?usage: run-qemu.sh BZIMAGE INITRAMFS test|shell}
initrd=${2:?}
mode=${3:-test}
extra=${4:-}
cpus=${RXLANE_QEMU_CPUS:-4}
mem=${RXLANE_QEMU_MEM:-768}
command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 not found: install qemu-system-x86 (scripts/setup does)" >&2; exit 1; }
args=(-accel tcg -cpu max -smp "$cpus" -m "$mem" -no-reboot
      -kernel "$kernel" -initrd "$initrd"
      -append "console=ttyS0 log_buf_len=4M panic=-1 oops=panic rxlane.mode=$mode $extra")
if [ "$mode" = shell ]; then
	echo "run-qemu: console on this terminal; Ctrl-A X quits QEMU" >&2
	exec qemu-system-x86_64 "${args[@]}" -nographic
fi
# TCG keeps both host cores busy: serialise with other measurements
# RXLANE_CPU_LOCK=none: the caller already holds the CPU lock.
lock=${RXLANE_CPU_LOCK:-/tmp/rxlane-cpu.lock}
if [ "$lock" = none ]; then
	exec qemu-system-x86_64 "${args[@]}" -display none -monitor none -serial stdio 2>&1 </dev/null
fi
exec flock "$lock" qemu-system-x86_64 "${args[@]}" -display none -monitor none -serial stdio 2>&1 </dev/null
