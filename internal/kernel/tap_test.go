package kernel

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

const sampleConsole = `[    0.000000] Linux version 6.1.192 (rxlane@rxlane)
TAP version 13
# kernel 6.1.192, CONFIG_NET_RXLANE=y, 4 CPUs
ok 1 - veth: 100/100 datagrams delivered
not ok 2 - PRISM-batch one-stage priority # received=501 high_index=500 inorder=1
ok 3 - FALCON offline CPU # SKIP no CPU hotplug
ok 4 softnet_stat keeps its format
1..4
rxlane-kernel-reports=0
rxlane-selftest-exit=1
[    9.1] reboot: Power down
`

func TestParseTAP(t *testing.T) {
	r, err := ParseTAP(strings.NewReader(sampleConsole))
	if err != nil {
		t.Fatal(err)
	}
	if r.Plan != 4 || len(r.Tests) != 4 || r.ExitCode != 1 {
		t.Fatalf("plan %d tests %d exit %d, want 4 4 1", r.Plan, len(r.Tests), r.ExitCode)
	}
	if got := r.Tests[1]; got.OK || got.Num != 2 || got.Desc != "PRISM-batch one-stage priority" || got.Reason != "received=501 high_index=500 inorder=1" {
		t.Errorf("test 2 parsed as %+v", got)
	}
	if got := r.Tests[2]; !got.OK || !got.Skip || got.Reason != "no CPU hotplug" {
		t.Errorf("test 3 parsed as %+v", got)
	}
	if got := r.Tests[3]; !got.OK || got.Desc != "softnet_stat keeps its format" {
		t.Errorf("test 4 parsed as %+v", got)
	}
	pass, fail, skip := r.Counts()
	if pass != 2 || fail != 1 || skip != 1 {
		t.Errorf("counts %d/%d/%d, want 2/1/1", pass, fail, skip)
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "1 of 4 selftests failed") {
		t.Errorf("Err() = %v", err)
	}
	if len(r.Diag) != 1 {
		t.Errorf("diagnostics %q", r.Diag)
	}
}

func TestTAPIncomplete(t *testing.T) {
	cases := map[string]string{
		"":                           "no TAP results",
		"TAP version 13\nok 1 - a\n": "without a plan",
		"ok 1 - a\n1..2\nrxlane-selftest-exit=0\n": "planned 2",
		"Bail out! topology setup failed\n":        "bailed out",
		"ok 1 - a\n1..1\n":                         "exit status -1",
		"ok 1 - a\n1..1\nrxlane-selftest-exit=0\n": "kernel log check",
		"ok 1 - a\n1..1\nrxlane-kernel-report: BUG: KASAN: slab-use-after-free in gro_cell_poll+0x1a/0x90\nrxlane-kernel-reports=1\nrxlane-selftest-exit=0\n": "BUG: KASAN: slab-use-after-free",
	}
	for console, want := range cases {
		r, err := ParseTAP(strings.NewReader(console))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Err(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("console %q: Err() = %v, want %q", console, err, want)
		}
	}
	r, _ := ParseTAP(strings.NewReader("ok 1 - a\n1..1\nrxlane-kernel-reports=0\nrxlane-selftest-exit=0\n"))
	if err := r.Err(); err != nil {
		t.Errorf("passing run: %v", err)
	}
}

func TestFindDir(t *testing.T) {
	dir, err := FindDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(dir, "/kernel") {
		t.Errorf("FindDir = %s", dir)
	}
}

func TestOptionsRejectUnknownVariant(t *testing.T) {
	o := Options{Dir: "/nonexistent", Variant: "fast"}
	if err := o.fill(); err == nil {
		t.Error("variant fast accepted")
	}
}

