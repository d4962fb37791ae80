package nodes

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The routed layouts' (Flannel's and Calico's) address plan. The node's
// pods are in PodSubnet4/PodSubnet6 (Flannel: on cni0, whose addresses
// are BridgeAddr4/BridgeAddr6; the first pod gets .2 and ::2), the
// remote node's in RemoteSubnet4/RemoteSubnet6, with the remote's inner
// source addresses .1 and ::1.
var (
	PodSubnet4    = netip.MustParsePrefix("10.7.0.0/24")
	PodSubnet6    = netip.MustParsePrefix("fd00:7::/64")
	BridgeAddr4   = netip.MustParseAddr("10.7.0.1")
	BridgeAddr6   = netip.MustParseAddr("fd00:7::1")
	RemoteSubnet4 = netip.MustParsePrefix("10.7.1.0/24")
	RemoteSubnet6 = netip.MustParsePrefix("fd00:7:1::/64")

	underNode4   = netip.MustParsePrefix("198.18.9.2/24")
	underRemote4 = netip.MustParsePrefix("198.18.9.1/24")
	underNode6   = netip.MustParsePrefix("fd00:18:9::2/64")
	underRemote6 = netip.MustParsePrefix("fd00:18:9::1/64")

	vtepNodeMAC    = net.HardwareAddr{0x66, 0x10, 0, 0, 0, 2}
	vtepRemoteMAC  = net.HardwareAddr{0x66, 0x10, 0, 0, 0, 1}
	vtepNodeMAC6   = net.HardwareAddr{0x66, 0x10, 0, 0, 6, 2}
	vtepRemoteMAC6 = net.HardwareAddr{0x66, 0x10, 0, 0, 6, 1}

	// CalicoHostMAC is the MAC Calico gives the host side of every
	// pod's veth; CalicoGateway4 and CalicoGateway6 are the pods'
	// gateways (169.254.1.1 on-link; IPv6: that MAC's link-local
	// address, which the host's cali device has).
	CalicoHostMAC  = net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}
	CalicoGateway4 = netip.MustParseAddr("169.254.1.1")
	CalicoGateway6 = netip.MustParseAddr("fe80::ecee:eeff:feee:eeee")
)

// routedSpec is what differs between Flannel and Calico.
type routedSpec struct {
	vxlan, vxlan6 string
	vni, port     int
	bridge        string
}

func (n *Node) spec() routedSpec {
	if n.Kind == Calico {
		return routedSpec{vxlan: "vxlan.calico", vxlan6: "vxlan-v6.calico", vni: 4096, port: 4789}
	}
	return routedSpec{vxlan: "flannel.1", vxlan6: "flannel-v6.1", vni: 1, port: 8472, bridge: "cni0"}
}

// subnetAddr is address i of subnet p.
func subnetAddr(p netip.Prefix, i int) netip.Addr {
	b := p.Addr().AsSlice()
	b[len(b)-2] += byte(i >> 8)
	b[len(b)-1] += byte(i)
	a, _ := netip.AddrFromSlice(b)
	return a
}

