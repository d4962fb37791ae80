package kernel

import (
	"os"
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
	r, _ := ParseTAP(strings.NewReader("ok 1 - a\n1..1\nrxlane-selftest-exit=0\n"))
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
	r, err := ParseTAP(strings.NewReader("ok 1 - net/veth.sh\nnot ok 2 - net/gro.sh # TODO fails identically compiled out\n1..2\nrxlane-selftest-exit=0\n"))
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
