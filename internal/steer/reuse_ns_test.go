package steer

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// writeState writes a committed steering state: st as the begin record,
// then its attachments and rps changes as intents.
func writeState(t *testing.T, path string, st State) {
	t.Helper()
	atts, rps := st.Attachments, st.RPS
	st.Attachments, st.RPS = nil, nil
	l, err := journal.Create(path, st)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, a := range atts {
		if err := l.Intent(kindFilter, a); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range rps {
		if err := l.Intent(kindRPS, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestStateOfEarlierNamespace: a steering state names its namespace by
// inode, which the kernel gives to a later namespace once this one is
// gone. A state recorded with hostB's inode but another cookie (an
// earlier namespace's) must not undo anything in hostB: disable leaves
// the clsact someone else added to wireB and the rps_cpus they set, and
// drops the state; enable over such a state steers afresh instead of
// refusing ("already enabled"). With hostB's own cookie the same state is
// hostB's, and disable restores the recorded rps_cpus.
func TestStateOfEarlierNamespace(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	ns := tb.NS(testbed.HostB)
	ref, err := netns.Resolve(ns)
	if err != nil {
		t.Fatal(err)
	}
	cookie, err := ref.Cookie()
	if err != nil || cookie == 0 {
		t.Skipf("skipping: no namespace cookie (%v)", err)
	}
	rps := "/sys/class/net/" + testbed.WireB + "/queues/rx-0/rps_cpus"
	// someone else's setup of hostB's wire
	err = testbed.DoSysfsNamed(ns, func() error {
		l, err := netlink.LinkByName(testbed.WireB)
		if err != nil {
			return err
		}
		if err := netlink.QdiscAdd(&netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}); err != nil {
			return err
		}
		return os.WriteFile(rps, []byte("2\n"), 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	before := snapshotNS(t, ns)
	earlier := State{Netns: ns, CPUs: []int{0, 1}, NetnsIno: ref.Ino, NetnsCookie: cookie + 1000,
		Attachments: []Attachment{{Device: testbed.WireB, CreatedClsact: true}},
		RPS:         []RPSChange{{Netns: ns, Dev: testbed.WireB, Queue: "rx-0", Prev: "0"}}}
	state := filepath.Join(t.TempDir(), "steer.json")
	writeState(t, state, earlier)
	if err := Disable(state); err != nil {
		t.Fatalf("disable of an earlier namespace's state: %v", err)
	}
	if after := snapshotNS(t, ns); after != before {
		t.Errorf("disable of an earlier namespace's state changed hostB:\nbefore %s\nafter  %s", before, after)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state kept: %v", err)
	}

	writeState(t, state, earlier)
	t.Cleanup(func() {
		if err := Disable(state); err != nil {
			t.Errorf("disable: %v", err)
		}
	})
	st, err := Enable(Options{Netns: ns, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1, Stages: []string{"vxlan"}, StateFile: state})
	if err != nil {
		t.Fatalf("enable over an earlier namespace's state: %v", err)
	}
	if st.NetnsIno != ref.Ino || st.NetnsCookie != cookie {
		t.Errorf("state records inode %d cookie %d, want hostB's %d and %d", st.NetnsIno, st.NetnsCookie, ref.Ino, cookie)
	}
	if err := Disable(state); err != nil {
		t.Fatal(err)
	}
	if after := snapshotNS(t, ns); after != before {
		t.Errorf("enable and disable left hostB changed:\nbefore %s\nafter  %s", before, after)
	}

	// hostB's own state: its rps change is undone
	own := earlier
	own.NetnsCookie = cookie
	own.Attachments = nil
	writeState(t, state, own)
	if err := Disable(state); err != nil {
		t.Fatal(err)
	}
	err = testbed.DoSysfsNamed(ns, func() error {
		b, err := os.ReadFile(rps)
		if err == nil && string(b) != "0\n" {
			err = fmt.Errorf("rps_cpus %q after disable of hostB's own state, want the recorded 0", b)
		}
		return err
	})
	if err != nil {
		t.Error(err)
	}
}