// buildRouted builds the wire, both hosts' VXLAN devices and routes,
// and Flannel's bridge.
func (n *Node) buildRouted() error {
	s := n.spec()
	dual := n.opts.DualStack
	n.Wire = Wire{NodeDev: "ens9", RemoteDev: "ens9", NodeAddrs: []netip.Prefix{underNode4}, RemoteAddrs: []netip.Prefix{underRemote4}}
	if dual {
		n.Wire.NodeAddrs = append(n.Wire.NodeAddrs, underNode6)
		n.Wire.RemoteAddrs = append(n.Wire.RemoteAddrs, underRemote6)
	}
	remote4, remote6 := subnetAddr(RemoteSubnet4, 1), subnetAddr(RemoteSubnet6, 1)
	t4 := Tunnel{Dev: s.vxlan, Netns: n.Netns, VNI: s.vni, Port: s.port, Family: 4, MAC: vtepNodeMAC,
		RemoteDev: s.vxlan, RemoteMAC: vtepRemoteMAC, RemoteInner: []netip.Addr{remote4, remote6}}
	n.Tunnels = []Tunnel{t4}
	if dual {
		n.Tunnels[0].RemoteInner = []netip.Addr{remote4}
		n.Tunnels = append(n.Tunnels, Tunnel{Dev: s.vxlan6, Netns: n.Netns, VNI: s.vni, Port: s.port, Family: 6, MAC: vtepNodeMAC6,
			RemoteDev: s.vxlan6, RemoteMAC: vtepRemoteMAC6, RemoteInner: []netip.Addr{remote6}})
	}
	n.Bridge = s.bridge
	n.nextPod[0] = 2
	// Both hosts alike: NIC, VTEPs (static FDB entries for the other's
	// VTEP, as flanneld and Felix install them) and routes to the other
	// node's pods through the other's VTEP.
	type side struct {
		ns                string
		under             []netip.Prefix
		peerUnder         []netip.Prefix
		mac, mac6         net.HardwareAddr
		peerMAC, peerMAC6 net.HardwareAddr
		ownSubnet         [2]netip.Prefix
		peerSubnet        [2]netip.Prefix
		inner             []netip.Addr // addresses on the VTEPs
	}
	sides := []side{
		{n.Netns, n.Wire.NodeAddrs, n.Wire.RemoteAddrs, vtepNodeMAC, vtepNodeMAC6, vtepRemoteMAC, vtepRemoteMAC6,
			[2]netip.Prefix{PodSubnet4, PodSubnet6}, [2]netip.Prefix{RemoteSubnet4, RemoteSubnet6}, []netip.Addr{PodSubnet4.Addr()}},
		{n.Remote, n.Wire.RemoteAddrs, n.Wire.NodeAddrs, vtepRemoteMAC, vtepRemoteMAC6, vtepNodeMAC, vtepNodeMAC6,
			[2]netip.Prefix{RemoteSubnet4, RemoteSubnet6}, [2]netip.Prefix{PodSubnet4, PodSubnet6}, []netip.Addr{RemoteSubnet4.Addr(), remote4, remote6}},
	}
	// The node's NIC, with its peer created in the remote's namespace.
	if err := in(n.Netns, func() error {
		return withNS(n.Remote, func(fd netlink.NsFd) error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n.Wire.NodeDev}, PeerName: n.Wire.RemoteDev, PeerNamespace: fd})
		})
	}); err != nil {
		return fmt.Errorf("add wire: %w", err)
	}
	for i, sd := range sides {
		err := in(sd.ns, func() error {
			if err := loUp(); err != nil {
				return err
			}
			if i == 0 {
				// As the bridge plugin (EnableForward) and Felix set them.
				for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
					if err := sysctl(k, "1"); err != nil {
						return err
					}
				}
			}
			u, err := link(n.Wire.NodeDev)
			if err != nil {
				return err
			}
			for _, a := range sd.under {
				if err := addAddr(u, a.Addr(), a.Bits()); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(u); err != nil {
				return err
			}
			// Every host has a default gateway on its NIC. Calico
			// relies on it: proxy ARP answers a pod's request for
			// 169.254.1.1 only for an address the host routes out of
			// another device, so without it no pod's reply leaves.
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: u.Attrs().Index, Gw: sd.peerUnder[0].Addr().AsSlice()}); err != nil {
				return fmt.Errorf("default route: %w", err)
			}
			vx, err := vtep(s.vxlan, sd.mac, s.vni, s.port, sd.under[0].Addr(), sd.peerUnder[0].Addr(), u, sd.peerMAC)
			if err != nil {
				return err
			}
			vx6 := vx
			gw6mac := sd.peerMAC
			if dual {
				if vx6, err = vtep(s.vxlan6, sd.mac6, s.vni, s.port, sd.under[1].Addr(), sd.peerUnder[1].Addr(), u, sd.peerMAC6); err != nil {
					return err
				}
				gw6mac = sd.peerMAC6
			}
			for _, a := range sd.inner {
				dev := vx
				if a.Is6() {
					dev = vx6
				}
				if err := addAddr(dev, a, a.BitLen()); err != nil {
					return err
				}
			}
			if err := viaOnlink(vx, sd.peerSubnet[0], sd.peerSubnet[0].Addr(), sd.peerMAC); err != nil {
				return err
			}
			if err := viaOnlink(vx6, sd.peerSubnet[1], sd.peerSubnet[1].Addr(), gw6mac); err != nil {
				return err
			}
			if i == 0 && s.bridge != "" {
				if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: s.bridge, MTU: 1450}}); err != nil {
					return fmt.Errorf("add %s: %w", s.bridge, err)
				}
				br, err := link(s.bridge)
				if err != nil {
					return err
				}
				if err := addAddr(br, BridgeAddr4, PodSubnet4.Bits()); err != nil {
					return err
				}
				if err := addAddr(br, BridgeAddr6, PodSubnet6.Bits()); err != nil {
					return err
				}
				return netlink.LinkSetUp(br)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// vtep adds a VXLAN device (no learning, as flanneld and Felix make it)