func TestTAPKnownFailure(t *testing.T) {
	r, err := ParseTAP(strings.NewReader("ok 1 - net/veth.sh\nnot ok 2 - net/gro.sh # TODO fails identically compiled out\n1..2\nrxlane-kernel-reports=0\nrxlane-selftest-exit=0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Tests[1]; got.OK || !got.Todo || got.Reason != "fails identically compiled out" {
		t.Errorf("test 2 parsed as %+v", got)
	}
	if err := r.Err(); err != nil {
		t.Errorf("a TODO failure counted: %v", err)
	}
	if pass, fail, skip := r.Counts(); pass != 1 || fail != 0 || skip != 1 {
		t.Errorf("counts %d/%d/%d, want 1/0/1", pass, fail, skip)
	}
}

func TestIsStatic(t *testing.T) {
	if isStatic("/nonexistent") {
		t.Error("a missing file reported static")
	}
	if _, err := os.Stat("/bin/busybox"); err == nil && Missing() == "" {
		// scripts/setup installs busybox-static; mkinitramfs.sh relies on it
		if !isStatic("/bin/busybox") {
			t.Error("/bin/busybox (busybox-static) reported dynamic")
		}
	}
}

// TestKernelCheckPattern applies the guest's grep pattern (kernel/selftest/init,
// kernel_check) to real report lines of the kernel's checkers and to lines
// a clean debug boot prints.
func TestKernelCheckPattern(t *testing.T) {
	b, err := os.ReadFile("../../kernel/selftest/init")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`dmesg \| grep -E '([^']+)'`).FindSubmatch(b)
	if m == nil {
		t.Fatal("kernel_check's grep -E pattern not found in kernel/selftest/init")
	}
	re := regexp.MustCompile(string(m[1]))
	reports := []string{
		"BUG: KASAN: slab-use-after-free in gro_cell_poll+0x1a/0x90",
		"WARNING: possible circular locking dependency detected",
		"WARNING: inconsistent lock state",
		"WARNING: CPU: 1 PID: 0 at net/core/dev.c:6203 net_rx_action+0x2f0/0x3c0",
		"------------[ cut here ]------------",
		"list_add corruption. prev->next should be next (ffff888003c0a0f8), but was 0000000000000000.",
		"list_del corruption, ffff88800a2b1c00->next is LIST_POISON1 (dead000000000100)",
		"BUG: sleeping function called from invalid context at mm/slab.h:742",
		"WARNING: suspicious RCU usage",
		"general protection fault, probably for non-canonical address 0xdffffc0000000000: 0000 [#1] SMP KASAN",
		"kernel BUG at net/core/skbuff.c:4221!",
		"rcu: INFO: rcu_sched self-detected stall on CPU",
		"refcount_t: underflow; use-after-free.",
		" Call Trace:",
	}
	for _, l := range reports {
		if !re.MatchString(l) {
			t.Errorf("checker report not caught: %q", l)
		}
	}
	clean := []string{
		"KernelAddressSanitizer initialized (generic)",
		"Lock dependency validator: Copyright (c) 2006 Red Hat, Inc., Ingo Molnar",
		"... MAX_LOCKDEP_SUBCLASSES:  8",
		"rcu: Hierarchical RCU implementation.",
		"brB: port 1(vxB) entered forwarding state",
		"smpboot: CPU 1 is now offline",
		"Run /init as init process",
	}
	for _, l := range clean {
		if re.MatchString(l) {
			t.Errorf("clean boot line reported: %q", l)
		}
	}
}

// TestPanickedAtBoot: only a guest that panicked before its init printed
// any TAP is booted again; a panic in a test fails the run as before.
func TestPanickedAtBoot(t *testing.T) {
	early := "pnp: PnP ACPI: found 6 devices\nint3: 0000 [#1] SMP\nKernel panic - not syncing: Fatal exception in interrupt\n"
	inTest := "TAP version 13\n1..3\nok 1 - first\nKernel panic - not syncing: Fatal exception\n"
	clean := "TAP version 13\n1..1\nok 1 - first\nrxlane-selftest-exit=0\n"
	for _, c := range []struct {
		name     string
		console  string
		timedOut bool
		want     bool
	}{
		{"panic at boot", early, false, true},
		{"panic in a test", inTest, false, false},
		{"no panic", clean, false, false},
		{"timed out at boot", "booting\n", true, false},
	} {
		tap, err := ParseTAP(strings.NewReader(c.console))
		if err != nil {
			t.Fatal(err)
		}
		r := Run{Console: c.console, TAP: tap, TimedOut: c.timedOut}
		if got := panickedAtBoot(r); got != c.want {
			t.Errorf("%s: panickedAtBoot %v, want %v", c.name, got, c.want)
		}
	}
}
