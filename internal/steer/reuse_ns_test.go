package steer

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/nodes"
	"github.com/rxlane/rxlane/internal/tcattach"
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
	ref, cookie := testbedtest.RefCookie(t, ns)
	rps := "/sys/class/net/" + testbed.WireB + "/queues/rx-0/rps_cpus"
	// someone else's setup of hostB's wire
	err := testbed.DoSysfsNamed(ns, func() error {
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
	earlier := State{Netns: ns, CPUs: []int{0, 1}, NsMark: NsMark{NetnsIno: ref.Ino, NetnsCookie: cookie + 1000},
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
	// each change carries the mark of the namespace it was made in
	if len(st.RPS) == 0 || len(st.Attachments) == 0 {
		t.Fatalf("enable recorded %d rps changes and %d attachments, want some of each", len(st.RPS), len(st.Attachments))
	}
	want := NsMark{NetnsIno: ref.Ino, NetnsCookie: cookie}
	for _, c := range st.RPS {
		if c.NsMark != want {
			t.Errorf("rps change of %s marked %+v, want hostB's %+v", c.Dev, c.NsMark, want)
		}
	}
	for _, a := range st.Attachments {
		if a.Netns == "" && a.NsMark != want {
			t.Errorf("filter on %s marked %+v, want hostB's %+v", a.Device, a.NsMark, want)
		}
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

// TestChangeInReplacedNamespace: a change steering made in another
// namespace than its own (the sender's checksum offload, a container's
// rps_cpus) carries that namespace's mark; when the namespace at that
// path is no longer the one marked (deleted and another created with
// devices of the same names), disable leaves it alone, and with the
// namespace's own mark it undoes the change.
func TestChangeInReplacedNamespace(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	nsA, nsB := tb.NS(testbed.HostA), tb.NS(testbed.HostB)
	refA, cookieA := testbedtest.RefCookie(t, nsA)
	refB, cookieB := testbedtest.RefCookie(t, nsB)
	before := snapshotNS(t, nsA)
	earlier := NsMark{NetnsIno: refA.Ino, NetnsCookie: cookieA + 1000}
	st := State{Netns: nsB, CPUs: []int{0, 1}, NsMark: NsMark{NetnsIno: refB.Ino, NetnsCookie: cookieB},
		FirstStage: &FirstStage{Device: testbed.WireB, PeerTx: &PeerOffload{Netns: nsA, Dev: testbed.WireA, Prev: false, NsMark: earlier}},
		RPS:        []RPSChange{{Netns: nsA, Dev: testbed.WireA, Queue: "rx-0", Prev: "1", NsMark: earlier}}}
	state := filepath.Join(t.TempDir(), "steer.json")
	writeState(t, state, st)
	if err := Disable(state); err != nil {
		t.Fatalf("disable: %v", err)
	}
	if after := snapshotNS(t, nsA); after != before {
		t.Errorf("disable undid changes marked with an earlier namespace in hostA:\nbefore %s\nafter  %s", before, after)
	}

	// the same changes marked with hostA itself are undone
	own := NsMark{NetnsIno: refA.Ino, NetnsCookie: cookieA}
	st.FirstStage.PeerTx.NsMark, st.RPS[0].NsMark = own, own
	writeState(t, state, st)
	if err := Disable(state); err != nil {
		t.Fatalf("disable: %v", err)
	}
	if after := snapshotNS(t, nsA); after == before {
		t.Errorf("disable of hostA's own changes left hostA as it was: %s", after)
	}
	err := testbed.DoSysfsNamed(nsA, func() error {
		b, err := os.ReadFile("/sys/class/net/" + testbed.WireA + "/queues/rx-0/rps_cpus")
		if err == nil && string(b) != "1\n" {
			err = fmt.Errorf("wireA rps_cpus %q, want the recorded 1", b)
		}
		return err
	})
	if err != nil {
		t.Error(err)
	}
}

// TestParkInReplacedNamespace: the closed loop parks and unparks a
// datapath whose changes reach into a container's namespace (the done
// hook, the veth stage's rps_cpus). When that namespace is replaced
// while steering runs (the container restarted: another namespace at
// the same path, with a device of the same name), park must not restore
// the recorded rps_cpus over the new one's nor remove a filter there,
// and unpark must not attach a filter or write rps_cpus there: disable
// skips a replaced namespace, so such a change would be left behind.
// Replaced before a follower parks, the done hook's program went with
// the old namespace (park must not fail for it); replaced while parked,
// the follower still holds that program (unpark must not attach it).
func TestParkInReplacedNamespace(t *testing.T) {
	for _, whileParked := range []bool{false, true} {
		t.Run(fmt.Sprintf("while-parked=%v", whileParked), func(t *testing.T) {
			tb := testbedtest.Up(t, testbedtest.Config(t))
			nsB, nsC := tb.NS(testbed.HostB), tb.NS(testbed.CtrB)
			// hostB but what goes with the container's namespace: the
			// veth's host end, and with it a port of the bridge (its
			// features).
			hostB := func() string {
				return fmt.Sprint(slices.DeleteFunc(snapshotLines(t, nsB), func(l string) bool {
					return strings.HasPrefix(l, testbed.VhB+" ") || strings.Contains(l, "/"+testbed.VhB+"/") || strings.HasPrefix(l, testbed.BrB+" features")
				}))
			}
			before := hostB()
			state := filepath.Join(t.TempDir(), "steer.json")
			st, err := Enable(Options{Netns: nsB, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85,
				Hysteresis: 0.1, StateFile: state, StartOff: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { Disable(state) })
			m, err := openMaps(st)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			pk := &parking{stateFile: state, st: st, m: m}
			defer pk.close()
			if whileParked {
				if err := pk.park(DrainTimeout); err != nil {
					t.Fatalf("park: %v", err)
				}
			}
			var oldIno uint64 // ctrB's, where the done hook's clsact was added
			for _, a := range st.Attachments {
				if a.Done && a.CreatedClsact {
					oldIno = a.NetnsIno
				}
			}
			theirs := replaceNetns(t, st, nsC)
			unchanged := func(after string) {
				t.Helper()
				if got := snapshotNS(t, nsC); got != theirs {
					t.Errorf("%s changed the replaced namespace:\nbefore %s\nafter  %s", after, theirs, got)
				}
			}
			if !whileParked {
				if err := pk.park(DrainTimeout); err != nil {
					t.Fatalf("park: %v", err)
				}
				unchanged("park")
			}
			if err := pk.unpark(); err != nil {
				t.Fatalf("unpark: %v", err)
			}
			unchanged("unpark")
			if err := pk.park(DrainTimeout); err != nil {
				t.Fatalf("park again: %v", err)
			}
			unchanged("a second park")
			if err := Disable(state); err != nil {
				t.Fatalf("disable: %v", err)
			}
			unchanged("disable")
			// the clsact went with the old namespace: so does its marker
			if ms, _ := filepath.Glob(filepath.Join(tcattach.MarkerDir, fmt.Sprintf("%d-*", oldIno))); oldIno == 0 || len(ms) != 0 {
				t.Errorf("markers %v of the replaced namespace (inode %d) left after disable", ms, oldIno)
			}
			if after := hostB(); after != before {
				t.Errorf("disable left hostB changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// replaceNetns replaces the namespace ns (a container restarted): it is
// deleted and another one made at its path, with a veth of the name of
// every device st changed there, set up by someone else (rps_cpus 2).
// It returns the new namespace's snapshot.
func replaceNetns(t *testing.T, st *State, ns string) string {
	t.Helper()
	var devs []string
	for _, a := range st.Attachments {
		if attachmentNetns(st, a) == ns {
			devs = append(devs, a.Device)
		}
	}
	for _, c := range st.RPS {
		if c.Netns == ns {
			devs = append(devs, c.Dev)
		}
	}
	if len(devs) == 0 {
		t.Fatalf("enable changed nothing in %s (%+v): the test needs a change there", ns, st)
	}
	if err := nodes.DeleteNetns(filepath.Join(nodes.RunNetnsDir, ns)); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.NewNetns(nodes.RunNetnsDir, ns); err != nil {
		t.Fatal(err)
	}
	err := testbed.DoSysfsNamed(ns, func() error {
		for _, d := range devs {
			if _, err := netlink.LinkByName(d); err == nil {
				continue
			}
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: d}, PeerName: d + "p"}); err != nil {
				return err
			}
			if err := os.WriteFile("/sys/class/net/"+d+"/queues/rx-0/rps_cpus", []byte("2\n"), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return snapshotNS(t, ns)
}