// on the underlay under, up, with a static FDB entry sending peerMAC to
// the peer VTEP.
func vtep(name string, mac net.HardwareAddr, vni, port int, local, peer netip.Addr, under netlink.Link, peerMAC net.HardwareAddr) (netlink.Link, error) {
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1450, HardwareAddr: mac}, VxlanId: vni,
		SrcAddr: local.AsSlice(), Port: port, VtepDevIndex: under.Attrs().Index}
	if err := netlink.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("add %s: %w", name, err)
	}
	l, err := link(name)
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, err
	}
	if err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: peer.AsSlice(), HardwareAddr: peerMAC}); err != nil {
		return nil, fmt.Errorf("fdb %s on %s: %w", peerMAC, name, err)
	}
	return l, nil
}

// newPodNetns creates a pod's namespace as the runtime does before
// calling the CNI plugin: cni-<uuid> in /run/netns, lo up.
func (n *Node) newPodNetns() (string, error) {
	p, err := n.newNetns(RunNetnsDir, cniNetnsName())
	if err != nil {
		return "", err
	}
	return p, in(p, loUp)
}

// nextAddrs allocates the next pod's addresses.
func (n *Node) nextAddrs() (v4, v6 netip.Addr, err error) {
	i := n.nextPod[0]
	if i > 254 {
		return v4, v6, fmt.Errorf("pod subnet %s is full", PodSubnet4)
	}
	n.nextPod[0]++
	return subnetAddr(PodSubnet4, i), subnetAddr(PodSubnet6, i), nil
}

// newPod allocates the next pod's addresses and makes its namespace, as
// the runtime does before calling the CNI plugin; the pod's device is
// eth0, hostDev its veth's host side.
func (n *Node) newPod(hostDev string) (Pod, error) {
	v4, v6, err := n.nextAddrs()
	if err != nil {
		return Pod{}, err
	}
	p, err := n.newPodNetns()
	if err != nil {
		return Pod{}, err
	}
	pod := Pod{Netns: p, Dev: "eth0", MAC: podMAC(v4), Addrs: []netip.Addr{v4, v6}, HostDev: hostDev, HostNetns: n.Netns}
	pod.Name = baseName(p)
	return pod, nil
}

// upWithAddrs sets a pod's device up with its IPv4 and IPv6 addresses
// (addrs, as in Pod.Addrs) of prefix lengths bits4 and bits6.
func upWithAddrs(e netlink.Link, addrs []netip.Addr, bits4, bits6 int) error {
	if err := netlink.LinkSetUp(e); err != nil {
		return err
	}
	if err := addAddr(e, addrs[0], bits4); err != nil {
		return err
	}
	return addAddr(e, addrs[1], bits6)
}

// addFlannelPod adds a pod as the CNI bridge plugin does for Flannel: a
// veth made from the pod's side (eth0, host side vethXXXXXXXX), the host
// side attached to cni0 and up, then the pod's addresses and its default
// routes via cni0's addresses.
func (n *Node) addFlannelPod() (Pod, error) {
	pod, err := n.newPod("veth" + randHex(4))
	if err != nil {
		return Pod{}, err
	}
	p := pod.Netns
	if err := in(p, func() error {
		return withNS(n.Netns, func(fd netlink.NsFd) error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pod.Dev, MTU: 1450, HardwareAddr: pod.MAC},
				PeerName: pod.HostDev, PeerNamespace: fd})
		})
	}); err != nil {
		return Pod{}, fmt.Errorf("add veth: %w", err)
	}
	if err := in(n.Netns, func() error {
		hv, err := link(pod.HostDev)
		if err != nil {
			return err
		}
		br, err := link(n.Bridge)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(hv, br); err != nil {
			return fmt.Errorf("attach %s to %s: %w", pod.HostDev, n.Bridge, err)
		}
		if err := netlink.LinkSetUp(hv); err != nil {
			return err
		}
		if !n.opts.StaticNeighbours {
			return nil
		}
		if err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: hv.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_MASTER, HardwareAddr: pod.MAC}); err != nil {
			return fmt.Errorf("fdb %s on %s: %w", pod.MAC, pod.HostDev, err)
		}
		for _, a := range pod.Addrs {
			if err := pinNeigh(br, a, pod.MAC); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return Pod{}, err
	}
	if err := in(p, func() error {
		e, err := link(pod.Dev)
		if err != nil {
			return err
		}
		if err := upWithAddrs(e, pod.Addrs, PodSubnet4.Bits(), PodSubnet6.Bits()); err != nil {
			return err
		}
		if err := defaultVia(e, BridgeAddr4); err != nil {
			return err
		}
		return defaultVia(e, BridgeAddr6)
	}); err != nil {
		return Pod{}, err
	}
	return pod, in(n.Netns, func() error { return waitLinkLocal(n.Bridge) })
}

