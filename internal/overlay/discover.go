package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/rxlane/rxlane/internal/netns"
	"github.com/rxlane/rxlane/internal/nldump"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Discover reads the calling thread's network namespace and returns the
// tunnels, peers and endpoints the lane may serve. It assumes no device
// names; it recognises layouts by their shape:
//
//   - bridged: a VXLAN device enslaved to a Linux bridge whose other ports
//     are veths (the testbed; Docker's overlay inside its sandbox netns).
//     Endpoints are the MACs of the veth ports' other ends (known before a
//     container has sent anything and after its FDB entry aged out) and
//     the bridge FDB's MACs on veth ports.
//   - routed: a VXLAN device without a master (Flannel's flannel.1 routed
//     to cni0, Calico's vxlan.calico routed to /32s on cali* veths).
//     Endpoints are the pods behind link-scope routes: the addresses and
//     MAC of the other end of the route's veth, or of a veth port of the
//     route's bridge, read in the pod's namespace (so a pod nothing has
//     been sent to yet is served), and the neighbours behind those routes
//     (a pod whose namespace has no file where we look).
//
// Peers are the VXLAN device's unicast default remote and FDB
// destinations. The underlay device is the VXLAN device's link, or the
// route to its first peer.
func Discover() (Topology, error) {
	// A link, address or route that changed during one of the netlink
	// dumps (a pod being created beside a watcher's sync) interrupts it:
	// read the whole topology again, not a half-consistent one.
	return nldump.Retry(discover)
}

func discover() (Topology, error) {
	var t Topology
	links, err := netlink.LinkList()
	if err != nil {
		return t, fmt.Errorf("list links: %w", err)
	}
	byIndex := map[int]netlink.Link{}
	for _, l := range links {
		byIndex[l.Attrs().Index] = l
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return t, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			t.LocalAddrs = append(t.LocalAddrs, ip.Unmap())
		}
	}
	fdb, err := netlink.NeighList(0, unix.AF_BRIDGE)
	if err != nil {
		return t, fmt.Errorf("list fdb: %w", err)
	}
	for _, l := range links {
		vx, ok := l.(*netlink.Vxlan)
		if !ok || vx.FlowBased || vx.GBP || vx.VxlanId == 0 {
			continue
		}
		tn := Tunnel{Name: vx.Name, Ifindex: vx.Index, VNI: uint32(vx.VxlanId), Port: uint16(vx.Port), MAC: vx.HardwareAddr, Family: 4}
		if (vx.SrcAddr != nil && vx.SrcAddr.To4() == nil) || (vx.Group != nil && vx.Group.To4() == nil) {
			tn.Family = 6
		}
		tn.OuterCsum = tn.Family == 4 && vx.UDPCSum || tn.Family == 6 && !vx.UDP6ZeroCSumTx
		if m, ok := byIndex[vx.MasterIndex]; ok && m.Type() == "bridge" {
			tn.Bridge = m.Attrs().Name
		} else {
			tn.Routed = true
		}
		seen := map[netip.Addr]bool{}
		addPeer := func(ip net.IP) {
			a, ok := netip.AddrFromSlice(ip)
			if !ok || a.IsUnspecified() || a.IsMulticast() {
				return
			}
			a = a.Unmap()
			if !seen[a] {
				seen[a] = true
				tn.Peers = append(tn.Peers, a)
			}
		}
		addPeer(vx.Group)
		for _, n := range fdb {
			if n.LinkIndex == vx.Index && n.IP != nil {
				addPeer(n.IP)
			}
		}
		if u, ok := byIndex[vx.VtepDevIndex]; ok {
			tn.Underlay = u.Attrs().Name
		} else if len(tn.Peers) > 0 {
			tn.Underlay, _ = RouteDevice(tn.Peers[0])
		}
		t.Tunnels = append(t.Tunnels, tn)
	}
	brSkip := bridgeNetfilter()
	ps := newPods()
	fp := newForwardPath(t.LocalAddrs)
	for _, tn := range t.Tunnels {
		if tn.Routed {
			eps, err := routedEndpoints(tn, byIndex, fdb, ps, fp)
			if err != nil {
				return t, err
			}
			t.Endpoints = append(t.Endpoints, eps...)
			continue
		}
		br := byIndex[tn.Ifindex].Attrs().MasterIndex
		skip := brSkip
		if b, ok := byIndex[br].(*netlink.Bridge); ok && b.VlanFiltering != nil && *b.VlanFiltering {
			skip = join(skip, "bridge "+b.Name+" filters VLANs")
		}
		known := map[string]bool{}
		add := func(port netlink.Link, mac net.HardwareAddr, addrs []netip.Addr) {
			if len(mac) != 6 || mac[0]&1 == 1 || bytes.Equal(mac, port.Attrs().HardwareAddr) || known[mac.String()] {
				return // multicast, the port's own address, or seen
			}
			known[mac.String()] = true
			t.Endpoints = append(t.Endpoints, Endpoint{
				VNI: tn.VNI, MAC: mac, Addrs: addrs, Dev: port.Attrs().Name, Ifindex: port.Attrs().Index,
				MTU: port.Attrs().MTU, Skip: join(skip, egressFilter(port)),
			})
		}
		for _, l := range links {
			if l.Attrs().MasterIndex != br || l.Type() != "veth" {
				continue
			}
			// A port whose other end cannot be found (no namespace
			// file) is still served through its FDB entries below.
			if pod, err := ps.of(l); err == nil {
				add(l, pod.MAC, pod.Addrs)
			}
		}
		for _, n := range fdb {
			if port, ok := byIndex[n.LinkIndex]; ok && n.MasterIndex == br && port.Type() == "veth" {
				add(port, n.HardwareAddr, nil)
			}
		}
	}
	return t, nil
}

