package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/rxlane/rxlane/internal/policy"
)

// Tunnel is a VXLAN device whose traffic the lane may take.
type Tunnel struct {
	Name    string `json:"name"`
	Ifindex int    `json:"ifindex"`
	VNI     uint32 `json:"vni"`
	Port    uint16 `json:"port"`
	// Routed is true when the VXLAN device is not on a bridge and its
	// traffic is routed to the endpoints (Flannel, Calico); otherwise the
	// endpoints are the bridge's veth ports (testbed, Docker-like).
	Routed bool             `json:"routed"`
	Bridge string           `json:"bridge,omitempty"`
	MAC    net.HardwareAddr `json:"mac"`
	// Underlay is the device the tunnel's packets arrive on, where the
	// lane attaches.
	Underlay string       `json:"underlay"`
	Peers    []netip.Addr `json:"peers"`
	// Family is that of the device's UDP socket, 4 or 6: 6 when its local
	// or remote address is IPv6, as the kernel decides (VXLAN_F_IPV6).
	// Two devices may share a port and VNI, one per family (Flannel's
	// and Calico's dual-stack nodes).
	Family int `json:"family"`
	// OuterCsum is true when this host's device puts UDP checksums on
	// the packets it sends (udpcsum; IPv6 unless udp6zerocsumtx): its
	// peers, configured alike, most likely do too.
	OuterCsum bool `json:"outer_csum"`
}

// Endpoint is a local container interface the lane may deliver to.
type Endpoint struct {
	VNI uint32 `json:"vni"`
	// MAC is the container's MAC: the key for bridged tunnels, the
	// written destination for routed ones.
	MAC net.HardwareAddr `json:"mac"`
	// IP is the key for routed tunnels (invalid for bridged ones).
	IP netip.Addr `json:"ip,omitzero"`
	// Addrs are a bridged endpoint's addresses as its own interface
	// has them (not used by the datapath: they tell which rules can
	// match it).
	Addrs []netip.Addr `json:"addrs,omitempty"`
	// Dev and Ifindex name the host side of the container's veth pair:
	// bpf_redirect_peer hands packets to its peer.
	Dev     string `json:"dev"`
	Ifindex int    `json:"ifindex"`
	MTU     int    `json:"mtu"`
	// SrcMAC is written as inner source for routed tunnels (the MAC of the
	// device the normal path routes out of).
	SrcMAC net.HardwareAddr `json:"src_mac,omitempty"`
	// Skip, when set, says why the lane must not serve this endpoint
	// (filtering the lane would bypass); --skip-netfilter overrides.
	Skip string `json:"skip,omitempty"`
}

// Topology is what discovery found and the lane's maps hold.
type Topology struct {
	LocalAddrs []netip.Addr `json:"local_addrs"`
	Tunnels    []Tunnel     `json:"tunnels"`
	Endpoints  []Endpoint   `json:"endpoints"`
	// SkipNetfilter is set by Enable and Sync when endpoints with a Skip reason
	// are served anyway (--skip-netfilter now or when the lane was enabled).
	SkipNetfilter bool `json:"skip_netfilter,omitempty"`
	// Advice is set by Enable and Sync: what sends the rules' traffic to
	// the normal path.
	Advice *Advice `json:"advice,omitempty"`
}

func addr16(a netip.Addr) [16]byte { return a.Unmap().As16() }

func mapped(a netip.Addr) [16]byte {
	if a.Is4() {
		return netip.AddrFrom16(a.As16()).As16()
	}
	return a.As16()
}

