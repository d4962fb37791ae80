package lanes

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rxlane/rxlane/internal/ethtool"
	"github.com/rxlane/rxlane/internal/policy"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

// xdpOf returns the XDP program ID attached to dev in a namespace (0: none).
func xdpOf(t *testing.T, nsPath, dev string) uint32 {
	t.Helper()
	var id uint32
	if err := inNetns(nsPath, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			id = x.ProgId
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

func groOf(t *testing.T, nsPath, dev string) bool {
	t.Helper()
	var on bool
	if err := inNetns(nsPath, func() (err error) { on, err = ethtool.Get(dev, ethtool.GRO); return }); err != nil {
		t.Fatal(err)
	}
	return on
}

// TestQueueLaneOnTestbed: --mode queue on hostB of a fresh testbed. The
// high-priority UDP flow arrives intact and in order through the XDP lane
// (rule counter counts every datagram, the VXLAN device sees none of them),
// a low-priority flow is untouched (XDP_PASS, normal path), and disable
// removes the XDP program and restores GRO on ctB.
func TestQueueLaneOnTestbed(t *testing.T) {
	tb := testbedtest.Up(t, testbedtest.Config(t))
	hostA := filepath.Join("/run/netns", tb.NS(testbed.HostA))
	hostB := filepath.Join("/run/netns", tb.NS(testbed.HostB))
	ctrB := filepath.Join("/run/netns", tb.NS(testbed.CtrB))
	// The sending veth must not leave inner checksums to an offload: XDP
	// frames reach the container as CHECKSUM_NONE (docs/lanes.md). A real
	// NIC puts correct checksums on the wire; the testbed's sender needs tx
	// off. Restored at the end.
	prevTx, err := ethtool.SetIn(hostA, testbed.WireA, ethtool.TxCsum, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ethtool.SetIn(hostA, testbed.WireA, ethtool.TxCsum, prevTx); err != nil {
			t.Errorf("restore tx on %s: %v", testbed.WireA, err)
		}
	})
	opts := Options{Netns: hostB, StateFile: filepath.Join(t.TempDir(), "datapath.json"),
		TrustOuterCsum: true, SkipNetfilter: true, Mode: ModeQueue}
	t.Cleanup(func() {
		if err := Disable(opts); err != nil {
			t.Errorf("disable: %v", err)
		}
	})
	before := testbedtest.Snapshot(t, tb)
	groBefore := groOf(t, ctrB, testbed.CtB)

	hi := udpListen(t, tb, testbed.CtrB, "198.19.0.2:7000")
	lo := udpListen(t, tb, testbed.CtrB, "198.19.0.2:7001")
	tx := udpListen(t, tb, testbed.CtrA, "198.19.0.1:0")
	sendRecv(t, tx, lo, "198.19.0.2:7001", 1)
	back := udpListen(t, tb, testbed.CtrA, "198.19.0.1:7002")
	sendRecv(t, lo, back, "198.19.0.1:7002", 1)

	var rules policy.Set
	r, _ := policy.Parse(policy.Spec{Dst: "198.19.0.2", Proto: "udp", Port: "7000"})
	if _, err := rules.Add(r); err != nil {
		t.Fatal(err)
	}
	if _, err := Enable(opts, &rules); err != nil {
		t.Fatalf("%+v", err)
	}
	if xdpOf(t, hostB, testbed.WireB) == 0 || !groOf(t, ctrB, testbed.CtB) {
		t.Fatalf("enable: XDP on %s or GRO on %s missing", testbed.WireB, testbed.CtB)
	}
	sync := opts
	sync.Mode = ModeSync
	if _, err := Enable(sync, &rules); err == nil {
		t.Fatal("enabling sync over queue succeeded")
	}

	const n = 200
	vx0 := rxPackets(t, tb, testbed.VxB)
	sendRecv(t, tx, hi, "198.19.0.2:7000", n)
	vx1 := rxPackets(t, tb, testbed.VxB)
	st, err := ReadStats(opts, &rules)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rules[0].Packets != n || st.High.Packets != n {
		t.Fatalf("queue lane counted %d (rule) / %d (high), want %d; fallbacks %v", st.Rules[0].Packets, st.High.Packets, n, st.Fallbacks)
	}
	if vx1-vx0 > 10 {
		t.Fatalf("%s received %d packets during the high-priority flow", testbed.VxB, vx1-vx0)
	}
	sendRecv(t, tx, lo, "198.19.0.2:7001", n)
	vx2 := rxPackets(t, tb, testbed.VxB)
	st2, _ := ReadStats(opts, &rules)
	if st2.Rules[0].Packets != n || vx2-vx1 < n || st2.Fallbacks["no_match"] < n {
		t.Fatalf("low-priority flow: rule %d, %s +%d, no_match %d", st2.Rules[0].Packets, testbed.VxB, vx2-vx1, st2.Fallbacks["no_match"])
	}

	if err := Disable(opts); err != nil {
		t.Fatal(err)
	}
	if err := Disable(opts); err != nil { // repeatable
		t.Fatal(err)
	}
	if after := testbedtest.Snapshot(t, tb); after != before {
		t.Fatalf("host changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if id := xdpOf(t, hostB, testbed.WireB); id != 0 {
		t.Fatalf("XDP program %d left on %s", id, testbed.WireB)
	}
	if g := groOf(t, ctrB, testbed.CtB); g != groBefore {
		t.Fatalf("GRO on %s is %v after disable, was %v", testbed.CtB, g, groBefore)
	}
	if _, err := ReadStats(opts, &rules); !errors.Is(err, ErrNotEnabled) {
		t.Fatalf("stats after disable: %v", err)
	}
	sendRecv(t, tx, hi, "198.19.0.2:7000", 10)
}