func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// bridgeNetfilter says whether br_netfilter would pass bridged frames
// through iptables/ip6tables/arptables, which the lane would skip.
func bridgeNetfilter() string {
	var on []string
	for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		b, err := os.ReadFile("/proc/sys/net/bridge/" + k)
		if err == nil && strings.TrimSpace(string(b)) == "1" {
			on = append(on, "net.bridge."+k+"=1")
		}
	}
	if len(on) == 0 {
		return ""
	}
	return "bridge netfilter is on (" + strings.Join(on, ", ") + "): the lane would skip iptables on bridged traffic"
}

// egressFilter says whether the host side of a veth has tc egress
// processing (a qdisc other than noqueue, or filters) that the lane would
// skip.
func egressFilter(l netlink.Link) string {
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return ""
	}
	for _, q := range qs {
		switch q.Type() {
		case "noqueue":
		case "clsact", "ingress":
			if fs, err := netlink.FilterList(l, netlink.HANDLE_MIN_EGRESS); err == nil && len(fs) > 0 {
				return "tc egress filters on " + l.Attrs().Name
			}
		default:
			if q.Attrs().Parent == netlink.HANDLE_ROOT {
				return "qdisc " + q.Type() + " on " + l.Attrs().Name
			}
		}
	}
	return ""
}

// RoutedSkip starts the Skip of a routed endpoint whose forward path
// discovery could not prove (forwardpath.go): the normal path forwards
// it, through netfilter (Calico's and Flannel's policy, kube-proxy's),
// reverse-path filtering and policy routing, which the lane does not
// run. The reasons follow.
const RoutedSkip = "routed endpoint"

// RouteDevice is the device the calling thread's namespace routes a to:
// for a VXLAN device without a fixed underlay, the device its peer's
// packets arrive on.
func RouteDevice(a netip.Addr) (string, error) {
	rs, err := netlink.RouteGet(a.AsSlice())
	if err != nil {
		return "", fmt.Errorf("route to %s: %w", a, err)
	}
	if len(rs) == 0 {
		return "", fmt.Errorf("no route to %s", a)
	}
	l, err := netlink.LinkByIndex(rs[0].LinkIndex)
	if err != nil {
		return "", fmt.Errorf("find the device routing to %s: %w", a, err)
	}
	return l.Attrs().Name, nil
}