func mac6(m net.HardwareAddr) (out [6]byte) {
	copy(out[:], m)
	return out
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// syncHash makes a hash map hold exactly want: put everything, delete the
// rest.
func syncHash[K comparable, V any](m *ebpf.Map, want map[K]V) error {
	if m == nil {
		return nil // a map no attached program uses (see mapsOf)
	}
	var k K
	var v V
	var stale []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for k, v := range want {
		if err := m.Put(k, v); err != nil {
			return err
		}
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// writeTopology makes the datapath maps hold topo, with rule masks per VNI
// from t. Endpoints with a Skip reason are left out unless skip.
func writeTopology(o *lanesMaps, topo Topology, t policy.Tables, skip bool) error {
	locals := map[lpmKey]uint32{}
	for _, a := range topo.LocalAddrs {
		locals[lpmKey{Prefixlen: 128, Addr: mapped(a)}] = 1
	}
	vnis := map[uint32]vniConfig{}
	ports := map[uint16]uint32{}
	vteps := map[vtepKey]uint32{}
	tunnels := map[uint32]uint32{}
	routed := map[uint32]bool{}
	for _, tn := range topo.Tunnels {
		tunnels[uint32(tn.Ifindex)] = tn.VNI
		fwd := uint32(fwdBridge)
		if tn.Routed {
			fwd = fwdRouted
		}
		routed[tn.VNI] = tn.Routed
		vnis[tn.VNI] = vniConfig{RuleMask: t.VNIMask(tn.VNI), VxlanIfindex: uint32(tn.Ifindex), Fwd: fwd, DevMac: mac6(tn.MAC), Port: htons(tn.Port)}
		ports[tn.Port] = 1
		for _, p := range tn.Peers {
			vteps[vtepKey{Vni: tn.VNI, Addr: mapped(p)}] = 1
		}
	}
	eps := map[endpointKey]endpoint{}
	for _, e := range topo.Endpoints {
		if e.Skip != "" && !skip {
			continue
		}
		r, ok := routed[e.VNI]
		if !ok {
			continue
		}
		k := endpointKey{Vni: e.VNI, Kind: epMAC}
		if r {
			if !e.IP.IsValid() {
				continue
			}
			k.Kind = epIP
			k.Addr = mapped(e.IP)
		} else {
			copy(k.Addr[:], e.MAC)
		}
		eps[k] = endpoint{Ifindex: uint32(e.Ifindex), Mtu: uint32(e.MTU), Mac: mac6(e.MAC), SrcMac: mac6(e.SrcMAC)}
	}
	// Endpoints and peers first, tunnels last: a VNI is served only once
	// everything it needs is there.
	for _, s := range []struct {
		name string
		fn   func() error
	}{
		{"local addresses", func() error { return syncHash(o.LocalAddrs, locals) }},
		{"endpoints", func() error { return syncHash(o.Endpoints, eps) }},
		{"vtep peers", func() error { return syncHash(o.Vteps, vteps) }},
		{"vxlan ports", func() error { return syncHash(o.VxlanPorts, ports) }},
		{"tunnel devices", func() error { return syncHash(o.TunnelVnis, tunnels) }},
		{"vnis", func() error { return syncHash(o.Vnis, vnis) }},
	} {
		if err := s.fn(); err != nil {
			return fmt.Errorf("write %s: %w", s.name, err)
		}
	}
	return nil
}

// applyPolicy writes compiled rules: the policy maps and each VNI's mask.
func applyPolicy(o *lanesMaps, t policy.Tables) error {
	if err := policy.Apply(policy.Maps{Dst: o.DstMasks, Src: o.SrcMasks, Ports: o.PortMasks, Protos: o.ProtoMasks}, t); err != nil {
		return err
	}
	var vni uint32
	var cfg vniConfig
	want := map[uint32]vniConfig{}
	it := o.Vnis.Iterate()
	for it.Next(&vni, &cfg) {
		cfg.RuleMask = t.VNIMask(vni)
		want[vni] = cfg
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read vnis: %w", err)
	}
	for k, v := range want {
		if err := o.Vnis.Update(k, v, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("write vni %d mask: %w", k, err)
		}
	}
	return nil
}

// resetRule zeroes a rule's counters (a new rule reusing an ID starts at 0).
func resetRule(o *lanesMaps, id int) error {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	return o.RuleStats.Put(uint32(id), make([]ruleCounters, n))
}

// loadObjects loads the program and its maps into the kernel.
func loadObjects(trustOuterCsum bool) (*lanesObjects, error) {
	spec, err := loadLanes()
	if err != nil {
		return nil, fmt.Errorf("load lanes spec: %w", err)
	}
	if err := spec.Variables["trust_outer_csum"].Set(trustOuterCsum); err != nil {
		return nil, fmt.Errorf("set trust_outer_csum: %w", err)
	}
	var o lanesObjects
	if err := spec.LoadAndAssign(&o, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load lanes program: %+v", ve)
		}
		return nil, fmt.Errorf("load lanes program: %w", err)
	}
	return &o, nil
}
