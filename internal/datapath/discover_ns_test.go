package datapath

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// newNamedNS creates a uniquely named namespace, removed in cleanup.
func newNamedNS(t *testing.T) string { return testbedtest.NewNamedNS(t, "rxlanes") }

// TestDiscoverCalicoLike builds a Calico-like routed layout (vxlan.calico
// without a master, a /32 route per pod on a cali* veth, the pod's MAC in
// the neighbour table) and checks discovery finds tunnel, peer, underlay
// and endpoint without knowing any names, and marks the endpoint as needing
// --force.
func TestDiscoverCalicoLike(t *testing.T) {
	requireBPF(t)
	host, pod := newNamedNS(t), newNamedNS(t)
	underMAC := net.HardwareAddr{0x02, 0x10, 0, 0, 0, 1}
	podMAC := net.HardwareAddr{0x0a, 0x58, 0x0a, 0x07, 0x00, 0x02}
	err := inNetns(host, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ens9", HardwareAddr: underMAC}, PeerName: "ens9peer"}); err != nil {
			return err
		}
		u, _ := netlink.LinkByName("ens9")
		netlink.AddrAdd(u, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(198, 18, 9, 2), Mask: net.CIDRMask(24, 32)}})
		netlink.LinkSetUp(u)
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vxlan.calico", MTU: 1450}, VxlanId: 4096, SrcAddr: net.IPv4(198, 18, 9, 2), Port: 4789}
		if err := netlink.LinkAdd(vx); err != nil {
			return err
		}
		v, _ := netlink.LinkByName("vxlan.calico")
		netlink.LinkSetUp(v)
		if err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: v.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_SELF, IP: net.IPv4(198, 18, 9, 1), HardwareAddr: net.HardwareAddr{0x66, 0, 0, 0, 0, 1}}); err != nil {
			return err
		}
		pfd, err := netns.GetFromPath(pod)
		if err != nil {
			return err
		}
		defer pfd.Close()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cali1234", MTU: 1450}, PeerName: "eth0",
			PeerHardwareAddr: podMAC, PeerNamespace: netlink.NsFd(pfd)}); err != nil {
			return err
		}
		c, _ := netlink.LinkByName("cali1234")
		netlink.LinkSetUp(c)
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: c.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Dst: &net.IPNet{IP: net.IPv4(10, 7, 0, 2), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: c.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.IPv4(10, 7, 0, 2), HardwareAddr: podMAC})
	})
	if err != nil {
		t.Fatal(err)
	}
	topo, err := ShowTopology(host)
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Tunnels) != 1 {
		t.Fatalf("tunnels: %+v", topo.Tunnels)
	}
	tn := topo.Tunnels[0]
	if !tn.Routed || tn.VNI != 4096 || tn.Port != 4789 || tn.Underlay != "ens9" || len(tn.Peers) != 1 || tn.Peers[0] != netip.MustParseAddr("198.18.9.1") {
		t.Fatalf("tunnel: %+v", tn)
	}
	if len(topo.Endpoints) != 1 {
		t.Fatalf("endpoints: %+v", topo.Endpoints)
	}
	e := topo.Endpoints[0]
	if e.Dev != "cali1234" || e.IP != netip.MustParseAddr("10.7.0.2") || !bytes.Equal(e.MAC, podMAC) || e.VNI != 4096 || e.Skip != routedSkip || e.MTU != 1450 {
		t.Fatalf("endpoint: %+v", e)
	}
}
