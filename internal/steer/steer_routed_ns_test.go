package steer

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/rxlane/rxlane/internal/netnsrun"
	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// routedLayout is an operator's routed VXLAN layout, rebuilt in fresh
// namespaces: Calico (vxlan.calico, a /32 route per pod on its cali*
// veth, no bridge) or Flannel (flannel.1 on port 8472, the pods' subnet
// routed to the cni0 bridge).
type routedLayout struct {
	name     string
	vxlan    string
	vni      int
	port     int
	bridge   string // "": routes straight to the pod's veth
	hostVeth string
	// vxlan6 is the dual-stack node's second device: the same port and
	// VNI over the IPv6 underlay, carrying the pods' IPv6 traffic.
	vxlan6 string
}

var routedLayouts = []routedLayout{
	{name: "calico", vxlan: "vxlan.calico", vni: 4096, port: 4789, hostVeth: "cali1234", vxlan6: "vxlan-v6.calico"},
	{name: "flannel", vxlan: "flannel.1", vni: 1, port: 8472, bridge: "cni0", hostVeth: "veth1234", vxlan6: "flannel-v6.1"},
}

var (
	vxHostMAC   = net.HardwareAddr{0x66, 0x10, 0, 0, 0, 2}
	vxRemoteMAC = net.HardwareAddr{0x66, 0x10, 0, 0, 0, 1}
	// The dual-stack layouts' IPv6 VXLAN devices.
	vxHostMAC6   = net.HardwareAddr{0x66, 0x10, 0, 0, 6, 2}
	vxRemoteMAC6 = net.HardwareAddr{0x66, 0x10, 0, 0, 6, 1}
	podMAC       = net.HardwareAddr{0x0a, 0x58, 0x0a, 0x07, 0x00, 0x02}
	podV4        = netip.MustParseAddr("10.7.0.2")
	podV6        = netip.MustParseAddr("fd00:7::2")
	remoteV4     = netip.MustParseAddr("10.7.1.1")
	remoteV6     = netip.MustParseAddr("fd00:7:1::1")
)

// newNamedNS creates a uniquely named namespace, removed in cleanup, and
// returns its name.
func newNamedNS(t *testing.T) string { return filepath.Base(testbedtest.NewNamedNS(t, "rxst")) }

func inNS(t *testing.T, ns string, fn func() error) {
	t.Helper()
	if err := netnsrun.Do(filepath.Join("/run/netns", ns), false, fn); err != nil {
		t.Fatal(err)
	}
}

func prefix(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

// addAddr adds a without duplicate address detection (IPv6 addresses are
// usable at once).
func addAddr(l netlink.Link, a netip.Addr, bits int) error {
	return netlink.AddrAdd(l, &netlink.Addr{IPNet: prefix(a, bits), Flags: unix.IFA_F_NODAD})
}

// hostRoute routes a through dev and pins its neighbour to mac (no ARP or
// neighbour discovery needed).
func hostRoute(dev netlink.Link, a netip.Addr, mac net.HardwareAddr) error {
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: dev.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: prefix(a, a.BitLen())}); err != nil {
		return fmt.Errorf("route %s: %w", a, err)
	}
	return pinNeigh(dev, a, mac)
}

func pinNeigh(dev netlink.Link, a netip.Addr, mac net.HardwareAddr) error {
	fam := netlink.FAMILY_V4
	if a.Is6() {
		fam = netlink.FAMILY_V6
	}
	return netlink.NeighAdd(&netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT, IP: a.AsSlice(), HardwareAddr: mac})
}

// vtep adds a VXLAN device whose remote VTEP for peerMAC is peer.
func vtep(name string, mac net.HardwareAddr, vni, port int, local, peer netip.Addr, under netlink.Link, peerMAC net.HardwareAddr) (netlink.Link, error) {
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1450, HardwareAddr: mac}, VxlanId: vni,
		SrcAddr: local.AsSlice(), Port: port, VtepDevIndex: under.Attrs().Index}
	if err := netlink.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("add %s: %w", name, err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, err
	}
	return l, netlink.NeighAppend(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: peer.AsSlice(), HardwareAddr: peerMAC})
}