// routedEndpoints finds, for a routed tunnel, the local pods behind
// link-scope routes on veths (Calico: a /32 or /128 per pod) or bridges
// (Flannel: the node's pod subnet on cni0). A pod is found first from its
// own side of the veth (its addresses inside the route's prefix and its
// MAC, read in its namespace), so a pod the host has never forwarded to is
// served at once; then from the neighbour table (a pod whose namespace has
// no file where we look, resolved to its bridge port through the FDB).
//
// Each endpoint's Skip is empty only when the node's forward path to it
// is proven not to filter or change what the lane delivers (fp).
func routedEndpoints(tn Tunnel, byIndex map[int]netlink.Link, fdb []netlink.Neigh, ps *pods, fp *forwardPath) ([]Endpoint, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var out []Endpoint
	seen := map[netip.Addr]bool{}
	add := func(dev, port netlink.Link, ip netip.Addr, mac net.HardwareAddr) {
		seen[ip] = true
		skip := fp.check(tn.Name, dev.Attrs().Name, dev.Attrs().Index, ip)
		if skip != "" {
			skip = RoutedSkip + ": " + skip
		}
		out = append(out, Endpoint{
			VNI: tn.VNI, IP: ip, MAC: mac, SrcMAC: dev.Attrs().HardwareAddr,
			Dev: port.Attrs().Name, Ifindex: port.Attrs().Index, MTU: port.Attrs().MTU,
			Skip: join(skip, egressFilter(port)),
		})
	}
	for _, r := range routes {
		dev, ok := byIndex[r.LinkIndex]
		if !ok || r.Dst == nil || r.Gw != nil || (dev.Type() != "veth" && dev.Type() != "bridge") {
			continue
		}
		// The underlay's own subnet (a veth underlay, as in a lab)
		// holds VTEP peers, not pods.
		if dev.Attrs().Name == tn.Underlay {
			continue
		}
		pfx, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		prefix := netip.PrefixFrom(pfx.Unmap(), ones)
		if prefix.Addr().IsLinkLocalUnicast() || prefix.Addr().IsMulticast() {
			continue // fe80::/64 on every veth, multicast: no pods there
		}
		ports := []netlink.Link{dev}
		if dev.Type() == "bridge" {
			ports = ports[:0]
			for _, l := range byIndex {
				if l.Attrs().MasterIndex == dev.Attrs().Index && l.Type() == "veth" {
					ports = append(ports, l)
				}
			}
			slices.SortFunc(ports, func(a, b netlink.Link) int { return a.Attrs().Index - b.Attrs().Index })
		}
		for _, port := range ports {
			pod, err := ps.of(port)
			if err != nil || len(pod.MAC) != 6 {
				continue // found below, from the neighbour table, if at all
			}
			for _, ip := range pod.Addrs {
				if prefix.Contains(ip) && !seen[ip] {
					add(dev, port, ip, pod.MAC)
				}
			}
		}
		neighs, err := netlink.NeighList(dev.Attrs().Index, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("list neighbours on %s: %w", dev.Attrs().Name, err)
		}
		for _, n := range neighs {
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok || len(n.HardwareAddr) != 6 || n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_PERMANENT|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_NOARP) == 0 {
				continue
			}
			ip = ip.Unmap()
			if !prefix.Contains(ip) || seen[ip] || ip.IsLinkLocalUnicast() {
				continue
			}
			port := dev
			if dev.Type() == "bridge" {
				port = nil
				for _, f := range fdb {
					if f.MasterIndex == dev.Attrs().Index && bytes.Equal(f.HardwareAddr, n.HardwareAddr) {
						if p, ok := byIndex[f.LinkIndex]; ok && p.Type() == "veth" {
							port = p
						}
					}
				}
				if port == nil {
					continue
				}
			}
			add(dev, port, ip, n.HardwareAddr)
		}
	}
	return out, nil
}

// ErrNoTunnel is returned when a namespace has no VXLAN device to serve.
var ErrNoTunnel = errors.New("no VXLAN device found (looked for vxlan links with a fixed VNI)")

// DiscoverIn discovers the namespace file nsPath ("" for the caller's)
// without changing anything.
func DiscoverIn(nsPath string) (topo Topology, err error) {
	err = netns.Do(nsPath, false, func() error {
		topo, err = Discover()
		return err
	})
	return topo, err
}
