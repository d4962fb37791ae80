package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// crashAt, in a CLI run by a test (RXLANE_CRASH_AT=N), makes the process
// exit with status 3 right after its journal's record N is on disk and
// before the change it announces: a kill at step N.
func crashAt(step string) {
	if step == "" {
		return
	}
	n, _ := strconv.Atoi(step)
	journal.AfterRecord = func(_ string, seq int, _ string) {
		if seq == n {
			os.Exit(3)
		}
	}
}

// laneFilterOn reports whether rxlane's lane filter is attached to dev in
// the namespace file ns.
func laneFilterOn(t *testing.T, ns, dev string) bool {
	t.Helper()
	var on bool
	err := netns.Do(ns, false, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		fs, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return nil // no clsact: no filter
		}
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "rxlane_lanes") {
				on = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return on
}

// lanesTestbed builds a testbed with one rule stored for ctrB's UDP port
// 7000 and returns hostB's name, its namespace file and the state dir.
func lanesTestbed(t *testing.T) (tb testbed.Config, hostB, nsFile, dir string) {
	tb = testbedtest.Up(t, testbedtest.Config(t))
	hostB = tb.NS(testbed.HostB)
	dir = t.TempDir()
	mustRun(t, "lanes", "add", "--netns", hostB, "--state-dir", dir, "--dst", "198.19.0.2", "--proto", "udp", "--port", "7000")
	t.Cleanup(func() { run("lanes", "disable", "--netns", hostB, "--state-dir", dir) })
	return tb, hostB, filepath.Join("/run/netns", hostB), dir
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(args...)
	if err != nil {
		t.Fatalf("rxlane %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestLanesOneNamespaceUnderEverySpelling: a lane enabled with --netns
// NAME is the lane of /run/netns/NAME and /var/run/netns/NAME too: list,
// stats and disable with another spelling find it, and disable removes
// the filter (the state file used to be named after the spelling).
func TestLanesOneNamespaceUnderEverySpelling(t *testing.T) {
	tb, hostB, nsFile, dir := lanesTestbed(t)
	before := testbedtest.Snapshot(t, tb)
	mustRun(t, "lanes", "enable", "--netns", hostB, "--state-dir", dir, "--skip-netfilter", "--trust-outer-csum")
	other := "/var/run/netns/" + hostB
	if out := mustRun(t, "lanes", "list", "--netns", other, "--state-dir", dir); !strings.Contains(out, "198.19.0.2") {
		t.Errorf("list --netns %s does not show the rule:\n%s", other, out)
	}
	if out := mustRun(t, "lanes", "stats", "--netns", other, "--state-dir", dir); !strings.Contains(out, "skip netfilter: yes") {
		t.Errorf("stats --netns %s does not show the enabled lane:\n%s", other, out)
	}
	if out := mustRun(t, "lanes", "disable", "--netns", other, "--state-dir", dir); !strings.Contains(out, "lane disabled") {
		t.Errorf("disable --netns %s says:\n%s", other, out)
	}
	if laneFilterOn(t, nsFile, testbed.WireB) {
		t.Fatal("disable with the other spelling left the filter attached")
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("hostB after disable differs:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestLanesReenableAppliesOrRefuses: re-enabling with another --dev,
// --mode or --trust-outer-csum is refused with the difference named and
// changes nothing (it used to attach a second filter and forget the
// first); the same options re-sync, a changed --skip-netfilter is applied
// and shown; disable then restores the host exactly.
func TestLanesReenableAppliesOrRefuses(t *testing.T) {
	tb, hostB, nsFile, dir := lanesTestbed(t)
	before := testbedtest.Snapshot(t, tb)
	base := []string{"lanes", "enable", "--netns", hostB, "--state-dir", dir, "--trust-outer-csum"}
	mustRun(t, base...)
	enabled := testbedtest.Snapshot(t, tb)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dev", testbed.BrB}, `--dev "` + testbed.BrB + `"`},
		{[]string{"--mode", "queue"}, "--mode queue"},
		{[]string{"--trust-outer-csum=false"}, "--trust-outer-csum=false"},
	} {
		out, err := run(append(slicesClone(base), tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("re-enable with %v: %v (want a refusal naming %s)\n%s", tc.args, err, tc.want, out)
		}
		if now := testbedtest.Snapshot(t, tb); now != enabled {
			t.Errorf("refused re-enable with %v changed the host:\nbefore:\n%s\nafter:\n%s", tc.args, enabled, now)
		}
	}
	mustRun(t, base...)
	if out := mustRun(t, "lanes", "stats", "--netns", hostB, "--state-dir", dir); !strings.Contains(out, "skip netfilter: no") {
		t.Errorf("stats before --skip-netfilter:\n%s", out)
	}
	mustRun(t, append(slicesClone(base), "--skip-netfilter")...)
	if out := mustRun(t, "lanes", "stats", "--netns", hostB, "--state-dir", dir); !strings.Contains(out, "skip netfilter: yes") {
		t.Errorf("stats after a re-enable with --skip-netfilter:\n%s", out)
	}
	mustRun(t, "lanes", "disable", "--netns", hostB, "--state-dir", dir)
	if laneFilterOn(t, nsFile, testbed.WireB) || laneFilterOn(t, nsFile, testbed.BrB) {
		t.Fatal("a filter stayed attached after disable")
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("hostB after disable differs:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// TestLanesLostRecord: with the lane's record gone (another --state-dir,
// or the file removed), stats still reports the attached lane with a
// warning, enable (of either mode) refuses without a stack trace, and
// disable finds rxlane's program by name and removes it.
func TestLanesLostRecord(t *testing.T) {
	tb, hostB, nsFile, dir := lanesTestbed(t)
	before := testbedtest.Snapshot(t, tb)
	mustRun(t, "lanes", "enable", "--netns", hostB, "--state-dir", dir, "--trust-outer-csum")
	other := t.TempDir()
	out := mustRun(t, "lanes", "stats", "--netns", hostB, "--state-dir", other)
	if !strings.Contains(out, "WARNING") || !strings.Contains(out, "no record") {
		t.Errorf("stats without the record:\n%s", out)
	}
	for _, mode := range []string{"sync", "queue"} {
		out, err := run("lanes", "enable", "--netns", hostB, "--state-dir", other, "--mode", mode, "--trust-outer-csum")
		if err == nil || !strings.Contains(err.Error(), "without a record") {
			t.Errorf("enable --mode %s without the record: %v\n%s", mode, err, out)
		}
	}
	out = mustRun(t, "lanes", "disable", "--netns", hostB, "--state-dir", other)
	if !strings.Contains(out, "removed rxlane's lane program from "+testbed.WireB) {
		t.Errorf("disable without the record says:\n%s", out)
	}
	if laneFilterOn(t, nsFile, testbed.WireB) {
		t.Fatal("disable without the record left the filter attached")
	}
	// The first record still names the clsact the lane added: its disable
	// removes that too, and the host is as it was.
	mustRun(t, "lanes", "disable", "--netns", hostB, "--state-dir", dir)
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Errorf("hostB after both disables differs:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// A record deleted behind rxlane's back: the same.
	mustRun(t, "lanes", "enable", "--netns", hostB, "--state-dir", dir, "--trust-outer-csum")
	recs, _ := filepath.Glob(filepath.Join(dir, "*.lane.jsonl"))
	if len(recs) != 1 {
		t.Fatalf("records in %s: %v", dir, recs)
	}
	os.Remove(recs[0])
	if out := mustRun(t, "lanes", "disable", "--netns", hostB, "--state-dir", dir); !strings.Contains(out, "removed rxlane's lane program") {
		t.Errorf("disable with the record deleted says:\n%s", out)
	}
	if laneFilterOn(t, nsFile, testbed.WireB) {
		t.Fatal("disable with the record deleted left the filter attached")
	}
}

// TestLanesCrashAtEveryStep kills `lanes enable` (a real exit of its own
// process) right after each record of its journal is on disk, before the
// change it announces, for every step of both modes; `lanes disable` must
// then leave the testbed exactly as before the enable and remove the
// record. The last run is the one that completes.
func TestLanesCrashAtEveryStep(t *testing.T) {
	tb, hostB, _, dir := lanesTestbed(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	before := testbedtest.Snapshot(t, tb)
	for _, mode := range []string{"sync", "queue"} {
		for step := 0; ; step++ {
			c := exec.Command(self, "-test.run=^$", "--", "lanes", "enable", "--netns", hostB, "--state-dir", dir,
				"--mode", mode, "--skip-netfilter", "--trust-outer-csum")
			c.Env = append(os.Environ(), "RXLANE_RUN_CLI=1", "RXLANE_CRASH_AT="+strconv.Itoa(step))
			out, err := c.CombinedOutput()
			var ee *exec.ExitError
			crashed := errors.As(err, &ee) && ee.ExitCode() == 3
			if err != nil && !crashed {
				t.Fatalf("%s enable, crash at step %d: %v\n%s", mode, step, err, out)
			}
			recs, _ := filepath.Glob(filepath.Join(dir, "*.lane.jsonl"))
			if len(recs) != 1 {
				t.Fatalf("%s step %d: records %v, want one", mode, step, recs)
			}
			rec, err := journal.Read(recs[0])
			if err != nil {
				t.Fatal(err)
			}
			if crashed && !rec.Committed {
				// A later enable refuses until the interrupted one is undone.
				if out, err := run("lanes", "enable", "--netns", hostB, "--state-dir", dir, "--mode", mode); err == nil || !strings.Contains(err.Error(), "interrupted") {
					t.Errorf("%s step %d: enable over an interrupted record: %v\n%s", mode, step, err, out)
				}
			}
			mustRun(t, "lanes", "disable", "--netns", hostB, "--state-dir", dir)
			if after := testbedtest.Snapshot(t, tb); after != before {
				t.Fatalf("%s enable killed at step %d: host after disable differs:\nbefore:\n%s\nafter:\n%s", mode, step, before, after)
			}
			if recs, _ := filepath.Glob(filepath.Join(dir, "*.lane.jsonl")); len(recs) != 0 {
				t.Fatalf("%s step %d: record left after disable: %v", mode, step, recs)
			}
			if !crashed {
				t.Logf("%s: enable completes after %d steps; disable restored the host after a kill at each", mode, step)
				if step < 3 {
					t.Errorf("%s: only %d steps: the journal records less than begin, an attach and commit", mode, step)
				}
				break
			}
		}
	}
}

// TestLanesAddNamesTheRuleLimit: the 65th rule is refused at add as a
// usage error naming the limit, and the file keeps 64.
func TestLanesAddNamesTheRuleLimit(t *testing.T) {
	testbedtest.RequireRoot(t)
	ns := testbedtest.NewNamedNS(t, "rxl-limit")
	dir := t.TempDir()
	for i := range 64 {
		mustRun(t, "lanes", "add", "--netns", ns, "--state-dir", dir, "--dst", "10.9.0."+strconv.Itoa(i))
	}
	out, err := run("lanes", "add", "--netns", ns, "--state-dir", dir, "--dst", "10.9.1.1")
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "at most 64 rules") {
		t.Fatalf("65th rule: %v (want a usage error naming the limit)\n%s", err, out)
	}
	if out := mustRun(t, "lanes", "list", "--netns", ns, "--state-dir", dir); strings.Count(out, "\n") != 65 {
		t.Errorf("list after the refused add:\n%s", out)
	}
}