func writeSysctl(path, v string) error {
	return os.WriteFile(filepath.Join("/proc/sys", path), []byte(v), 0o644)
}

// buildRouted builds the layout: a remote host (its VTEP and the sender's
// inner addresses), the receiving host (underlay ens9, the layout's VXLAN
// device, forwarding on) and one pod with an IPv4 and an IPv6 address.
// Inner IPv6 goes over the IPv4 underlay too, unless dual: then, as on a
// dual-stack node, over a second device (lay.vxlan6) on the underlay's
// IPv6 addresses.
func buildRouted(t *testing.T, lay routedLayout, dual bool) (remote, host, pod string) {
	t.Helper()
	remote, host, pod = newNamedNS(t), newNamedNS(t), newNamedNS(t)
	under, underPeer := netip.MustParseAddr("198.18.9.2"), netip.MustParseAddr("198.18.9.1")
	under6, underPeer6 := netip.MustParseAddr("fd00:18:9::2"), netip.MustParseAddr("fd00:18:9::1")
	// innerVia says which device carries traffic to an inner address.
	innerVia := func(a netip.Addr, v4, v6 netlink.Link) netlink.Link {
		if dual && a.Is6() {
			return v6
		}
		return v4
	}
	inNS(t, host, func() error {
		lo, _ := netlink.LinkByName("lo")
		netlink.LinkSetUp(lo)
		for _, s := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := writeSysctl(s, "1"); err != nil {
				return err
			}
		}
		rfd, err := netns.GetFromName(remote)
		if err != nil {
			return err
		}
		defer rfd.Close()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ens9"}, PeerName: "ens9peer", PeerNamespace: netlink.NsFd(rfd)}); err != nil {
			return err
		}
		u, _ := netlink.LinkByName("ens9")
		if err := addAddr(u, under, 24); err != nil {
			return err
		}
		netlink.LinkSetUp(u)
		vx, err := vtep(lay.vxlan, vxHostMAC, lay.vni, lay.port, under, underPeer, u, vxRemoteMAC)
		if err != nil {
			return err
		}
		vx6 := vx
		if dual {
			if err := addAddr(u, under6, 64); err != nil {
				return err
			}
			if vx6, err = vtep(lay.vxlan6, vxHostMAC6, lay.vni, lay.port, under6, underPeer6, u, vxRemoteMAC6); err != nil {
				return err
			}
		}
		// The remote's inner addresses are behind the tunnel (replies,
		// reverse-path filter), as both CNIs route them.
		for _, a := range []netip.Addr{remoteV4, remoteV6} {
			mac := vxRemoteMAC
			if dual && a.Is6() {
				mac = vxRemoteMAC6
			}
			if err := hostRoute(innerVia(a, vx, vx6), a, mac); err != nil {
				return err
			}
		}
		pfd, err := netns.GetFromName(pod)
		if err != nil {
			return err
		}
		defer pfd.Close()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: lay.hostVeth, MTU: 1450}, PeerName: "eth0",
			PeerHardwareAddr: podMAC, PeerNamespace: netlink.NsFd(pfd)}); err != nil {
			return err
		}
		hv, _ := netlink.LinkByName(lay.hostVeth)
		if lay.bridge == "" {
			netlink.LinkSetUp(hv)
			for _, a := range []netip.Addr{podV4, podV6} {
				if err := hostRoute(hv, a, podMAC); err != nil {
					return err
				}
			}
			return nil
		}
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: lay.bridge, MTU: 1450}}); err != nil {
			return err
		}
		br, _ := netlink.LinkByName(lay.bridge)
		if err := netlink.LinkSetMaster(hv, br); err != nil {
			return err
		}
		netlink.LinkSetUp(hv)
		netlink.LinkSetUp(br)
		if err := addAddr(br, netip.MustParseAddr("10.7.0.1"), 24); err != nil {
			return err
		}
		if err := addAddr(br, netip.MustParseAddr("fd00:7::1"), 64); err != nil {
			return err
		}
		if err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: hv.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_MASTER, HardwareAddr: podMAC}); err != nil {
			return fmt.Errorf("fdb: %w", err)
		}
		for _, a := range []netip.Addr{podV4, podV6} {
			if err := pinNeigh(br, a, podMAC); err != nil {
				return err
			}
		}
		return nil
	})
	inNS(t, pod, func() error {
		lo, _ := netlink.LinkByName("lo")
		netlink.LinkSetUp(lo)
		e, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		netlink.LinkSetUp(e)
		if err := addAddr(e, podV4, 32); err != nil {
			return err
		}
		return addAddr(e, podV6, 128)
	})
	inNS(t, remote, func() error {
		lo, _ := netlink.LinkByName("lo")
		netlink.LinkSetUp(lo)
		u, err := netlink.LinkByName("ens9peer")
		if err != nil {
			return err
		}
		if err := addAddr(u, underPeer, 24); err != nil {
			return err
		}
		netlink.LinkSetUp(u)
		vx, err := vtep("vxr", vxRemoteMAC, lay.vni, lay.port, underPeer, under, u, vxHostMAC)
		if err != nil {
			return err
		}
		vx6 := vx
		if dual {
			if err := addAddr(u, underPeer6, 64); err != nil {
				return err
			}
			if vx6, err = vtep("vxr6", vxRemoteMAC6, lay.vni, lay.port, underPeer6, under6, u, vxHostMAC6); err != nil {
				return err
			}
		}
		for _, a := range []netip.Addr{remoteV4, remoteV6} {
			if err := addAddr(innerVia(a, vx, vx6), a, a.BitLen()); err != nil {
				return err
			}
		}
		for _, a := range []netip.Addr{podV4, podV6} {
			mac := vxHostMAC
			if dual && a.Is6() {
				mac = vxHostMAC6
			}
			if err := hostRoute(innerVia(a, vx, vx6), a, mac); err != nil {
				return err
			}
		}
		return nil
	})
	return remote, host, pod
}

