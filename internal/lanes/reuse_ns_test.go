package lanes

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/journal"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/tcattach"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// TestStoreRetiresEarlierNamespace: the kernel gives a gone namespace's
// inode to a later one, so hostB's store may find files that a gone
// namespace with hostB's inode left: its cookie, a rule, a lane record
// that says it added the clsact of a wireB there, and that clsact's
// marker. hostB's wireB has a clsact someone else added. Nothing of it
// may be adopted: the rules read as none, the first change drops all of
// it (and says so), the lane then enables with hostB's own rules only,
// and its disable leaves the other's clsact.
func TestStoreRetiresEarlierNamespace(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	tcattach.MarkerDir = t.TempDir()
	defer func() { tcattach.MarkerDir = "/run/rxlane/clsact" }()
	s, err := OpenStore(t.TempDir(), tb.NS(testbed.HostB))
	if err != nil {
		t.Fatal(err)
	}
	s.PinRoot = ""
	cookie, err := s.NS.Cookie()
	if err != nil {
		t.Fatal(err)
	}
	if cookie == 0 {
		t.Skip("skipping: this kernel has no SO_NETNS_COOKIE")
	}
	earlier := cookie + 1000
	var wireIdx int
	err = s.NS.Do(func() error {
		l, err := netlink.LinkByName(testbed.WireB)
		if err != nil {
			return err
		}
		wireIdx = l.Attrs().Index
		return netlink.QdiscAdd(&netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: wireIdx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"})
	})
	if err != nil {
		t.Fatal(err)
	}
	// what the earlier namespace left
	if err := os.WriteFile(s.CookieFile(), fmt.Appendf(nil, "%d\n", earlier), 0o644); err != nil {
		t.Fatal(err)
	}
	old, _ := policy.Parse(policy.Spec{Dst: "10.99.0.1", Proto: "udp", Port: "9"})
	set := &policy.Set{}
	if _, err := set.Add(old); err != nil {
		t.Fatal(err)
	}
	if err := policy.Save(s.RulesFile(), set); err != nil {
		t.Fatal(err)
	}
	writeRecord(t, s.RecordFile(), laneBegin{Netns: s.NS.Path, NetnsIno: s.NS.Ino, NetnsCookie: earlier, Mode: ModeSync},
		Attachment{Device: testbed.WireB, CreatedClsact: true})
	marker := filepath.Join(tcattach.MarkerDir, fmt.Sprintf("%d-%d", s.NS.Ino, wireIdx))
	if err := os.WriteFile(marker, fmt.Appendf(nil, "%s\n%d", testbed.WireB, earlier), 0o644); err != nil {
		t.Fatal(err)
	}

	if got, err := s.Rules(); err != nil || len(got.Rules) != 0 {
		t.Fatalf("rules %v (%v): want none, the file is the earlier namespace's", got, err)
	}
	mine, _ := policy.Parse(policy.Spec{Dst: testbed.OverlayB.String(), Proto: "udp", Port: "7000"})
	if _, err := s.AddRule(mine); err != nil {
		t.Fatal(err)
	}
	if !s.Retired {
		t.Error("the store did not say it dropped an earlier namespace's files")
	}
	got, err := s.Rules()
	if err != nil || len(got.Rules) != 1 || got.Rules[0].Dst != mine.Dst {
		t.Fatalf("rules after add: %v (%v), want the one added here", got, err)
	}
	for _, f := range []string{s.RecordFile(), marker} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s survived the earlier namespace's retirement (%v)", f, err)
		}
	}
	if b, _ := os.ReadFile(s.CookieFile()); string(b) != fmt.Sprintf("%d\n", cookie) {
		t.Errorf("cookie file %q, want this namespace's %d", b, cookie)
	}

	topo, err := s.Enable(Options{SkipNetfilter: true, TrustOuterCsum: true})
	if err != nil {
		t.Fatal(err)
	}
	if topo.Advice == nil || topo.Advice.Rules != 1 {
		t.Errorf("enabled with advice %+v, want 1 rule", topo.Advice)
	}
	st, err := LoadState(s.RecordFile())
	if err != nil || st == nil || st.NetnsCookie != cookie || slices.ContainsFunc(st.Attachments, func(a Attachment) bool { return a.CreatedClsact }) {
		t.Fatalf("record %+v (%v): want this namespace's cookie %d and no clsact created (someone else's was there)", st, err, cookie)
	}
	if _, err := s.Disable(); err != nil {
		t.Fatal(err)
	}
	err = s.NS.Do(func() error {
		l, err := netlink.LinkByName(testbed.WireB)
		if err != nil {
			return err
		}
		qs, err := netlink.QdiscList(l)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(qs, func(q netlink.Qdisc) bool { return q.Type() == "clsact" }) {
			return fmt.Errorf("the clsact someone else added to %s was removed", testbed.WireB)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// TestDisableDropsEarlierNamespaceRecord: a lane record whose namespace
// path now holds a later namespace with its inode (another cookie) is a
// gone namespace's: disable drops it and detaches nothing there.
func TestDisableDropsEarlierNamespaceRecord(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	ns := tb.NS(testbed.HostB)
	ref, cookie := testbedtest.RefCookie(t, ns)
	rec := filepath.Join(t.TempDir(), "lane.jsonl")
	writeRecord(t, rec, laneBegin{Netns: ref.Path, NetnsIno: ref.Ino, NetnsCookie: cookie + 1000, Mode: ModeSync},
		Attachment{Device: testbed.WireB, CreatedClsact: true})
	r, err := DisableReport(Options{StateFile: rec})
	if err != nil || !r.NetnsGone {
		t.Fatalf("disable: %+v, %v; want the namespace gone", r, err)
	}
	if _, err := os.Stat(rec); !os.IsNotExist(err) {
		t.Errorf("record kept: %v", err)
	}
	// and with this namespace's own cookie the record is its lane's
	writeRecord(t, rec, laneBegin{Netns: ref.Path, NetnsIno: ref.Ino, NetnsCookie: cookie, Mode: ModeSync})
	if r, err := DisableReport(Options{StateFile: rec}); err != nil || r.NetnsGone || !r.Recorded {
		t.Errorf("disable of this namespace's own record: %+v, %v; want recorded, not gone", r, err)
	}
}

// writeRecord writes a committed lane record: begin, one attach intent
// per attachment.
func writeRecord(t *testing.T, path string, begin laneBegin, atts ...Attachment) {
	t.Helper()
	j, err := journal.Create(path, begin)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, a := range atts {
		if err := j.Intent(intentAttach, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Commit(); err != nil {
		t.Fatal(err)
	}
}
