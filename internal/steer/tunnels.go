package steer

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rxlane/rxlane/internal/overlay"
)

// endpoint is a container device whose stage (S3) steering chooses: by
// inner destination MAC behind a bridged tunnel, by inner destination
// address (IPv4 and IPv6) behind a routed one.
type endpoint struct {
	macs    [][6]byte
	ips     []netip.Addr
	netns   string
	dev     string
	ifindex int
}

// tunnelPath is one VXLAN device's receive path: the device, its
// underlay and the container devices behind it.
type tunnelPath struct {
	tunnel  overlay.Tunnel
	vxIndex int
	// underlayNS is the namespace of tunnel.Underlay: the host namespace
	// itself, or (Docker's overlay) the one the VXLAN device was created
	// in, which keeps its UDP socket.
	underlayNS string
	endpoint   []endpoint
}

// discover finds, in the host namespace, every VXLAN device with an
// underlay, and for each its underlay and the container devices behind it
// (no names assumed): the bridge's veth ports for a bridged tunnel (the
// testbed, Docker's overlay network when its underlay is in the same
// namespace), the veths the routes to the pods leave through for a routed
// one (Flannel's flannel.1 -> cni0, Calico's vxlan.calico -> /32 on
// cali*; their dual-stack nodes add flannel-v6.1 and vxlan-v6.calico on
// the same port and VNI over an IPv6 underlay). Docker's overlay driver
// keeps the bridge and the VXLAN device in a sandbox namespace but the
// device's UDP socket, and so its underlay, in the namespace that created
// it: the underlay is then looked up there (see underlayElsewhere).
// Bridged tunnels come first, then routed ones, each in the kernel's
// order.
func discover(hostNS string) ([]tunnelPath, error) {
	var paths []tunnelPath
	linkNsid := map[int]int{} // paths index -> IFLA_LINK_NETNSID (Docker)
	err := inNetnsSysfs(hostNS, func() error {
		topo, err := overlay.Discover()
		if err != nil {
			return err
		}
		for _, routed := range []bool{false, true} {
			for _, tn := range topo.Tunnels {
				if tn.Underlay != "" && tn.Routed == routed {
					paths = append(paths, tunnelPath{tunnel: tn, underlayNS: hostNS})
				}
			}
		}
		// Docker: bridged tunnels whose link is in another namespace.
		for _, tn := range topo.Tunnels {
			l, err := netlink.LinkByIndex(tn.Ifindex)
			if err == nil && tn.Underlay == "" && !tn.Routed && l.Attrs().NetNsID >= 0 && len(tn.Peers) > 0 {
				linkNsid[len(paths)] = l.Attrs().NetNsID
				paths = append(paths, tunnelPath{tunnel: tn})
			}
		}
		if len(paths) == 0 {
			where := hostNS
			if where == "" {
				where = "this namespace"
			}
			return fmt.Errorf("steer: no VXLAN device with an underlay in %s (bridged, routed to local veths, or Docker's sandbox)", where)
		}
		for i := range paths {
			p := &paths[i]
			p.vxIndex = p.tunnel.Ifindex
			if nsid, ok := linkNsid[i]; ok {
				if p.underlayNS, err = peerNetnsName(nsid); err != nil {
					return fmt.Errorf("steer: find the namespace of %s's UDP socket: %w", p.tunnel.Name, err)
				}
			}
			if p.endpoint, err = tunnelEndpoints(topo, p.tunnel); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range paths {
		p := &paths[i]
		if p.tunnel.Underlay == "" {
			if p.tunnel.Underlay, err = underlayElsewhere(p.underlayNS, p.tunnel); err != nil {
				return nil, err
			}
		}
		for j := range p.endpoint {
			e := &p.endpoint[j]
			if err := inNetnsSysfs(e.netns, func() error {
				l, err := netlink.LinkByIndex(e.ifindex)
				if err != nil {
					return fmt.Errorf("find container device %d in %s: %w", e.ifindex, e.netns, err)
				}
				e.dev = l.Attrs().Name
				return nil
			}); err != nil {
				return nil, err
			}
		}
	}
	return paths, nil
}

// tunnelEndpoints are the container devices behind tn, one per device with
// every key that leads to it (several MACs in a bridge port's FDB; a pod's
// IPv4 and IPv6 addresses). Runs in the host namespace.
func tunnelEndpoints(topo overlay.Topology, tn overlay.Tunnel) ([]endpoint, error) {
	var eps []endpoint
	byPort := map[int]int{} // host-side ifindex -> eps index
	for _, ep := range topo.Endpoints {
		if ep.VNI != tn.VNI || (tn.Routed && !ep.IP.IsValid()) || (!tn.Routed && ep.IP.IsValid()) {
			continue
		}
		l, err := netlink.LinkByIndex(ep.Ifindex)
		if err != nil {
			return nil, fmt.Errorf("find endpoint %s: %w", ep.Dev, err)
		}
		a := l.Attrs()
		if _, ok := l.(*netlink.Veth); !ok || a.NetNsID < 0 {
			continue
		}
		i, ok := byPort[a.Index]
		if !ok {
			name, err := peerNetnsName(a.NetNsID)
			if err != nil {
				return nil, err
			}
			i = len(eps)
			byPort[a.Index] = i
			eps = append(eps, endpoint{netns: name, ifindex: a.ParentIndex})
		}
		// (A dual-stack node's two routed tunnels list every pod
		// route each.)
		e := &eps[i]
		if tn.Routed && !slices.Contains(e.ips, ep.IP) {
			e.ips = append(e.ips, ep.IP)
		} else if !tn.Routed {
			var m [6]byte
			copy(m[:], ep.MAC)
			if !slices.Contains(e.macs, m) {
				e.macs = append(e.macs, m)
			}
		}
	}
	return eps, nil
}

// underlayElsewhere finds, in the namespace ns that holds the VXLAN
// device's UDP socket, the device its packets arrive on: the route to the
// tunnel's first peer.
func underlayElsewhere(ns string, tn overlay.Tunnel) (string, error) {
	var dev string
	err := inNetnsSysfs(ns, func() (err error) {
		if dev, err = overlay.RouteDevice(tn.Peers[0]); err != nil {
			return fmt.Errorf("steer: find %s's underlay (its peer's route) in %s: %w", tn.Name, ns, err)
		}
		return nil
	})
	return dev, err
}

// attachment is a device a steering tc program goes on, with its entry in
// steer_devs.
type attachment struct {
	netns, dev string
	cfg        steerDev
	wire       bool // the underlay: steer_entry, key | devKeyWire
}

// readOnlyEndpoints names the container devices behind paths whose
// rps_cpus cannot be written: runc mounts a container's /sys read-only,
// and every sysfs mounted in that network namespace (ours too) shares the
// superblock, so the veth stage's RPS cannot be set there. access(2)
// reports EROFS for root as for anyone, without writing.
func readOnlyEndpoints(paths []tunnelPath) []string {
	var ro []string
	for _, p := range paths {
		for _, e := range p.endpoint {
			name := e.netns + "/" + e.dev
			if slices.Contains(ro, name) {
				continue
			}
			err := inNetnsSysfs(e.netns, func() error {
				qs, _ := filepath.Glob(filepath.Join("/sys/class/net", e.dev, "queues/rx-*/rps_cpus"))
				for _, q := range qs {
					if err := unix.Access(q, unix.W_OK); err != nil {
						return err
					}
				}
				return nil
			})
			if errors.Is(err, unix.EROFS) {
				ro = append(ro, name)
			}
		}
	}
	return ro
}

// planTunnels writes the steering maps for every tunnel path (tunnels,
// endpoints), records the stages in st, and returns the devices the tc
// programs go on and the container devices (the guard's delivery hooks),
// each once: tunnels may share an underlay (a dual-stack node's two
// devices, when both families arrive on one device), and a pod behind both
// tunnels of a dual-stack node is one stage. Nothing in the kernel changes
// here.
func planTunnels(paths []tunnelPath, o Options, st *State, objs *steerObjects) ([]attachment, []endpoint, error) {
	want := func(s string) bool { return slices.Contains(o.Stages, s) }
	var atts []attachment
	var endpoints []endpoint
	type devRef struct {
		netns string
		dev   any // name (tc devices) or ifindex (endpoints)
	}
	seen := map[devRef]bool{}
	tunnels := map[tunnelKey]string{}
	// The entry at the underlay numbers packets for the guard and steers
	// S2; with --stages veth and a first stage it only numbers them (no
	// RPS on the VXLAN device: the written hash has no effect there),
	// where steer_xdp's mark is still readable.
	entry := want("vxlan") || o.FirstStage != ""
	for _, p := range paths {
		if entry && !seen[devRef{p.underlayNS, p.tunnel.Underlay}] {
			seen[devRef{p.underlayNS, p.tunnel.Underlay}] = true
			flags := uint32(devEntry)
			if !want("vxlan") {
				flags |= devOff
			}
			atts = append(atts, attachment{p.underlayNS, p.tunnel.Underlay, steerDev{Encap: 1, Flags: flags}, true})
		}
		if want("vxlan") {
			st.Stages = append(st.Stages, Stage{Name: "vxlan", Netns: o.Netns, Device: p.tunnel.Name, Ifindex: p.vxIndex, Via: p.tunnel.Underlay})
		}
		// Every container device gets the guard's delivery hook, steered
		// or not.
		for _, e := range p.endpoint {
			if !seen[devRef{e.netns, e.ifindex}] {
				seen[devRef{e.netns, e.ifindex}] = true
				endpoints = append(endpoints, e)
				if want("veth") {
					st.Stages = append(st.Stages, Stage{Name: "veth", Netns: e.netns, Device: e.dev, Ifindex: e.ifindex, Via: p.tunnel.Name})
				}
			}
		}
		if len(p.endpoint) == 0 {
			st.Warnings = append(st.Warnings, "no container endpoint found behind "+p.tunnel.Name+" (no veth port on its bridge, or no route with a resolved neighbour to a local veth): "+
				"the veth stage is not steered and the in-flight guard cannot see deliveries, so a flow's stage CPU changes only after the flow was idle 500 ms")
		}
		tv := steerDev{StageId: uint32(p.vxIndex)}
		if want("veth") && len(p.endpoint) > 0 {
			for _, e := range p.endpoint {
				for _, m := range e.macs {
					if err := objs.SteerEndpoints.Put(endpointKey{Mac: m}, uint32(e.ifindex)); err != nil {
						return nil, nil, fmt.Errorf("write steer endpoints: %w", err)
					}
				}
				for _, ip := range e.ips {
					if err := objs.SteerEpIp.Put(endpointIPKey{Addr: ip.As16()}, uint32(e.ifindex)); err != nil {
						return nil, nil, fmt.Errorf("write steer endpoints: %w", err)
					}
				}
			}
			// The VXLAN device's ingress finds the container device by
			// the inner destination: its MAC behind a bridge, its
			// address behind routing (there the inner MAC is the VXLAN
			// device's own). The entry checks that choice too before it
			// sends a packet direct (flagLocal).
			dv := steerDev{StageId: uint32(p.endpoint[0].ifindex), Flags: devByMAC}
			tv.Flags, tv.NextStageId = devChainMAC, dv.StageId
			if p.tunnel.Routed {
				dv.Flags, tv.Flags = devByIP, devChainIP
			}
			if !entry {
				dv.Flags |= devEntry
			}
			atts = append(atts, attachment{o.Netns, p.tunnel.Name, dv, false})
		}
		if entry {
			k := tunnelKey{Vni: p.tunnel.VNI, Port: p.tunnel.Port, Family: uint8(p.tunnel.Family)}
			if other, ok := tunnels[k]; ok {
				return nil, nil, fmt.Errorf("steer: %s and %s both take VNI %d on UDP port %d over IPv%d: their packets cannot be told apart at the underlay", other, p.tunnel.Name, k.Vni, k.Port, k.Family)
			}
			tunnels[k] = p.tunnel.Name
			if err := objs.SteerTunnels.Put(k, tv); err != nil {
				return nil, nil, fmt.Errorf("write steer tunnels: %w", err)
			}
		}
	}
	return atts, endpoints, nil
}