// onlyPath discovers the tunnels of ns and requires exactly one.
func onlyPath(t *testing.T, ns string) tunnelPath {
	t.Helper()
	ps, err := discover(ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		t.Fatalf("discovered %d tunnels in %s, want 1: %+v", len(ps), ns, ps)
	}
	return ps[0]
}

func listenIn(t *testing.T, ns string, a netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	inNS(t, ns, func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(a))
		return err
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestSteerOnRoutedLayouts: on Calico's and Flannel's layouts, built in
// fresh namespaces, discovery finds the routed tunnel, its underlay and the
// pod's device with both addresses; for an IPv4 and an IPv6 flow, each
// steered stage runs in CPU 0's backlog exactly when the rule chose CPU 0
// (first choice), not when CPU 0 is published busy (second choice); every
// datagram arrives in order; disable leaves host and pod as they were.
func TestSteerOnRoutedLayouts(t *testing.T) {
	testbedtest.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	for _, lay := range routedLayouts {
		t.Run(lay.name, func(t *testing.T) {
			remote, host, pod := buildRouted(t, lay, false)
			d := onlyPath(t, host)
			if d.tunnel.Name != lay.vxlan || !d.tunnel.Routed || d.tunnel.Underlay != "ens9" || len(d.endpoint) != 1 {
				t.Fatalf("discovered tunnel %+v, endpoints %+v", d.tunnel, d.endpoint)
			}
			ep := d.endpoint[0]
			slices.SortFunc(ep.ips, func(a, b netip.Addr) int { return a.Compare(b) })
			if ep.dev != "eth0" || ep.netns != pod || !slices.Equal(ep.ips, []netip.Addr{podV4, podV6}) {
				t.Fatalf("endpoint %+v, want eth0 in %s with %v and %v", ep, pod, podV4, podV6)
			}
			beforeH, beforeP := snapshotNS(t, host), snapshotNS(t, pod)
			stageIfindex := map[string]uint32{"vxlan": uint32(d.vxIndex), "veth": uint32(ep.ifindex)}
			for _, fam := range []struct {
				name     string
				src, dst netip.Addr
			}{{"ipv4", remoteV4, podV4}, {"ipv6", remoteV6, podV6}} {
				dst := netip.AddrPortFrom(fam.dst, 7000)
				rx := listenIn(t, pod, dst)
				for _, stage := range []string{"vxlan", "veth"} {
					t.Run(fam.name+"/"+stage, func(t *testing.T) {
						steerStageOnCPU0(t, host, remote, fam.src, dst, rx, stage, stageIfindex[stage])
						if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != beforeH || p != beforeP {
							t.Errorf("kernel state differs after disable:\nhost before %s\nafter %s\npod before %s\nafter %s", beforeH, h, beforeP, p)
						}
					})
				}
			}
		})
	}
}

// TestSteerOnDualStackLayouts: a dual-stack Calico or Flannel node has two
// VXLAN devices on one port and VNI (vxlan.calico and vxlan-v6.calico,
// flannel.1 and flannel-v6.1) that the kernel tells apart by the
// underlay's family. One enable steers both: discovery finds both, their
// families and the pod behind each; the IPv4 flow's S2 runs where the rule
// puts the IPv4 device's stage and the IPv6 flow's where it puts the IPv6
// device's (a port is chosen for which the other device's id would give
// the other CPU), the pod's stage for both; disable restores everything.
func TestSteerOnDualStackLayouts(t *testing.T) {
	testbedtest.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	for _, lay := range routedLayouts {
		t.Run(lay.name, func(t *testing.T) {
			remote, host, pod := buildRouted(t, lay, true)
			ps, err := discover(host)
			if err != nil {
				t.Fatal(err)
			}
			if len(ps) != 2 {
				t.Fatalf("discovered %d tunnels, want %s and %s: %+v", len(ps), lay.vxlan, lay.vxlan6, ps)
			}
			slices.SortFunc(ps, func(a, b tunnelPath) int { return a.tunnel.Family - b.tunnel.Family })
			for i, want := range []struct {
				name   string
				family int
			}{{lay.vxlan, 4}, {lay.vxlan6, 6}} {
				p := ps[i]
				if p.tunnel.Name != want.name || p.tunnel.Family != want.family || !p.tunnel.Routed || p.tunnel.Underlay != "ens9" ||
					len(p.endpoint) != 1 || p.endpoint[0].dev != "eth0" || p.endpoint[0].netns != pod || len(p.endpoint[0].ips) != 2 {
					t.Fatalf("tunnel %d: %+v with endpoints %+v, want %s over IPv%d to eth0 in %s with both addresses", i, p.tunnel, p.endpoint, want.name, want.family, pod)
				}
			}
			beforeH, beforeP := snapshotNS(t, host), snapshotNS(t, pod)
			state := filepath.Join(t.TempDir(), "steer.json")
			st, err := Enable(Options{Netns: host, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, StateFile: state})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range st.Stages {
				names = append(names, s.Name+":"+s.Device)
			}
			if want := []string{"vxlan:" + lay.vxlan, "veth:eth0", "vxlan:" + lay.vxlan6}; !slices.Equal(names, want) {
				t.Errorf("stages %v, want %v (the pod's device once)", names, want)
			}
			if err := Disable(state); err != nil {
				t.Fatal(err)
			}
			v4, v6, ep := uint32(ps[0].vxIndex), uint32(ps[1].vxIndex), uint32(ps[0].endpoint[0].ifindex)
			for _, fam := range []struct {
				name      string
				src, dst  netip.Addr
				vx, other uint32
			}{{"ipv4", remoteV4, podV4, v4, v6}, {"ipv6", remoteV6, podV6, v6, v4}} {
				dst := netip.AddrPortFrom(fam.dst, 7000)
				rx := listenIn(t, pod, dst)
				t.Run(fam.name+"/vxlan", func(t *testing.T) {
					steerStageOnCPU0(t, host, remote, fam.src, dst, rx, "vxlan", fam.vx, fam.other)
				})
				t.Run(fam.name+"/veth", func(t *testing.T) {
					steerStageOnCPU0(t, host, remote, fam.src, dst, rx, "veth", ep)
				})
			}
			if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != beforeH || p != beforeP {
				t.Errorf("kernel state differs after disable:\nhost before %s\nafter %s\npod before %s\nafter %s", beforeH, h, beforeP, p)
			}
		})
	}
}

// steerStageOnCPU0 steers one stage (steering enabled for host, a name or
// a path) for a flow from src (a socket in remote) whose hash puts that
// stage on CPU 0, and checks where it ran (the sender is pinned to CPU 1,
// where the unsteered stages run).
//
// The rule must put the stage on CPU 1 for every stage id in other (the
// ids a wrong lookup would hash), so that only the right id passes.
func steerStageOnCPU0(t *testing.T, host, remote string, src netip.Addr, dst netip.AddrPort, rx *net.UDPConn, stage string, stageID uint32, other ...uint32) {
	const n = 500
	tx := senderOnCPU0(t, remote, src, dst, stageID, other...)
	state := filepath.Join(t.TempDir(), "steer.json")
	t.Cleanup(func() {
		if err := Disable(state); err != nil {
			t.Errorf("disable: %v", err)
		}
	})
	if _, err := Enable(Options{Netns: host, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1,
		Stages: []string{stage}, StateFile: state}); err != nil {
		t.Fatal(err)
	}
	// Steering S2 moves S3 too (the pod's device has no RPS: its
	// netif_rx queues to the current CPU's backlog).
	want := float64(n)
	if stage == "vxlan" {
		want = 2 * n
	}
	for _, c := range []struct {
		name  string
		loads map[int]float64
		cpu0  bool
	}{
		{"first choice", map[int]float64{0: 0.1, 1: 0.1}, true},
		{"second choice", map[int]float64{0: 0.95, 1: 0.1}, false},
	} {
		if err := Loads(state, c.loads, true); err != nil {
			t.Fatal(err)
		}
		got := backlogPackets(t, func() { sendSeq(t, tx, rx, dst.String(), n, 1) })
		t.Logf("%s %s: backlog packets per CPU %v", stage, c.name, got)
		if c.cpu0 && got[0] < want-10 {
			t.Errorf("%s: CPU 0 backlog ran %v packets, want the stage's %v", c.name, got[0], want)
		}
		if !c.cpu0 && got[0] >= n/2 {
			t.Errorf("%s: CPU 0 backlog ran %v packets, want (almost) none", c.name, got[0])
		}
	}
	st, err := ReadStatus(state)
	if err != nil {
		t.Fatal(err)
	}
	// (no_flow may count the namespaces' own IPv6 link-local chatter.)
	if st.Counters["first"] < n || st.Counters["second"] < n {
		t.Errorf("counters %v: want >= %d first and second choices", st.Counters, n)
	}
	if err := Disable(state); err != nil {
		t.Fatal(err)
	}
}

// senderOnCPU0 opens, in remote, a socket on src whose flow to dst the rule
// puts on CPU 0 of {0, 1} (both idle) for stage stageID and on CPU 1 for
// every stage id in other.
func senderOnCPU0(t *testing.T, remote string, src netip.Addr, dst netip.AddrPort, stageID uint32, other ...uint32) *net.UDPConn {
	t.Helper()
	cpuOf := func(h, id uint32) int {
		i, _ := Choose(ChoiceInput{FlowHash: h, Stage: id, CPUs: []int{0, 1}, Loads: []float64{0, 0}, Threshold: 0.85, On: true})
		return i
	}
	for p := uint16(20000); p < 20200; p++ {
		h := FlowHash(src, dst.Addr(), p, dst.Port(), unix.IPPROTO_UDP)
		if cpuOf(h, stageID) == 0 && !slices.ContainsFunc(other, func(id uint32) bool { return cpuOf(h, id) == 0 }) {
			return listenIn(t, remote, netip.AddrPortFrom(src, p))
		}
	}
	t.Fatal("no sender port whose flow hashes to CPU 0")
	return nil
}

// TestSteerTwoDockerNetworks: two Docker overlay networks (two sandboxes,
// VNIs 4242 and 4243) share the host's underlay. Each network is enabled
// on its own: the second instance's entry goes on the host's eth0 as a
// second filter (handle 2) and each entry leaves the other's packets alone,
// so each network's flow has its S2 on the CPU its own instance's rule
// chooses, whichever filter runs first, and only its own instance counts
// it; enabling a network twice is refused; disabling in either order
// restores host, sandboxes and containers.
func TestSteerTwoDockerNetworks(t *testing.T) {
	testbedtest.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	remoteP, hostP := testbedtest.DockerHosts(t)
	nets := []testbedtest.DockerNet{testbedtest.DockerNetwork(t, remoteP, hostP, 0), testbedtest.DockerNetwork(t, remoteP, hostP, 1)}
	remote, host := filepath.Base(remoteP), filepath.Base(hostP)
	snap := func() []string {
		out := []string{snapshotNS(t, host)}
		for _, n := range nets {
			out = append(out, snapshotNS(t, filepath.Base(n.Sandbox)), snapshotNS(t, filepath.Base(n.Ctr)))
		}
		return out
	}
	b0 := snap()
	type flow struct {
		tx, rx *net.UDPConn
		dst    netip.AddrPort
	}
	var flows []flow
	for _, n := range nets {
		d := onlyPath(t, n.Sandbox)
		if d.underlayNS != host || d.tunnel.Underlay != "eth0" || d.tunnel.VNI != uint32(n.VNI) {
			t.Fatalf("network %d: discovered %+v in %s", n.VNI, d.tunnel, d.underlayNS)
		}
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(n.CtrIP.To4())), 7000)
		src := netip.AddrFrom4([4]byte(n.RemoteIP.To4()))
		flows = append(flows, flow{senderOnCPU0(t, remote, src, dst, uint32(d.vxIndex)), listenIn(t, filepath.Base(n.Ctr), dst), dst})
	}
	for _, lastOut := range []int{1, 0} {
		t.Run(fmt.Sprintf("network %d disabled last", lastOut), func(t *testing.T) {
			states := []string{filepath.Join(t.TempDir(), "a.json"), filepath.Join(t.TempDir(), "b.json")}
			for i, n := range nets {
				t.Cleanup(func() { Disable(states[i]) })
				st, err := Enable(Options{Netns: n.Sandbox, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Stages: []string{"vxlan"}, StateFile: states[i]})
				if err != nil {
					t.Fatalf("enable network %d: %v", i, err)
				}
				wantHandle := uint32(0)
				if i == 1 {
					wantHandle = 2
				}
				if !slices.ContainsFunc(st.Attachments, func(a Attachment) bool { return a.Device == "eth0" && a.Netns == host && a.Handle == wantHandle }) {
					t.Errorf("network %d: attachments %+v, want the host's eth0 with handle %d", i, st.Attachments, wantHandle)
				}
			}
			enabled := snap()
			_, err := Enable(Options{Netns: nets[0].Sandbox, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, StateFile: filepath.Join(t.TempDir(), "again.json")})
			if err == nil || !strings.Contains(err.Error(), "already carries a steering program") {
				t.Errorf("enabling network 0 twice: %v, want a refusal", err)
			}
			if s := snap(); !slices.Equal(s, enabled) {
				t.Errorf("the refused enable changed the kernel state:\n%v\nwant %v", s, enabled)
			}
			const n = 300
			for i, f := range flows {
				got := backlogPackets(t, func() { sendSeq(t, f.tx, f.rx, f.dst.String(), n, 1) })
				t.Logf("network %d: backlog packets per CPU %v", i, got)
				if got[0] < 2*n-10 {
					t.Errorf("network %d: CPU 0 backlog ran %v packets, want its S2 and S3 (%d)", i, got[0], 2*n)
				}
				// Only the flow's own instance knows it (each network's
				// remote also sends IPv6 chatter of its own).
				la, _ := f.tx.LocalAddr().(*net.UDPAddr)
				fh := FlowHash(la.AddrPort().Addr().Unmap(), f.dst.Addr(), la.AddrPort().Port(), f.dst.Port(), unix.IPPROTO_UDP)
				for j, s := range states {
					st, err := ReadStatus(s)
					if err != nil {
						t.Fatal(err)
					}
					var pkts uint64
					for _, fl := range st.Flows {
						if fl.FlowHash == fh && fl.Stage == "vxlan" {
							pkts += fl.Packets
						}
					}
					if j == i && pkts < n {
						t.Errorf("network %d's instance steered %d of its flow's %d packets", i, pkts, n)
					}
					if j != i && pkts != 0 {
						t.Errorf("network %d's instance steered %d packets of network %d's flow", j, pkts, i)
					}
				}
			}
			for _, i := range []int{1 - lastOut, lastOut} {
				if err := Disable(states[i]); err != nil {
					t.Fatal(err)
				}
			}
			if s := snap(); !slices.Equal(s, b0) {
				t.Errorf("kernel state differs after disable:\nbefore %v\nafter %v", b0, s)
			}
		})
	}
}

