package lanes

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/rxlane/rxlane/internal/overlay"
	"github.com/rxlane/rxlane/internal/policy"
)

// Topology is what discovery found (package overlay), with what the lane
// made of it.
type Topology struct {
	overlay.Topology
	// SkipNetfilter is set by Enable and Sync when endpoints with a Skip
	// reason are served anyway (--skip-netfilter now or when the lane
	// was enabled).
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
func writeTopology(o *lanesMaps, topo overlay.Topology, t policy.Tables, skip bool) error {
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
	if err := writeRules(o, t); err != nil {
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