// addCalicoPod adds a pod as Calico's CNI plugin does: a veth made in
// the pod's namespace (eth0; host side caliXXXXXXXXXXX with MAC
// ee:ee:ee:ee:ee:ee), the host side moved to the host, the pod's /32 and
// /128 addresses with its routes (169.254.1.1 on-link, default via it;
// IPv6 default via the host side's link-local address), then on the
// host the cali device's settings (proxy ARP, proxy NDP, forwarding),
// up, and the pod's scope-link routes on it.
func (n *Node) addCalicoPod() (Pod, error) {
	pod, err := n.newPod("cali" + randHex(6)[:11])
	if err != nil {
		return Pod{}, err
	}
	p := pod.Netns
	if err := in(p, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pod.Dev, MTU: 1450, HardwareAddr: pod.MAC},
			PeerName: pod.HostDev, PeerHardwareAddr: CalicoHostMAC}); err != nil {
			return fmt.Errorf("add veth: %w", err)
		}
		hv, err := link(pod.HostDev)
		if err != nil {
			return err
		}
		if err := withNS(n.Netns, func(fd netlink.NsFd) error { return netlink.LinkSetNsFd(hv, int(fd)) }); err != nil {
			return fmt.Errorf("move %s to the host: %w", pod.HostDev, err)
		}
		e, err := link(pod.Dev)
		if err != nil {
			return err
		}
		if err := upWithAddrs(e, pod.Addrs, 32, 128); err != nil {
			return err
		}
		if err := hostRoute(e, CalicoGateway4); err != nil {
			return err
		}
		if err := defaultVia(e, CalicoGateway4); err != nil {
			return err
		}
		return defaultVia(e, CalicoGateway6)
	}); err != nil {
		return Pod{}, err
	}
	if err := in(n.Netns, func() error {
		d := pod.HostDev
		for k, v := range map[string]string{
			"net/ipv4/conf/" + d + "/proxy_arp":    "1",
			"net/ipv4/neigh/" + d + "/proxy_delay": "0",
			"net/ipv4/conf/" + d + "/forwarding":   "1",
			"net/ipv6/conf/" + d + "/proxy_ndp":    "1",
			"net/ipv6/conf/" + d + "/forwarding":   "1",
			"net/ipv6/conf/" + d + "/accept_ra":    "0",
		} {
			if err := sysctl(k, v); err != nil {
				return err
			}
		}
		hv, err := link(d)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(hv); err != nil {
			return err
		}
		for _, a := range pod.Addrs {
			if err := hostRoute(hv, a); err != nil {
				return err
			}
			if n.opts.StaticNeighbours {
				if err := pinNeigh(hv, a, pod.MAC); err != nil {
					return err
				}
			}
		}
		return waitLinkLocal(d)
	}); err != nil {
		return Pod{}, err
	}
	return pod, nil
}

// delRoutedPod deletes a pod as the CNI's DEL and the runtime do: the
// pod's interface (its veth, the host's route and learnt neighbours go
// with it), then its namespace.
func (n *Node) delRoutedPod(p Pod) error {
	if err := in(p.Netns, func() error {
		e, err := netlink.LinkByName(p.Dev)
		if err != nil {
			if _, ok := err.(netlink.LinkNotFoundError); ok {
				return nil
			}
			return err
		}
		return netlink.LinkDel(e)
	}); err != nil {
		return err
	}
	if err := DeleteNetns(p.Netns); err != nil {
		return err
	}
	n.forget(p.Netns)
	return nil
}