// TestSteerOnDockerOverlay: Docker's overlay layout (bridge and VXLAN
// device in a sandbox namespace, the device's UDP socket and underlay in
// the host's), enabled with the sandbox's path as an operator passes
// /var/run/docker/netns/1-<id>: discovery finds the underlay in the host
// namespace, the entry program goes there and the VXLAN device's program
// into the sandbox; both stages run where the rule says; disable leaves
// host, sandbox and container as they were.
func TestSteerOnDockerOverlay(t *testing.T) {
	testbedtest.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	remoteP, hostP, sandboxP, ctrP := testbedtest.DockerOverlay(t)
	remote, host, sandbox, ctr := filepath.Base(remoteP), filepath.Base(hostP), filepath.Base(sandboxP), filepath.Base(ctrP)
	d := onlyPath(t, sandboxP)
	if d.tunnel.Name != "vxlan0" || d.tunnel.Routed || d.tunnel.Underlay != "eth0" || d.underlayNS != host ||
		len(d.endpoint) != 1 || d.endpoint[0].dev != "eth0" || d.endpoint[0].netns != ctr {
		t.Fatalf("discovered tunnel %+v in %s, endpoints %+v", d.tunnel, d.underlayNS, d.endpoint)
	}
	before := func() []string { return []string{snapshotNS(t, host), snapshotNS(t, sandbox), snapshotNS(t, ctr)} }
	b0 := before()
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(testbedtest.DockerCtrIP.To4())), 7000)
	src := netip.AddrFrom4([4]byte(testbedtest.DockerRemoteIP.To4()))
	rx := listenIn(t, ctr, dst)
	for _, stage := range []string{"vxlan", "veth"} {
		t.Run(stage, func(t *testing.T) {
			id := uint32(d.vxIndex)
			if stage == "veth" {
				id = uint32(d.endpoint[0].ifindex)
			}
			steerStageOnCPU0(t, sandboxP, remote, src, dst, rx, stage, id)
			if b := before(); !slices.Equal(b, b0) {
				t.Errorf("kernel state differs after disable:\nbefore %v\nafter %v", b0, b)
			}
		})
	}
	// First-stage offload needs the underlay where the VXLAN device is.
	_, err := Enable(Options{Netns: sandboxP, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, FirstStage: FirstStageCpumap,
		StateFile: filepath.Join(t.TempDir(), "steer.json")})
	if err == nil || !strings.Contains(err.Error(), "same namespace") {
		t.Errorf("cpumap first stage with the underlay in another namespace: %v, want a refusal", err)
	}
	if b := before(); !slices.Equal(b, b0) {
		t.Errorf("kernel state differs after the refused enable:\nbefore %v\nafter %v", b0, b)
	}
}

// TestSteerHelperProcess is not a test: TestSteerInCallersNamespace runs
// the test binary inside a namespace (nsenter) with this function
// selected, to enable or disable steering there as an operator's rxlane
// does on a real host (no --netns: the caller's own namespace).
func TestSteerHelperProcess(t *testing.T) {
	op, state := os.Getenv("RXLANE_STEER_HELPER"), os.Getenv("RXLANE_STEER_STATE")
	if op == "" {
		return // run as a test: nothing to do
	}
	var err error
	switch op {
	case "enable":
		_, err = Enable(Options{CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1, StateFile: state})
	case "disable":
		err = Disable(state)
	default:
		err = fmt.Errorf("unknown op %q", op)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestSteerInCallersNamespace: with no namespace given, enable steers the
// caller's own namespace (Calico's layout here, entered with nsenter as a
// host's root namespace would be): the program on the VXLAN device and
// RPS on it and on the pod's device; disable restores both namespaces.
func TestSteerInCallersNamespace(t *testing.T) {
	testbedtest.RequireRoot(t)
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("skipping: nsenter (util-linux) not installed")
	}
	_, host, pod := buildRouted(t, routedLayouts[0], false)
	beforeH, beforeP := snapshotNS(t, host), snapshotNS(t, pod)
	state := filepath.Join(t.TempDir(), "steer.json")
	run := func(op string) error {
		cmd := exec.Command("nsenter", "--net=/run/netns/"+host, os.Args[0], "-test.run=^TestSteerHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RXLANE_STEER_HELPER="+op, "RXLANE_STEER_STATE="+state)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s in %s: %w\n%s", op, host, err, out)
		}
		return nil
	}
	t.Cleanup(func() {
		if _, err := os.Stat(state); err == nil {
			if err := run("disable"); err != nil {
				t.Error(err)
			}
		}
	})
	if err := run("enable"); err != nil {
		t.Fatal(err)
	}
	st, err := loadState(state)
	if err != nil || st == nil {
		t.Fatalf("state: %v %v", st, err)
	}
	if st.Netns != "" || len(st.Stages) != 2 || st.Stages[0].Device != "vxlan.calico" || st.Stages[1].Device != "eth0" || st.Stages[1].Netns != pod {
		t.Fatalf("state %+v", st)
	}
	var rps string
	if err := testbed.DoSysfsNamed(host, func() error {
		b, err := os.ReadFile("/sys/class/net/vxlan.calico/queues/rx-0/rps_cpus")
		rps = string(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if h := snapshotNS(t, host); h == beforeH || strings.Trim(rps, "0\n,") != "3" {
		t.Errorf("enable changed nothing in %s (vxlan.calico rps_cpus %q)", host, rps)
	}
	if err := run("disable"); err != nil {
		t.Fatal(err)
	}
	if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != beforeH || p != beforeP {
		t.Errorf("kernel state differs after disable:\nhost before %s\nafter %s\npod before %s\nafter %s", beforeH, h, beforeP, p)
	}
}

// TestSecondEnableRefused: a second steering instance on the same devices
// (as two Docker overlay networks sharing the host's underlay would be) is
// refused with the reason and changes nothing; the first keeps working and
// its disable restores the namespaces.
func TestSecondEnableRefused(t *testing.T) {
	testbedtest.RequireRoot(t)
	_, host, pod := buildRouted(t, routedLayouts[0], false)
	beforeH, beforeP := snapshotNS(t, host), snapshotNS(t, pod)
	o := Options{Netns: host, CPUs: []int{0, 1}, Threshold: 0.85, AvgThreshold: 0.85, Hysteresis: 0.1}
	first, second := o, o
	first.StateFile, second.StateFile = filepath.Join(t.TempDir(), "a.json"), filepath.Join(t.TempDir(), "b.json")
	t.Cleanup(func() { Disable(first.StateFile) })
	if _, err := Enable(first); err != nil {
		t.Fatal(err)
	}
	enabledH, enabledP := snapshotNS(t, host), snapshotNS(t, pod)
	_, err := Enable(second)
	if err == nil || !strings.Contains(err.Error(), "already carries a steering program") {
		t.Fatalf("second enable: %v, want a refusal naming the other instance", err)
	}
	if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != enabledH || p != enabledP {
		t.Errorf("the refused enable changed the kernel state:\nhost %s\nwant %s\npod %s\nwant %s", h, enabledH, p, enabledP)
	}
	if _, err := os.Stat(second.StateFile); !os.IsNotExist(err) {
		t.Errorf("the refused enable left its state file: %v", err)
	}
	if _, err := ReadStatus(first.StateFile); err != nil {
		t.Errorf("first instance after the refusal: %v", err)
	}
	if err := Disable(first.StateFile); err != nil {
		t.Fatal(err)
	}
	if h, p := snapshotNS(t, host), snapshotNS(t, pod); h != beforeH || p != beforeP {
		t.Errorf("kernel state differs after disable:\nhost before %s\nafter %s\npod before %s\nafter %s", beforeH, h, beforeP, p)
	}
}
